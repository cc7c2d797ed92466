"""The functions a template may call: Go's builtins plus Ollama's (`json`, `currentDate`, ...).

Each takes evaluated arguments and returns a value or raises FuncError; `and`/`or` are in the executor
because they short-circuit."""

from __future__ import annotations

import datetime
import html
import urllib.parse
from typing import Any, Callable

from ._gofmt import sprint, sprintf, sprintln
from ._govalues import SEQUENCE_TYPES, GoStruct, PropertyType, SliceView, go_json, truth, type_name


class FuncError(ValueError):
    """A function refused its arguments; the executor adds the function name and the position."""


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if _num(v):
        return "number"  # int and float compare with each other here (Go would refuse int vs float)
    if isinstance(v, str):
        return "string"
    if v is None:
        return "nil"
    return "other"


def eq(arg1: Any, *rest: Any) -> bool:
    if not rest:
        raise FuncError("missing argument for comparison")
    k1 = _kind(arg1)
    for arg in rest:
        k2 = _kind(arg)
        if k1 != k2:
            if k1 != "nil" and k2 != "nil":
                raise FuncError("incompatible types for comparison")
            continue
        if k1 == "other":
            raise FuncError(f"non-comparable type {type_name(arg1)}")
        if arg1 == arg:
            return True
    return False


def ne(a: Any, b: Any) -> bool:
    return not eq(a, b)


def _ordered(a: Any, b: Any) -> tuple[Any, Any]:
    ka, kb = _kind(a), _kind(b)
    if ka not in ("number", "string") or kb not in ("number", "string"):
        raise FuncError("invalid type for comparison")
    if ka != kb:
        raise FuncError("incompatible types for comparison")
    return a, b


def lt(a: Any, b: Any) -> bool:
    a, b = _ordered(a, b)
    return a < b


def le(a: Any, b: Any) -> bool:
    a, b = _ordered(a, b)
    return a <= b


def gt(a: Any, b: Any) -> bool:
    a, b = _ordered(a, b)
    return a > b


def ge(a: Any, b: Any) -> bool:
    a, b = _ordered(a, b)
    return a >= b


def not_(a: Any) -> bool:
    return not truth(a)


def length(v: Any) -> int:
    if isinstance(v, str):
        return len(v.encode())  # Go's len of a string counts bytes
    if isinstance(v, (dict, *SEQUENCE_TYPES)):
        return len(v)
    if v is None:
        raise FuncError("len of nil pointer")
    raise FuncError(f"len of type {type_name(v)}")


def _int_index(i: Any) -> int:
    if isinstance(i, bool) or not isinstance(i, int):
        if isinstance(i, float) and i.is_integer():
            return int(i)
        raise FuncError(f"cannot index slice/array with type {type_name(i)}")
    return i


def index(item: Any, *indices: Any) -> Any:
    if item is None:
        raise FuncError("index of untyped nil")
    for i in indices:
        if isinstance(item, dict):
            item = item.get(i)
        elif isinstance(item, (str, *SEQUENCE_TYPES)):
            seq = item.encode() if isinstance(item, str) else item
            n = _int_index(i)
            if not 0 <= n < len(seq):
                raise FuncError(f"index out of range: {n}")
            item = seq[n]
        else:
            raise FuncError(f"can't index item of type {type_name(item)}")
    return item


def slice_(item: Any, *indices: Any) -> Any:
    if item is None:
        raise FuncError("slice of untyped nil")
    if len(indices) > 3:
        raise FuncError(f"too many slice indexes: {len(indices)}")
    if isinstance(item, str):
        if len(indices) == 3:
            raise FuncError("cannot 3-index slice a string")
        data = item.encode()
    elif isinstance(item, SEQUENCE_TYPES):
        data = item
    else:
        raise FuncError(f"can't slice item of type {type_name(item)}")
    bounds = [0, len(data)]
    for k, i in enumerate(indices[:2]):
        bounds[k] = _int_index(i)
    if len(indices) == 3 and _int_index(indices[2]) > len(data):
        raise FuncError(f"index out of range: {indices[2]}")
    lo, hi = bounds
    if not 0 <= lo <= len(data) or not 0 <= hi <= len(data):
        raise FuncError(f"index out of range: {lo if not 0 <= lo <= len(data) else hi}")
    if lo > hi:
        raise FuncError(f"invalid slice index: {lo} > {hi}")
    if isinstance(item, str):
        return data[lo:hi].decode("utf-8", errors="replace")
    return SliceView(data, lo, hi)


def printf(fmt: Any, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise FuncError(f"wrong type for value; expected string; got {type_name(fmt)}")
    return sprintf(fmt, list(args))


def current_date(*_args: Any) -> str:
    # Ollama accepts and ignores a format argument; the date is always YYYY-MM-DD, local time
    return datetime.date.today().isoformat()


def yesterday_date(*_args: Any) -> str:
    return (datetime.date.today() - datetime.timedelta(days=1)).isoformat()


_TS_TYPES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "array": "any[]",
    "object": "Record<string, any>",
    "null": "null",
}


def to_typescript_type(v: Any) -> str:
    """Ollama's toTypeScriptType for a tool property: anyOf and type lists joined with ` | `."""
    if not isinstance(v, GoStruct) or v.type_name != "api.ToolProperty":
        return "any"
    any_of = v.fields.get("AnyOf") or []
    if any_of:
        return " | ".join(to_typescript_type(p) for p in any_of)
    types = v.fields.get("Type") or PropertyType()
    if not types:
        return "any"
    return " | ".join(_TS_TYPES.get(t, "any") for t in types)


def html_escape(*args: Any) -> str:
    return html.escape(sprint(list(args)), quote=True).replace("&#x27;", "&#39;").replace("&quot;", "&#34;")


def urlquery(*args: Any) -> str:
    return urllib.parse.quote_plus(sprint(list(args)))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "eq": eq,
    "ne": ne,
    "lt": lt,
    "le": le,
    "gt": gt,
    "ge": ge,
    "not": not_,
    "len": length,
    "index": index,
    "slice": slice_,
    "print": lambda *a: sprint(list(a)),
    "println": lambda *a: sprintln(list(a)),
    "printf": printf,
    "json": go_json,
    "toJson": go_json,
    "currentDate": current_date,
    "yesterdayDate": yesterday_date,
    "toTypeScriptType": to_typescript_type,
    "html": html_escape,
    "urlquery": urlquery,
}
ARITY = {
    "ne": (2, 2),
    "lt": (2, 2),
    "le": (2, 2),
    "gt": (2, 2),
    "ge": (2, 2),
    "not": (1, 1),
    "len": (1, 1),
    "index": (1, None),
    "slice": (1, None),
    "printf": (1, None),
    "json": (1, 1),
    "toJson": (1, 1),
    "eq": (1, None),
    "toTypeScriptType": (1, 1),
    "and": (1, None),
    "or": (1, None),
}
NAMES = frozenset(FUNCTIONS) | {"and", "or"}
