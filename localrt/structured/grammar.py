"""JSON building blocks on the byte NFA: whitespace, string characters, numbers, literals and the shared
free-form value automaton (objects/arrays nest through push/pop edges, so any depth costs no states).

Whitespace follows llama.cpp's schema grammar: nothing, one space, or a newline plus up to 20 spaces or
tabs; bounded so that a model cannot loop on blanks.
"""

from __future__ import annotations

from .nfa import NFA, POP, PUSH, RET, complement, normalize

WS_INDENT = 20
INT_DIGITS = 16  # digits after a leading 1-9, llama.cpp's bound
FRAC_DIGITS = 16
EXP_DIGITS = 3

# Characters a JSON string holds unescaped: anything but '"', '\\' and C0 controls.
RAW_CHARS = complement([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
_SHORT_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}
_HEX = [(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)]


def ws(nfa: NFA, s: int) -> int:
    """Blanks before a structural character: the indentation after a newline is one shared sub-automaton
    entered by a push and left by a return that reads the next byte again, so each occurrence costs two
    states instead of WS_INDENT + 2."""
    end = nfa.new()
    nfa.link(s, end)
    nfa.byte(s, 0x20, 0x20, end)
    nfa.byte(s, 0x0A, 0x0A, _shared_indent(nfa), PUSH, end)
    return end


def _shared_indent(nfa: NFA) -> int:
    start = getattr(nfa, "shared_indent", None)
    if start is None:
        start = nfa.shared_indent = nfa.new()
        cur = start
        for k in range(WS_INDENT + 1):
            # Any byte but an indentation byte ends the blanks: return and let the caller read it.
            nfa.byte(cur, 0x00, 0x08, -1, RET)
            nfa.byte(cur, 0x0A, 0x1F, -1, RET)
            nfa.byte(cur, 0x21, 0xFF, -1, RET)
            if k < WS_INDENT:
                nxt = nfa.new()
                nfa.byte(cur, 0x20, 0x20, nxt)
                nfa.byte(cur, 0x09, 0x09, nxt)
                cur = nxt
    return start


def final_ws(nfa: NFA, s: int) -> int:
    """Blanks at the end of the document: no push, so the document is complete without a return."""
    end = nfa.new()
    nfa.link(s, end)
    nfa.byte(s, 0x20, 0x20, end)
    nl = nfa.new()
    nfa.byte(s, 0x0A, 0x0A, nl)
    nfa.link(nl, end)
    cur = nl
    for _ in range(WS_INDENT):
        nxt = nfa.new()
        nfa.byte(cur, 0x20, 0x20, nxt)
        nfa.byte(cur, 0x09, 0x09, nxt)
        nfa.link(nxt, end)
        cur = nxt
    return end


def any_char(nfa: NFA, s: int) -> int:
    """One JSON string character: raw, a short escape, or \\uXXXX outside the surrogate block (a surrogate
    pair would count as one character after decoding, which would break minLength counting)."""
    end = nfa.charset(s, RAW_CHARS)
    bs = nfa.new()
    nfa.byte(s, 0x5C, 0x5C, bs)
    for c in b'"\\/bfnrt':
        nfa.byte(bs, c, c, end)
    u = nfa.new()
    nfa.byte(bs, 0x75, 0x75, u)
    first_ok = nfa.new()  # first hex digit not d/D: any three more
    for lo, hi in [(0x30, 0x39), (0x41, 0x43), (0x45, 0x46), (0x61, 0x63), (0x65, 0x66)]:
        nfa.byte(u, lo, hi, first_ok)
    d = nfa.new()  # d/D must be followed by 0-7 (D800-DFFF excluded)
    nfa.byte(u, 0x44, 0x44, d)
    nfa.byte(u, 0x64, 0x64, d)
    two = nfa.new()
    _hex(nfa, first_ok, two)
    nfa.byte(d, 0x30, 0x37, two)
    three = nfa.new()
    _hex(nfa, two, three)
    _hex(nfa, three, end)
    return end


def _hex(nfa: NFA, a: int, b: int) -> None:
    for lo, hi in _HEX:
        nfa.byte(a, lo, hi, b)


def set_char(nfa: NFA, s: int, ranges: list[tuple[int, int]]) -> int:
    """One character from a set, JSON-encoded: raw where allowed, else its escape."""
    ranges = normalize(ranges)
    raw = [(max(lo, a), min(hi, b)) for lo, hi in ranges for a, b in RAW_CHARS if max(lo, a) <= min(hi, b)]
    end = nfa.charset(s, raw) if raw else nfa.new()
    for lo, hi in ranges:
        for c in range(lo, min(hi, 0x5C) + 1):
            if c in _SHORT_ESCAPES:
                nfa.link(nfa.lit(s, _SHORT_ESCAPES[c]), end)
            elif c < 0x20:
                nfa.link(nfa.lit(s, b"\\u%04x" % c), end)
    return end


def string(nfa: NFA, s: int, min_len: int = 0, max_len: int | None = None) -> int:
    q = nfa.lit(s, b'"')
    if max_len is None and min_len == 0:
        q = nfa.star(q, lambda t: any_char(nfa, t))
    else:  # counted: each position enters the shared multi-byte automaton instead of copying it
        chars = _shared_chars(nfa)
        q = nfa.repeat(q, chars.char, min_len, max_len)
    return nfa.lit(q, b'"')


def _shared_chars(nfa: NFA) -> "SharedChars":
    shared = getattr(nfa, "shared_chars", None)
    if shared is None:
        shared = nfa.shared_chars = SharedChars(nfa)
    return shared


class SharedChars:
    """The rest of a multi-byte character or escape, built once per NFA: a counted string position pushes
    its successor on the lead byte (or backslash) and the last byte pops it. A position then costs one
    automaton state instead of a copy of the UTF-8 and escape states (maxLength 50 -> 50 states, not 1300)."""

    def __init__(self, nfa: NFA) -> None:
        self.nfa = nfa
        new = nfa.new
        self.cont = [-1, new(), new(), new()]  # cont[k]: k continuation bytes still to read
        nfa.byte(self.cont[1], 0x80, 0xBF, -1, POP)
        nfa.byte(self.cont[2], 0x80, 0xBF, self.cont[1])
        nfa.byte(self.cont[3], 0x80, 0xBF, self.cont[2])
        self.e0, self.ed, self.f0, self.f4 = new(), new(), new(), new()  # leads with a narrowed second byte
        nfa.byte(self.e0, 0xA0, 0xBF, self.cont[1])
        nfa.byte(self.ed, 0x80, 0x9F, self.cont[1])  # no surrogates
        nfa.byte(self.f0, 0x90, 0xBF, self.cont[2])
        nfa.byte(self.f4, 0x80, 0x8F, self.cont[2])
        self.esc = new()
        for c in b'"\\/bfnrt':
            nfa.byte(self.esc, c, c, -1, POP)
        u, d, two, three = new(), new(), new(), new()
        nfa.byte(self.esc, 0x75, 0x75, u)
        for lo, hi in [(0x30, 0x39), (0x41, 0x43), (0x45, 0x46), (0x61, 0x63), (0x65, 0x66)]:
            nfa.byte(u, lo, hi, two)
        nfa.byte(u, 0x44, 0x44, d)
        nfa.byte(u, 0x64, 0x64, d)
        nfa.byte(d, 0x30, 0x37, three)  # \uD800-\uDFFF excluded
        _hex(nfa, two, three)
        last = new()
        _hex(nfa, three, last)
        for lo, hi in _HEX:
            nfa.byte(last, lo, hi, -1, POP)

    def char(self, s: int) -> int:
        """One JSON string character from s; returns the state after it."""
        nfa = self.nfa
        end = nfa.new()
        for lo, hi in ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7F)):
            nfa.byte(s, lo, hi, end)
        for lo, hi, target in (
            (0xC2, 0xDF, self.cont[1]),
            (0xE0, 0xE0, self.e0),
            (0xE1, 0xEC, self.cont[2]),
            (0xED, 0xED, self.ed),
            (0xEE, 0xEF, self.cont[2]),
            (0xF0, 0xF0, self.f0),
            (0xF1, 0xF3, self.cont[3]),
            (0xF4, 0xF4, self.f4),
            (0x5C, 0x5C, self.esc),
        ):
            nfa.byte(s, lo, hi, target, PUSH, end)
        return end


