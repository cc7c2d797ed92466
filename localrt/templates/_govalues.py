"""How Go sees the values a template works on: structs, slices, maps, nil, truth, %v printing and JSON.

Python stand-ins: dict = Go map (ranged and printed in sorted key order), list/tuple/SliceView = slice,
GoStruct = struct (unknown field is an error), None = nil, str/int/float/bool as themselves."""

from __future__ import annotations

import json
import math
from typing import Any, Iterator


class GoStruct:
    """A Go struct value: fixed, ordered fields. `stringer` makes printing use the JSON form (Go String())."""

    __slots__ = ("type_name", "fields", "json_names", "omitempty", "stringer")

    def __init__(
        self,
        type_name: str,
        fields: dict[str, Any],
        *,
        json_names: dict[str, str] | None = None,
        omitempty: frozenset[str] = frozenset(),
        stringer: bool = False,
    ):
        self.type_name = type_name
        self.fields = fields
        self.json_names = json_names or {}
        self.omitempty = omitempty
        self.stringer = stringer

    def to_json_obj(self) -> dict:
        out = {}
        for name, value in self.fields.items():
            if name in self.omitempty and is_empty(value):
                continue
            out[self.json_names.get(name, name)] = value
        return out


class JSONMap(dict):
    """A Go map type whose String() method prints its JSON (Ollama's tool-call arguments and properties)."""


class JSONList(list):
    """A Go slice type whose String() method prints its JSON (Ollama's `.Tools`)."""


class PropertyType(list):
    """Ollama's PropertyType: a list of JSON type names that prints/marshals as a bare string when single."""

    def go_string(self) -> str:
        if len(self) == 1:
            return self[0]
        return "" if not self else format_v(list(self))

    def to_json_obj(self) -> Any:
        return self[0] if len(self) == 1 else list(self)


class SliceView:
    """`slice` of a list without copying it (templates call `slice $.Messages $i` once per message)."""

    __slots__ = ("base", "start", "stop")

    def __init__(self, base: Any, start: int, stop: int):
        if isinstance(base, SliceView):
            base, start, stop = base.base, base.start + start, base.start + stop
        self.base, self.start, self.stop = base, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> Any:
        return self.base[self.start + i]

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.start, self.stop):
            yield self.base[i]


SEQUENCE_TYPES = (list, tuple, SliceView)


def is_empty(value: Any) -> bool:
    """Go's `omitempty` test and the zero test of `truth` for non-struct values."""
    if value is None or value is False:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, (str, dict, *SEQUENCE_TYPES)):
        return len(value) == 0
    return False


def truth(value: Any) -> bool:
    """Go template truth: false, 0, nil, and empty string/slice/map are false; structs are always true."""
    if isinstance(value, GoStruct):
        return True
    return not is_empty(value)


def type_name(value: Any) -> str:
    """The Go type name used in error messages."""
    if value is None:
        return "<nil>"
    if isinstance(value, GoStruct):
        return value.type_name
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "map[string]interface {}"
    if isinstance(value, SEQUENCE_TYPES):
        return "[]interface {}"
    return type(value).__name__


def format_float_v(f: float, e: str = "e") -> str:
    """Go's %v (and %g) for float64: shortest digits, exponent form when exp < -4 or exp >= 6."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    digits, exp = _shortest_digits(f)
    sign = "-" if f < 0 else ""
    if exp < -4 or exp >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}{e}{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{digits}"
    if exp + 1 >= len(digits):
        return sign + digits + "0" * (exp + 1 - len(digits))
    return f"{sign}{digits[: exp + 1]}.{digits[exp + 1 :]}"


def _shortest_digits(f: float) -> tuple[str, int]:
    """(significant digits, decimal exponent of the first digit) of the shortest round-trip form."""
    # repr is the shortest round-trip form; normalise it to digits + exponent
    r = repr(abs(f))
    if "e" in r:
        m, _, e = r.partition("e")
        digits, exp10 = m.replace(".", ""), int(e)
        point = m.find(".") if "." in m else len(m)
        exp10 += point - 1
    else:
        int_part, _, frac = r.partition(".")
        if int_part.strip("0"):
            exp10 = len(int_part.lstrip("0")) - 1
            digits = int_part.lstrip("0") + frac
        else:
            stripped = frac.lstrip("0")
            exp10 = -(len(frac) - len(stripped)) - 1
            digits = stripped
    digits = digits.rstrip("0") or "0"
    return digits.lstrip("0") or "0", exp10


def format_v(value: Any, top: bool = True) -> str:
    """fmt's %v of a template value (what `{{ x }}`, `print` and `printf "%v"` show)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float_v(value)
    if isinstance(value, str):
        return value
    if isinstance(value, PropertyType):
        return value.go_string()
    if isinstance(value, (JSONMap, JSONList)):
        return go_json(value)
    if isinstance(value, GoStruct):
        if value.stringer:
            return go_json(value)
        return "{" + " ".join(format_v(v, False) for v in value.fields.values()) + "}"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{format_v(k, False)}:{format_v(value[k], False)}" for k in sorted_keys(value)) + "]"
    if isinstance(value, SEQUENCE_TYPES):
        return "[" + " ".join(format_v(v, False) for v in value) + "]"
    raise TypeError(f"value of type {type(value).__name__} cannot appear in a template")


def sorted_keys(d: dict) -> list:
    """Go ranges and prints maps in sorted key order."""
    try:
        return sorted(d)
    except TypeError:
        return sorted(d, key=str)


def _json_default(value: Any) -> Any:
    if isinstance(value, (GoStruct, PropertyType)):
        return value.to_json_obj()
    if isinstance(value, SliceView):
        return list(value)
    raise TypeError(f"json: unsupported type {type(value).__name__}")


def go_json(value: Any) -> str:
    """encoding/json.Marshal: compact, map keys sorted, struct fields in order, HTML characters escaped."""
    text = json.dumps(
        _sort_maps(value), ensure_ascii=False, separators=(",", ":"), default=_json_default, allow_nan=False
    )
    # Go's Marshal escapes these for safe embedding in HTML/JS
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _sort_maps(value: Any) -> Any:
    """Go sorts map keys when marshalling; struct fields keep their order."""
    if isinstance(value, GoStruct):
        return {k: _sort_maps(v) for k, v in value.to_json_obj().items()}
    if isinstance(value, PropertyType):
        return value.to_json_obj()
    if isinstance(value, dict):
        return {str(k): _sort_maps(value[k]) for k in sorted_keys(value)}
    if isinstance(value, SEQUENCE_TYPES):
        return [_sort_maps(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)  # Go marshals 1.0 as 1
    return value
