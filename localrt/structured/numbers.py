"""Bounded numbers: decimal integers in [lo, hi] as digit-range blocks, and the bounded `number` subset.

A range of non-negative integers splits into blocks whose members share a length and whose digits each
run over one range (e.g. [7, 123] -> 7-9 | 10-99 | 100-119 | 120-123), each a chain of byte ranges.
"""

from __future__ import annotations

import math

from .errors import SchemaError
from .grammar import FRAC_DIGITS, INT_DIGITS
from .nfa import NFA

LIMIT = 10**INT_DIGITS - 1  # largest magnitude generated


def int_range(nfa: NFA, s: int, lo: int, hi: int) -> int:
    """Integers lo..hi (clipped to +-LIMIT by the caller) without leading zeros; "-0" never."""
    end = nfa.new()
    if hi >= 0:
        _non_negative(nfa, s, max(lo, 0), hi, end)
    if lo < 0:
        minus = nfa.lit(s, b"-")
        _non_negative(nfa, minus, max(-hi, 1), -lo, end)
    return end


def _non_negative(nfa: NFA, s: int, lo: int, hi: int, end: int) -> None:
    start = lo
    for stop in _block_ends(lo, hi):
        cur = s
        a, b = str(start), str(stop)
        for k, (da, db) in enumerate(zip(a, b)):
            nxt = end if k == len(a) - 1 else nfa.new()
            nfa.byte(cur, ord(da), ord(db), nxt)
            cur = nxt
        start = stop + 1


def _block_ends(lo: int, hi: int) -> list[int]:
    """Ends of the blocks that tile [lo, hi]: first grow trailing 9s from lo, then shrink toward hi."""
    ends = {hi}
    n = 1
    while True:
        stop = int(str(lo)[:-n] + "9" * n) if n < len(str(lo)) else 10**n - 1
        if not lo <= stop < hi:
            break
        ends.add(stop)
        n += 1
    n = 1
    while True:
        stop = (hi + 1) - (hi + 1) % 10**n - 1
        if not lo < stop <= hi:
            break
        ends.add(stop)
        n += 1
    return sorted(ends)


def bounds(schema: dict, where: str) -> tuple[float, float]:
    """(lower, upper) from minimum/maximum/exclusive*; strict bounds nudged to the next representable
    side by the callers (integers: +-1; decimals: open interval handled by the integer parts)."""
    lo, hi = -math.inf, math.inf
    if "minimum" in schema:
        lo = float(schema["minimum"])
    if "maximum" in schema:
        hi = float(schema["maximum"])
    if "exclusiveMinimum" in schema:
        lo = max(lo, math.nextafter(float(schema["exclusiveMinimum"]), math.inf))
    if "exclusiveMaximum" in schema:
        hi = min(hi, math.nextafter(float(schema["exclusiveMaximum"]), -math.inf))
    if lo > hi:
        raise SchemaError(f"minimum above maximum at {where}")
    return lo, hi


def integer_bounds(schema: dict, where: str) -> tuple[int, int]:
    lo, hi = bounds(schema, where)
    ilo = -LIMIT if lo == -math.inf else max(math.ceil(lo), -LIMIT)
    ihi = LIMIT if hi == math.inf else min(math.floor(hi), LIMIT)
    if ilo > ihi:
        raise SchemaError(f"no integer of at most {INT_DIGITS} digits lies within the bounds at {where}")
    return ilo, ihi


def bounded_number(nfa: NFA, s: int, schema: dict, where: str) -> int:
    """Integers within the bounds, plus decimals m.f with m + 1 <= upper bound and m >= max(lower, 0): a
    subset of the values in range (no exponents, no negative fractions)."""
    lo, hi = integer_bounds(schema, where)
    end = int_range(nfa, s, lo, hi)
    m_lo, m_hi = max(lo, 0), hi - 1
    if m_lo <= m_hi:
        q = nfa.lit(int_range(nfa, s, m_lo, m_hi), b".")
        digit = lambda t: _digit(nfa, t)  # noqa: E731
        nfa.link(nfa.repeat(q, digit, 1, FRAC_DIGITS), end)
    return end


def _digit(nfa: NFA, s: int) -> int:
    t = nfa.new()
    nfa.byte(s, 0x30, 0x39, t)
    return t
