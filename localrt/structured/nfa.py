"""Byte-level NFA with epsilon edges, plus push/pop edges for the shared free-form JSON sub-automaton.

Fragments are built forward: a builder takes the state to start from, adds edges out of it and returns
the state where its text ends. Every new state counts against a budget, so a schema that would blow up
(huge enums, maxLength 100000, nested minItems) stops early with `SchemaTooComplex`.
"""

from __future__ import annotations

from .errors import SchemaTooComplex

NORMAL, PUSH, POP, RET = 0, 1, 2, 3  # RET: pop, then read the same byte again from the popped state
MAX_CODEPOINT = 0x10FFFF


class NFA:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.eps: list[list[int]] = []  # per state: epsilon targets
        self.edges: list[list[tuple[int, int, int, int, int]]] = []  # per state: (lo, hi, target, kind, ret)
        self.final = -1

    def new(self) -> int:
        if len(self.eps) >= self.budget:
            raise SchemaTooComplex(f"the schema needs more than {self.budget} automaton states")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def link(self, a: int, b: int) -> None:
        self.eps[a].append(b)

    def byte(self, a: int, lo: int, hi: int, b: int, kind: int = NORMAL, ret: int = -1) -> None:
        self.edges[a].append((lo, hi, b, kind, ret))

    def lit(self, s: int, data: bytes) -> int:
        for c in data:
            t = self.new()
            self.byte(s, c, c, t)
            s = t
        return s

    def alt(self, s: int, builders) -> int:
        end = self.new()
        for build in builders:
            self.link(build(s), end)
        return end

    def opt(self, s: int, build) -> int:
        end = build(s)
        self.link(s, end)
        return end

    def star(self, s: int, build) -> int:
        loop = self.new()
        self.link(s, loop)
        self.link(build(loop), loop)
        return loop

    def repeat(self, s: int, build, lo: int, hi: int | None) -> int:
        """build{lo,hi}; hi None = unbounded. Copies the fragment, so the budget bounds it."""
        for _ in range(lo):
            s = build(s)
        if hi is None:
            return self.star(s, build)
        end = self.new()
        self.link(s, end)
        for _ in range(hi - lo):
            s = build(s)
            self.link(s, end)
        return end

    def charset(self, s: int, ranges: list[tuple[int, int]]) -> int:
        """One UTF-8 encoded character from codepoint ranges (surrogates never)."""
        end = self.new()
        for seq in utf8_sequences(ranges):
            cur = s
            for i, (lo, hi) in enumerate(seq):
                nxt = end if i == len(seq) - 1 else self.new()
                self.byte(cur, lo, hi, nxt)
                cur = nxt
        return end


# -- codepoint ranges -> UTF-8 byte-range sequences ------------------------------------------------


def normalize(ranges) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def complement(ranges) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for lo, hi in normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return out


def intersect(a, b) -> list[tuple[int, int]]:
    out = []
    for lo1, hi1 in normalize(a):
        for lo2, hi2 in normalize(b):
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return normalize(out)


def utf8_sequences(ranges) -> list[list[tuple[int, int]]]:
    out: list[list[tuple[int, int]]] = []
    for lo, hi in normalize(ranges):
        _split(lo, hi, out)
    return out


def _split(lo: int, hi: int, out: list) -> None:
    if lo > hi:
        return
    if lo <= 0xDFFF and hi >= 0xD800:  # surrogates are not encodable
        _split(lo, 0xD7FF, out)
        _split(0xE000, hi, out)
        return
    for bound in (0x7F, 0x7FF, 0xFFFF):  # one encoded length per range
        if lo <= bound < hi:
            _split(lo, bound, out)
            _split(bound + 1, hi, out)
            return
    if hi <= 0x7F:
        out.append([(lo, hi)])
        return
    n = len(chr(lo).encode("utf-8"))
    for i in range(1, n):  # align so that every continuation byte spans a full or an edge range
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                _split(lo, lo | m, out)
                _split((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _split(lo, (hi & ~m) - 1, out)
                _split(hi & ~m, hi, out)
                return
    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    out.append(list(zip(a, b)))