def integer(nfa: NFA, s: int) -> int:
    q = nfa.opt(s, lambda t: nfa.lit(t, b"-"))
    end = nfa.new()
    nfa.byte(q, 0x30, 0x30, end)
    lead = nfa.new()
    nfa.byte(q, 0x31, 0x39, lead)
    nfa.link(nfa.repeat(lead, lambda t: _digit(nfa, t), 0, INT_DIGITS - 1), end)
    return end


def number(nfa: NFA, s: int) -> int:
    q = integer(nfa, s)

    def frac(t: int) -> int:
        return nfa.repeat(nfa.lit(t, b"."), lambda u: _digit(nfa, u), 1, FRAC_DIGITS)

    def exp(t: int) -> int:
        e = nfa.new()
        nfa.byte(t, 0x45, 0x45, e)
        nfa.byte(t, 0x65, 0x65, e)
        sign = nfa.new()
        nfa.link(e, sign)
        nfa.byte(e, 0x2B, 0x2B, sign)
        nfa.byte(e, 0x2D, 0x2D, sign)
        return nfa.repeat(sign, lambda u: _digit(nfa, u), 1, EXP_DIGITS)

    q = nfa.opt(q, frac)
    return nfa.opt(q, exp)


def _digit(nfa: NFA, s: int) -> int:
    t = nfa.new()
    nfa.byte(s, 0x30, 0x39, t)
    return t


