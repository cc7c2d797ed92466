"""SentencePiece-style tokenization as llama.cpp's `llm_tokenizer_spm_session` does it.

Spaces become U+2581, the text is split into characters, and adjacent symbols are merged best-score-first
(ties: leftmost) whenever their concatenation is a vocabulary token. Final symbols that are not tokens fall
back to `<0xHH>` byte tokens (or the 1-byte token itself).

Speed: the merge never crosses a boundary between characters `a`,`b` when no vocabulary token contains "ab";
merges on either side of such a boundary are independent, so the text is cut there into words and each word
is merged (and cached) on its own. The cut used is "before a U+2581 that follows a character c" whenever no
token contains c + U+2581, which holds for nearly every c in real SPM vocabularies.
"""

from __future__ import annotations

import heapq
import re

import regex

from ...errors import InvalidRequest
from .vocab import Vocab
from .wordcache import WordCache

SPACE = "\u2581"


class SpmEncoder:
    def __init__(self, vocab: Vocab):
        self._get = vocab.token_to_id.get
        self._scores = vocab.scores
        self._byte_ids = _byte_tokens(vocab)
        self._cache = WordCache(self._merge)
        self._word_re = _word_splitter(vocab.tokens)

    def encode(self, text: str, out: list[int], limit: int | None = None) -> None:
        """Tokenize one raw-text fragment (already prefixed and space-escaped) into `out`; with `limit`, stop once
        `out` holds more than limit ids."""
        self._cache.encode((m.group() for m in self._word_re.finditer(text)), out, limit)

    def _merge(self, word: str) -> tuple[int, ...]:
        get, scores = self._get, self._scores
        syms = list(word)  # (n,) symbol texts; "" once merged into its left neighbour
        n = len(syms)
        nxt = list(range(1, n + 1))  # (n,) index of the next live symbol, n-1 -> n meaning none
        prev = list(range(-1, n - 1))  # (n,) index of the previous live symbol, -1 meaning none
        heap = []  # (-score, left, right, merged length)
        for i in range(n - 1):
            merged = syms[i] + syms[i + 1]
            tid = get(merged)
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, len(merged)))
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            lt, rt = syms[left], syms[right]
            if not lt or not rt or len(lt) + len(rt) != size:
                continue  # stale: one side has merged since this pair was pushed
            syms[left] = lt = lt + rt
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after < n:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                merged = syms[before] + lt
                tid = get(merged)
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], before, left, len(merged)))
            if after < n:
                merged = lt + syms[after]
                tid = get(merged)
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], left, after, len(merged)))
        return self._emit(syms)

    def _emit(self, syms: list[str]) -> tuple[int, ...]:
        ids: list[int] = []
        for sym in syms:
            if not sym:
                continue
            tid = self._get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            # Only a single unmerged character can miss the vocabulary: merges always form tokens.
            for b in sym.encode("utf-8"):
                tid = self._byte_ids[b]
                if tid is None:
                    raise InvalidRequest(
                        f"the vocabulary has no byte-fallback token for byte 0x{b:02X} (character {sym!r})"
                    )
                ids.append(tid)
        return tuple(ids)


def _byte_tokens(vocab: Vocab) -> list[int | None]:
    """byte -> `<0xHH>` token id, else the token whose text is that single byte, else None."""
    get = vocab.token_to_id.get
    out: list[int | None] = []
    for b in range(256):
        tid = get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = get(chr(b))  # a byte >= 0x80 alone is not valid UTF-8, so no token text can equal it
        out.append(tid)
    return out


def _word_splitter(tokens) -> regex.Pattern:
    """A regex whose matches are the independent words of a space-escaped fragment (tokens: a list or StringArray)."""
    # NUL joins a StringArray in one pass; the noncharacter U+FFFF if a token holds a NUL
    for sep in ("\0", "\uffff"):
        joined = tokens.join(sep) if not isinstance(tokens, list) else sep.join(tokens)
        if joined.count(sep) == len(tokens) - 1:
            break
    else:
        return regex.compile(".+", regex.DOTALL)  # cannot tell the tokens apart: one word, always correct
    # Characters c such that some token contains c + U+2581: no cut may go between them.
    glued = sorted({m[0] for m in re.findall(f"[^{SPACE}{sep}]{SPACE}", joined)})
    if not glued:
        return regex.compile(f"{SPACE}*[^{SPACE}]*|{SPACE}+", regex.V0)
    cls = regex.escape("".join(glued), special_only=False)
    # A word: leading U+2581 run, then characters; a glued character takes the U+2581 run after it along.
    body = f"(?:[{cls}]{SPACE}+|[^{SPACE}])*"
    return regex.compile(f"{SPACE}*{body}", regex.V0)
