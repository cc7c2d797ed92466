"""Linear-time versions of the two text filters whose library code is quadratic on hostile input, with the same
output: Jinja's `wordwrap` (textwrap copies the rest of a long word for every line it cuts from it) and
markupsafe's `striptags` (every removed comment or tag copies the whole rest of the string). Both count their
work against the render's budget as they go, so the deadline is checked inside the filter, not only after it."""

from __future__ import annotations

import html
import textwrap
from typing import Any

from ._jinja_budget import OBJ, Budget

_TW_SPACE = "\t\n\x0b\x0c\r "  # textwrap's whitespace: the chunk boundaries
_LINEBREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines splits on


def count_any(s: str, chars: str) -> int:
    return sum(s.count(c) for c in chars)


def _blank_rest(chunk: str, off: int, cache: list) -> bool:
    """chunk[off:].strip() == '' without copying the rest of a long chunk."""
    if off >= len(chunk):
        return True
    if not chunk[-1].isspace():
        return False
    if cache[0] is not chunk:
        cache[0], cache[1] = chunk, len(chunk.rstrip())
    return cache[1] <= off


def wrap_paragraph(text: str, width: int, break_long_words: bool, break_on_hyphens: bool, budget: Budget) -> list[str]:
    """textwrap.wrap(text, width, expand_tabs=False, replace_whitespace=False, ...) for one paragraph, with the
    rest of a long word kept as an offset into it instead of a fresh copy per line."""
    if width <= 0:
        raise ValueError(f"invalid width {width!r} (must be > 0)")
    chunks_max = 2 * count_any(text, _TW_SPACE) + 2 * (text.count("-") if break_on_hyphens else 0) + 1
    budget.reserve(OBJ * (chunks_max + 4 * (len(text) // width)), 0)  # the chunks; at least this many lines
    wrapper = textwrap.TextWrapper(
        width=width,
        expand_tabs=False,
        replace_whitespace=False,
        break_long_words=break_long_words,
        break_on_hyphens=break_on_hyphens,
    )
    chunks = wrapper._split(text)  # with these options textwrap's whitespace munging is the identity
    chunks.reverse()
    off = 0  # characters of chunks[-1] already placed on earlier lines
    rs_cache: list[Any] = [None, 0]
    lines: list[str] = []
    while chunks:
        budget.tick()
        cur: list[str] = []
        cur_len = 0
        if lines and _blank_rest(chunks[-1], off, rs_cache):
            del chunks[-1]
            off = 0
        while chunks:
            size = len(chunks[-1]) - off
            if cur_len + size > width:
                break
            piece = chunks.pop()
            cur.append(piece[off:] if off else piece)
            off = 0
            cur_len += size
        if chunks and len(chunks[-1]) - off > width:
            chunk = chunks[-1]
            space_left = width - cur_len
            if break_long_words:
                end = space_left
                if break_on_hyphens and len(chunk) - off > space_left:
                    hyphen = chunk.rfind("-", off, off + space_left) - off
                    if hyphen > 0 and chunk[off : off + hyphen].strip("-"):
                        end = hyphen + 1
                cur.append(chunk[off : off + end])
                off += end
            elif not cur:
                cur.append(chunks.pop()[off:])
                off = 0
            cur_len = sum(map(len, cur))
        if cur and cur[-1].strip() == "":
            cur_len -= len(cur[-1])
            del cur[-1]
        if cur:
            line = "".join(cur)
            budget.reserve(len(line))
            lines.append(line)
    return lines


def wordwrap(
    s: str, width: int, break_long_words: bool, wrapstring: str, break_on_hyphens: bool, budget: Budget
) -> str:
    """Jinja's do_wordwrap: each existing line is a paragraph, wrapped on its own, joined by `wrapstring`."""
    budget.reserve(len(s) + OBJ * (count_any(s, _LINEBREAKS) + 1), len(s))
    out: list[str] = []
    total = 0
    for para in s.splitlines():
        lines = wrap_paragraph(para, width, break_long_words, break_on_hyphens, budget)
        total += sum(map(len, lines)) + len(wrapstring) * (len(lines) + 1)
        budget.reserve(len(wrapstring) * (len(lines) + 1), total)  # the joins, and the result so far
        out.append(wrapstring.join(lines))
    return wrapstring.join(out)


def _strip_comments(v: str, budget: Budget) -> str:
    """markupsafe's comment loop: remove the first `<!--` ... `-->`, search again from the start. A removal can
    only create a new `<!--` across the seam, within the three characters before it, so `carry` holds those and
    everything before them is final."""
    out: list[str] = []
    carry = ""  # up to 3 characters between the final text and v[pos:]; they hold no complete "<!--"
    pos = 0
    while True:
        budget.tick()
        window = carry + v[pos : pos + 3]
        j = window.find("<!--")
        if 0 <= j < len(carry):  # an opening that straddles the seam
            head = window[j:] + v[pos + 3 : pos + 5]  # "-->" may start inside the straddling opening
            k = head.find("-->")
            if k != -1:
                end = pos + k + 3 - (len(carry) - j)
            else:
                e = v.find("-->", pos)
                if e == -1:
                    break
                end = e + 3
            carry, pos = carry[:j], end
            continue
        start = v.find("<!--", pos)
        if start == -1:
            break
        e = v.find("-->", start)
        if e == -1:
            break
        prefix = carry + v[pos:start]
        out.append(prefix[:-3])
        carry, pos = prefix[-3:], e + 3
    return "".join(out) + carry + v[pos:]


def _strip_tags(v: str, budget: Budget) -> str:
    """markupsafe's tag loop: the first `<` to the next `>` removed, searching again from the start. The text
    before a removed tag has no `<`, so no seam can create a new one: one pass."""
    out: list[str] = []
    pos = 0
    while True:
        budget.tick()
        start = v.find("<", pos)
        if start == -1:
            break
        end = v.find(">", start)
        if end == -1:
            break
        out.append(v[pos:start])
        pos = end + 1
    out.append(v[pos:])
    return "".join(out)


def striptags(value: str, budget: Budget) -> str:
    """Jinja's striptags: comments, then tags removed, whitespace collapsed, entities unescaped. A comment or tag
    left open keeps its text, as markupsafe's loop did up to 3.0.3 (3.0.4 scans once and keeps everything after an
    unclosed one); the two agree wherever every `<` is closed."""
    budget.reserve(3 * len(value) + OBJ * (count_any(value, " \t\n\r\x0b\x0c") + 1), len(value))
    v = _strip_tags(_strip_comments(value, budget), budget)
    return html.unescape(" ".join(v.split()))
