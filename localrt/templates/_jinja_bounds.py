"""How large the result of a method call or a formatting operation can get, worked out from its arguments before
Python builds it: str/bytes methods (center, expandtabs, replace, join, split, translate, ...), printf-style `%`,
and `str.format` fields (widths and precisions, including ones that come from arguments)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter

from ._jinja_budget import OBJ, REF, Budget, int_digits, refuse, text_bound
from ._jinja_text import _LINEBREAKS, count_any

_ASCII_SPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
_CASE = {"capitalize", "casefold", "lower", "swapcase", "title", "upper"}
_SHRINK = {"strip", "lstrip", "rstrip", "removeprefix", "removesuffix", "unescape"}
_SCALAR = {
    "count",
    "find",
    "rfind",
    "index",
    "rindex",
    "startswith",
    "endswith",
    "isalnum",
    "isalpha",
    "isascii",
    "isdecimal",
    "isdigit",
    "isidentifier",
    "islower",
    "isnumeric",
    "isprintable",
    "isspace",
    "istitle",
    "isupper",
    "bit_length",
    "bit_count",
    "is_integer",
    "get",
    "keys",
    "values",
    "items",
    "conjugate",
}
_ESC = "&<>\"'"


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def escaped_len(s: Any) -> int:
    """len(markupsafe.escape(s)) for a string: & ' " become 5 characters, < > 4."""
    if not isinstance(s, str):
        return 0
    if hasattr(s, "__html__"):
        return len(s)
    return len(s) + 4 * (s.count("&") + s.count('"') + s.count("'")) + 3 * (s.count("<") + s.count(">"))


def _pieces(s: str | bytes, sep: Any, maxsplit: Any) -> int:
    if sep is None:
        if isinstance(s, bytes):
            n = sum(s.count(bytes([c])) for c in b" \t\n\r\x0b\x0c") + 1
        else:
            n = count_any(s, _ASCII_SPACE) + 1 if s.isascii() else len(s) // 2 + 1
    elif isinstance(sep, (str, bytes)) and sep:
        n = s.count(sep) + 1
    else:
        return 1  # Python refuses an empty or wrong separator itself
    m = _int(maxsplit, -1)
    return min(n, m + 1) if m >= 0 else n


def method_bound(fn: Any, args: tuple, kwargs: dict, budget: Budget) -> tuple[int, int] | None:
    """(units the call allocates, size of its result) for the methods a template can reach, None for other
    callables (macros, namespace(), loop.cycle, ...), whose result is measured afterwards instead."""
    obj = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", "")
    if isinstance(obj, (str, bytes)):
        n = _text_method(obj, name, args, kwargs, budget)
        return n if isinstance(n, tuple) else (n, n)
    if isinstance(obj, (list, tuple)) and name == "copy":
        return REF * len(obj), len(obj)
    if isinstance(obj, Mapping) and name == "copy":
        return 2 * OBJ * len(obj), 0
    if name == "fromkeys":
        keys = _arg(args, kwargs, 0, "iterable", ())
        n = len(keys) if hasattr(keys, "__len__") else budget.limits.max_output + 1
        return 2 * OBJ * n, 0
    if isinstance(obj, int) and name == "to_bytes":
        n = _int(_arg(args, kwargs, 0, "length", 1), 1)
        return n, n
    return None


def _text_method(s: str | bytes, name: str, args: tuple, kwargs: dict, budget: Budget) -> int | tuple[int, int]:
    n = len(s)
    markup = hasattr(s, "__html__")
    if name in _SCALAR:
        return 0
    if name in _SHRINK:
        return n
    if name in _CASE:
        return n if s.isascii() else 3 * n  # one character can upper-case to three ('ﬃ' -> 'FFI')
    if name in ("center", "ljust", "rjust", "zfill"):
        return max(n, _int(_arg(args, kwargs, 0, "width")))
    if name == "expandtabs":
        tab = "\t" if isinstance(s, str) else b"\t"
        return n + s.count(tab) * max(_int(_arg(args, kwargs, 0, "tabsize", 8), 8), 0)
    if name == "replace":
        old, new, count = _arg(args, kwargs, 0, "old"), _arg(args, kwargs, 1, "new"), _arg(args, kwargs, 2, "count", -1)
        if not isinstance(old, (str, bytes)) or not isinstance(new, (str, bytes)):
            return n
        hits = s.count(old) if old else n + 1
        if _int(count, -1) >= 0:
            hits = min(hits, count)
        grow = (escaped_len(new) if markup else len(new)) - len(old)
        return n + hits * max(grow, 0)
    if name == "join":
        items = _arg(args, kwargs, 0, "iterable", ())
        if not isinstance(items, (list, tuple)):
            return n  # the caller materialized any iterator; anything else is refused by Python
        budget.tick(len(items))
        size = sum((escaped_len(x) if markup else len(x)) for x in items if isinstance(x, (str, bytes)))
        return size + max(len(items) - 1, 0) * n
    if name in ("split", "rsplit"):
        p = _pieces(s, _arg(args, kwargs, 0, "sep"), _arg(args, kwargs, 1, "maxsplit", -1))
        return n + p * (OBJ + REF), p
    if name == "splitlines":
        breaks = _LINEBREAKS if isinstance(s, str) else None
        p = (count_any(s, breaks) if breaks else s.count(b"\n") + s.count(b"\r")) + 1
        return n + p * (OBJ + REF), p
    if name in ("partition", "rpartition"):
        return n + 3 * OBJ, n
    if name == "encode":
        enc = str(_arg(args, kwargs, 0, "encoding", "utf-8")).lower().replace("_", "-")
        errors = _arg(args, kwargs, 1, "errors", "strict")
        plain = enc in ("utf-8", "utf8") and errors in ("strict", "ignore", "replace", "surrogateescape")
        return n if s.isascii() and plain else (4 if plain else 12) * n
    if name == "decode":
        return 4 * n
    if name == "hex":
        return 3 * n
    if name == "translate":
        table = _arg(args, kwargs, 0, "table")
        if isinstance(table, Mapping):
            budget.tick(len(table))
            longest = max([len(v) for v in table.values() if isinstance(v, str)] + [1])
            return n * longest * (6 if markup else 1)
        return n
    if name == "maketrans":
        return sum(len(a) for a in args if hasattr(a, "__len__")) * OBJ, 0
    if name == "striptags":
        return 3 * n
    return n  # any other str method builds at most a copy