def scalar(nfa: NFA, s: int) -> int:
    return nfa.alt(
        s,
        [
            lambda t: string(nfa, t),
            lambda t: number(nfa, t),
            lambda t: nfa.lit(t, b"true"),
            lambda t: nfa.lit(t, b"false"),
            lambda t: nfa.lit(t, b"null"),
        ],
    )


class FreeJSON:
    """The shared free-form value automaton, built once per NFA on first use."""

    def __init__(self, nfa: NFA) -> None:
        self.nfa = nfa
        self.obj_open = nfa.new()  # just after '{'
        self.arr_open = nfa.new()  # just after '['
        self._build_object()
        self._build_array()

    def value(self, s: int, containers: str = "{[", scalars: bool = True) -> int:
        """Any JSON value starting at s; containers are entered by a push that returns to the end state."""
        nfa = self.nfa
        end = nfa.new()
        if scalars:
            nfa.link(scalar(nfa, s), end)
        if "{" in containers:
            nfa.byte(s, 0x7B, 0x7B, self.obj_open, PUSH, end)
        if "[" in containers:
            nfa.byte(s, 0x5B, 0x5B, self.arr_open, PUSH, end)
        return end

    def _build_object(self) -> None:
        nfa = self.nfa
        o = ws(nfa, self.obj_open)
        nfa.byte(o, 0x7D, 0x7D, -1, POP)
        key = nfa.new()
        nfa.link(o, key)
        q = ws(nfa, nfa.lit(ws(nfa, string(nfa, key)), b":"))
        after = ws(nfa, self.value(q))
        nfa.link(ws(nfa, nfa.lit(after, b",")), key)
        nfa.byte(after, 0x7D, 0x7D, -1, POP)

    def _build_array(self) -> None:
        nfa = self.nfa
        a = ws(nfa, self.arr_open)
        nfa.byte(a, 0x5D, 0x5D, -1, POP)
        item = nfa.new()
        nfa.link(a, item)
        after = ws(nfa, self.value(item))
        nfa.link(ws(nfa, nfa.lit(after, b",")), item)
        nfa.byte(after, 0x5D, 0x5D, -1, POP)
