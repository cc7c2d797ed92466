"""The `pattern` subset: literals, `.`, classes, \\d \\w \\s (and negations), groups, `|`, `* + ? {n,m}`,
`^`/`$` at the ends. JSON Schema patterns search (unanchored), so a missing anchor becomes "any text".

Shorthands are ASCII ([0-9], [A-Za-z0-9_], blanks): a subset of Python's Unicode ones, so output matched
by the automaton always matches `re.search` too. Their negations (and negated classes that hold a
shorthand) are restricted to ASCII for the same reason. Lookarounds, backreferences, flags and anchors
inside the pattern are rejected.
"""

from __future__ import annotations

from .errors import PatternError
from .grammar import any_char, set_char
from .nfa import NFA, MAX_CODEPOINT, complement, intersect, normalize

MAX_PATTERN = 4096  # characters
MAX_GROUP_DEPTH = 64
MAX_REPEAT = 1000

_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [(0x09, 0x0D), (0x20, 0x20)]
_ASCII = [(0, 0x7F)]
_SHORTHANDS = {
    "d": (_DIGIT, False),
    "D": (_DIGIT, True),
    "w": (_WORD, False),
    "W": (_WORD, True),
    "s": (_SPACE, False),
    "S": (_SPACE, True),
}
_CONTROL_ESC = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0}
_ANY_BUT_NL = complement([(0x0A, 0x0A)])


def parse_pattern(pattern: str):
    """(syntax tree, anchored at start, anchored at end); PatternError for anything outside the subset."""
    if len(pattern) > MAX_PATTERN:
        raise PatternError(pattern, f"longer than {MAX_PATTERN} characters")
    return _Parser(pattern).parse()


def compile_pattern(nfa: NFA, s: int, pattern: str) -> int:
    """Extend the NFA at s with the JSON-string body (no quotes) of strings matching `pattern`."""
    ast, anchored_start, anchored_end = parse_pattern(pattern)
    if not anchored_start:
        s = nfa.star(s, lambda t: any_char(nfa, t))
    s = _build(nfa, s, ast)
    if not anchored_end:
        s = nfa.star(s, lambda t: any_char(nfa, t))
    return s