# ---- printf-style % and str.format -------------------------------------------------------------------------

_PRINTF = re.compile(r"%(?:\(([^)]*)\))?([-#0 +]*)(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.S)
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[_,]?(?:\.(\d+))?([bcdeEfFgGnosxX%]?)", re.S)
_MAX_DIGITS = 12  # a width or precision written with more digits than this is refused


def _num(text: str | None, default: int = 0) -> int:
    if not text:
        return default
    if len(text) > _MAX_DIGITS:
        raise refuse("template format width or precision is too large")
    return int(text)


def _content(value: Any, kind: str, prec: int | None, budget: Budget) -> int:
    """Characters one formatted value needs before padding to a width (grouping separators included)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind and kind in "eEfFgG%":
        digits = int_digits(value) if isinstance(value, int) else 330  # a float has at most 309 integer digits
        return digits * 4 // 3 + (6 if prec is None else prec) + 8
    if kind and kind in "bcdiouxXn" and number:
        bits = value.bit_length() if isinstance(value, int) else 1030
        n = bits + 8 if kind == "b" else bits // 3 + 8 if kind in "oxX" else int_digits(1 << bits) + 8
        return n * 4 // 3 + (prec or 0)
    if number and not kind:
        return text_bound(value, budget) * 4 // 3 + (prec or 0) + 8
    n = text_bound(value, budget, mode="repr" if kind in ("r", "a") else "str") * (10 if kind == "a" else 1)
    return min(n, prec) if prec is not None else n


def printf_bound(fmt: str, args: Any, budget: Budget) -> int:
    """An upper bound on len(fmt % args)."""
    mapping = args if isinstance(args, Mapping) else None
    seq = list(args) if isinstance(args, tuple) else [args]
    total, i = len(fmt), 0

    def take() -> Any:
        nonlocal i
        i += 1
        return seq[i - 1] if i <= len(seq) else None

    for m in _PRINTF.finditer(fmt):
        budget.tick()
        key, width, prec, kind = m.group(1), m.group(3), m.group(4), m.group(5)
        if kind == "%":
            continue
        w = abs(_int(take())) if width == "*" else _num(width)
        p = abs(_int(take())) if prec == "*" else (_num(prec) if prec is not None else None)
        value = mapping.get(key) if key is not None and mapping is not None else take()
        total += max(w, _content(value, kind, p, budget))
        if total > budget.limits.max_output:
            break
    return total


def spec_bound(value: Any, spec: str, budget: Budget) -> int:
    """An upper bound on len(format(value, spec))."""
    m = _SPEC.fullmatch(spec)
    if m is None:
        return len(spec) + text_bound(value, budget) * 2  # Python refuses an unknown spec for these types
    width, prec, kind = _num(m.group(1)), m.group(2), m.group(3)
    return max(width, _content(value, kind, _num(prec) if prec is not None else None, budget))


class _Bounded:
    """A sandboxed str.format that checks each field's size (its width, precision and conversion) before
    formatting it, and the running length of the whole result."""

    escape_factor = 1

    def __init__(self, env: Any, budget: Budget, fmt: str, **kwargs: Any):
        super().__init__(env, **kwargs)  # type: ignore[call-arg]
        self._budget = budget
        self._total = len(fmt)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion in ("r", "a", "s"):
            n = text_bound(value, self._budget, mode="str" if conversion == "s" else "repr")
            self._budget.reserve(n * (10 if conversion == "a" else 1))
        return super().convert_field(value, conversion)  # type: ignore[misc]

    def format_field(self, value: Any, format_spec: str) -> Any:
        self._budget.tick()
        n = spec_bound(value, format_spec, self._budget) * self.escape_factor
        self._total += n
        self._budget.reserve(2 * n, self._total)  # the field, then its share of the joined result
        return super().format_field(value, format_spec)  # type: ignore[misc]


class BoundedFormatter(_Bounded, SandboxedFormatter):
    pass


class BoundedEscapeFormatter(_Bounded, SandboxedEscapeFormatter):
    escape_factor = 6
