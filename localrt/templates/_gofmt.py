"""Go's fmt for templates: `print`, `println` and `printf` with the common verbs, flags, width, precision."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ._govalues import format_float_v, format_v, type_name

MAX_WIDTH = 10_000  # width/precision beyond this would only serve to blow up the output
_DIRECTIVE = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d*))?(.?)", re.S)


class FormatError(ValueError):
    """A printf width or precision beyond MAX_WIDTH."""


def sprint(args: list[Any]) -> str:
    """fmt.Sprint: a space between operands when neither side is a string."""
    out = []
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(format_v(a))
    return "".join(out)


def sprintln(args: list[Any]) -> str:
    return " ".join(format_v(a) for a in args) + "\n"


def sprintf(fmt: str, args: list[Any]) -> str:
    out, used, pos = [], 0, 0
    for m in _DIRECTIVE.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%":
            out.append("%")
            continue
        if not verb:
            out.append("%!(NOVERB)")
            continue
        w = int(width) if width else None
        p = (int(prec) if prec else 0) if prec is not None else None
        if (w or 0) > MAX_WIDTH or (p or 0) > MAX_WIDTH:
            raise FormatError(f"printf width or precision above {MAX_WIDTH}")
        if used >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        out.append(_pad(_verb(verb, flags, p, args[used]), flags, w, verb))
        used += 1
    out.append(fmt[pos:])
    if used < len(args):
        extra = ", ".join(f"{type_name(a)}={format_v(a)}" for a in args[used:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _bad(verb: str, value: Any) -> str:
    return f"%!{verb}({type_name(value)}={format_v(value)})"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _verb(verb: str, flags: str, prec: int | None, v: Any) -> str:
    if verb == "v":
        return format_v(v)
    if verb == "s":
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return _bad(verb, v)
        s = format_v(v)
        return s[:prec] if prec is not None else s
    if verb == "q":
        if isinstance(v, str):
            return json.dumps(v, ensure_ascii=False)
        if _is_int(v):
            return "'" + chr(v) + "'" if 0 <= v <= 0x10FFFF else _bad(verb, v)
        return _bad(verb, v)
    if verb == "t":
        return ("true" if v else "false") if isinstance(v, bool) else _bad(verb, v)
    if verb in "dboxXc":
        return _int_verb(verb, flags, v)
    if verb in "eEfFgG":
        if _is_int(v) or not isinstance(v, float):
            return _bad(verb, v)
        return _float_verb(verb, flags, prec, v)
    return _bad(verb, v)


def _int_verb(verb: str, flags: str, v: Any) -> str:
    if verb in "xX" and isinstance(v, str):
        s = v.encode().hex()
        return s.upper() if verb == "X" else s
    if not _is_int(v):
        return _bad(verb, v)
    if verb == "c":
        return chr(v) if 0 <= v <= 0x10FFFF else "\ufffd"
    body = {
        "d": str,
        "b": lambda n: format(n, "b"),
        "o": lambda n: format(n, "o"),
        "x": lambda n: format(n, "x"),
        "X": lambda n: format(n, "X"),
    }[verb](abs(v))
    if "#" in flags and verb in "xXo":
        body = {"x": "0x", "X": "0X", "o": "0"}[verb] + body
    sign = "-" if v < 0 else ("+" if "+" in flags else (" " if " " in flags else ""))
    return sign + body


def _float_verb(verb: str, flags: str, prec: int | None, v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        s = "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")
        return s if not (s == "+Inf" and "+" not in flags) else "+Inf"
    sign = "+" if ("+" in flags and v >= 0) else (" " if (" " in flags and v >= 0) else "")
    if verb in "gG" and prec is None:
        return sign + _shortest_g(v, verb)
    p = 6 if prec is None else prec
    return sign + format(v, f".{p}{verb}")


def _shortest_g(v: float, verb: str) -> str:
    """%g without precision is %v's shortest form (exponent when exp < -4 or exp >= 6)."""
    return format_float_v(v, "E" if verb == "G" else "e")


def _pad(s: str, flags: str, width: int | None, verb: str) -> str:
    if width is None or len(s) >= width:
        return s
    if "-" in flags:
        return s + " " * (width - len(s))
    if "0" in flags and verb in "dboxXeEfFgG":
        sign = s[0] if s[:1] in "+- " else ""
        return sign + "0" * (width - len(s)) + s[len(sign) :]
    return " " * (width - len(s)) + s