def _build(nfa: NFA, s: int, node) -> int:
    kind = node[0]
    if kind == "set":
        return set_char(nfa, s, node[1])
    if kind == "cat":
        for part in node[1]:
            s = _build(nfa, s, part)
        return s
    if kind == "alt":
        return nfa.alt(s, [lambda t, p=p: _build(nfa, t, p) for p in node[1]])
    if kind == "rep":
        return nfa.repeat(s, lambda t: _build(nfa, t, node[1]), node[2], node[3])
    return s  # "empty"


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0
        self.depth = 0

    def fail(self, why: str):
        raise PatternError(self.p, f"{why} (at offset {self.i})")

    def parse(self):
        start = self.p.startswith("^")
        if start:
            self.i = 1
        end_at = len(self.p)
        end = self.p.endswith("$") and not _escaped(self.p, len(self.p) - 1) and len(self.p) > self.i
        if end:
            end_at -= 1
        self.end_at = end_at
        node = self.alternation()
        if self.i != end_at:
            self.fail("unbalanced ')'")
        return node, start, end

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < self.end_at else None

    def alternation(self):
        alts = [self.concat()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.concat())
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def concat(self):
        parts = []
        while (c := self.peek()) is not None and c not in "|)":
            atom = self.atom()
            parts.append(self.quantified(atom))
        return ("cat", parts) if parts else ("empty",)

    def quantified(self, atom):
        c = self.peek()
        if c is None or c not in "*+?{":
            return atom
        if c == "{" and not _is_counted(self.p, self.i):
            return atom
        lo, hi = self.quantifier()
        if self.peek() == "?":  # lazy: same language
            self.i += 1
        if (c := self.peek()) is not None and c in "*+?" or (c == "{" and _is_counted(self.p, self.i)):
            self.fail("nested quantifier")
        return ("rep", atom, lo, hi)

    def quantifier(self) -> tuple[int, int | None]:
        c = self.p[self.i]
        self.i += 1
        if c == "*":
            return 0, None
        if c == "+":
            return 1, None
        if c == "?":
            return 0, 1
        close = self.p.index("}", self.i)
        body = self.p[self.i : close]
        self.i = close + 1
        lo_s, _, hi_s = body.partition(",")
        lo = int(lo_s) if lo_s else 0
        hi = lo if "," not in body else (int(hi_s) if hi_s else None)
        if max(lo, hi or 0) > MAX_REPEAT:
            self.fail(f"repeat count above {MAX_REPEAT}")
        if hi is not None and hi < lo:
            self.fail("repeat range max below min")
        return lo, hi

    def atom(self):
        c = self.p[self.i]
        if c in "*+?":
            self.fail("nothing to repeat")
        if c == "{" and _is_counted(self.p, self.i):
            self.fail("nothing to repeat")
        if c in "^$":
            self.fail("anchors are only supported at the start and end")
        self.i += 1
        if c == ".":
            return ("set", _ANY_BUT_NL)
        if c == "[":
            return ("set", self.char_class())
        if c == "(":
            return self.group()
        if c == "\\":
            ranges, negated = self.escape(in_class=False)
            return ("set", _negate_ascii(ranges) if negated else ranges)
        return ("set", [(ord(c), ord(c))])

    def group(self):
        if self.p.startswith("?:", self.i):
            self.i += 2
        elif self.p.startswith("?P<", self.i) or (
            self.p.startswith("?<", self.i) and self.p[self.i + 2 : self.i + 3] not in "=!"
        ):
            close = self.p.find(">", self.i)
            if close < 0:
                self.fail("unterminated group name")
            self.i = close + 1
        elif self.peek() == "?":
            self.fail("lookarounds, flags and other (?...) groups are not supported")
        self.depth += 1
        if self.depth > MAX_GROUP_DEPTH:
            self.fail(f"groups nested deeper than {MAX_GROUP_DEPTH}")
        node = self.alternation()
        if self.peek() != ")":
            self.fail("missing ')'")
        self.i += 1
        self.depth -= 1
        return node

    def escape(self, in_class: bool) -> tuple[list[tuple[int, int]], bool]:
        if self.i >= self.end_at:
            self.fail("trailing backslash")
        c = self.p[self.i]
        self.i += 1
        if c in _SHORTHANDS:
            ranges, negated = _SHORTHANDS[c]
            return ranges, negated
        if c in _CONTROL_ESC:
            return [(_CONTROL_ESC[c],) * 2], False
        if c == "u" or c == "x":
            n = 4 if c == "u" else 2
            digits = self.p[self.i : self.i + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self.fail(f"bad \\{c} escape")
            self.i += n
            return [(int(digits, 16),) * 2], False
        if c.isalnum():
            self.fail(f"escape \\{c} is not supported")
        return [(ord(c), ord(c))], False

    def char_class(self) -> list[tuple[int, int]]:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        ascii_only = False
        first = True
        while True:
            if self.i >= self.end_at:
                self.fail("unterminated character class")
            c = self.p[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            self.i += 1
            if c == "\\":
                r, neg = self.escape(in_class=True)
                if len(r) != 1 or r[0][0] != r[0][1] or neg:
                    ascii_only = ascii_only or neg or negated
                    ranges += _negate_ascii(r) if neg else r
                    continue
                lo = r[0][0]
            elif c == "[" and self.peek() == ":":
                self.fail("POSIX classes are not supported")
            else:
                lo = ord(c)
            hi = lo
            if self.peek() == "-" and self.i + 1 < self.end_at and self.p[self.i + 1] != "]":
                self.i += 1
                d = self.p[self.i]
                self.i += 1
                if d == "\\":
                    r, neg = self.escape(in_class=True)
                    if neg or len(r) != 1 or r[0][0] != r[0][1]:
                        self.fail("a class shorthand cannot end a range")
                    hi = r[0][0]
                else:
                    hi = ord(d)
                if hi < lo:
                    self.fail("bad character range")
            ranges.append((lo, hi))
        ranges = normalize(ranges)
        if negated:
            ranges = complement(ranges)
            if ascii_only:
                ranges = intersect(ranges, _ASCII)
        if not ranges:
            self.fail("empty character class")
        return ranges


def _negate_ascii(ranges):
    return intersect(complement(ranges), _ASCII)


def _escaped(p: str, i: int) -> bool:
    n = 0
    while i - 1 - n >= 0 and p[i - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


def _is_counted(p: str, i: int) -> bool:
    """Whether `{` at i starts a counted repeat (Python treats any other `{` as a literal)."""
    close = p.find("}", i)
    if close < 0:
        return False
    body = p[i + 1 : close]
    lo, sep, hi = body.partition(",")
    return bool(body) and (lo.isdigit() or (sep and lo == "")) and (hi == "" or hi.isdigit()) and (lo or hi)
