"""Jinja's filters behind the render budget: each filter that can build a large value says beforehand how large,
from its arguments (a width times the number of lines for `indent`, the matches times the replacement for
`replace`, the items plus separators for `join`, ...), and is refused before it runs when that is too much.
`wordwrap` and `striptags` are replaced by linear versions with the same output (see _jinja_text)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Callable

from jinja2 import pass_environment

from ._jinja_bounds import escaped_len, printf_bound
from ._jinja_budget import OBJ, REF, Budget, current, text_bound, units
from ._jinja_text import _LINEBREAKS, count_any, striptags, wordwrap

_SPACES = " \t\n\r\x0b\x0c"
Pre = Callable[[dict, Budget], "tuple[int, int] | int"]


def materialize(value: Any, budget: Budget) -> Any:
    """A generator (from map, select, batch, ...) as a list, one budgeted step per item."""
    if not isinstance(value, Iterator) or hasattr(value, "__len__"):
        return value
    out: list[Any] = []
    for item in value:
        budget.tick()
        out.append(item)
        if len(out) & 4095 == 0:
            budget.reserve(REF * 4096, len(out))
    budget.reserve(REF * (len(out) & 4095), len(out))
    return out


def _tb(v: Any, b: Budget, **kw: Any) -> int:
    return text_bound(v, b, **kw)


def _case(a: dict, b: Budget) -> int:
    s = a["s"]
    n = _tb(s, b)
    return n if isinstance(s, str) and s.isascii() else 3 * n


def _title(a: dict, b: Budget) -> tuple[int, int]:
    s = a["s"]
    n = _case(a, b)
    words = 2 * count_any(s, _SPACES + "-({[<") + 1 if isinstance(s, str) else n
    return 2 * n + words * (OBJ + REF), n


def _indent(a: dict, b: Budget) -> tuple[int, int]:
    s, width = a["s"], a["width"]
    ind = len(width) if isinstance(width, str) else max(width, 0) if isinstance(width, int) else 0
    n = _tb(s, b)
    lines = (count_any(s, _LINEBREAKS) if isinstance(s, str) else n) + 2
    size = n + lines * (ind + 1) + ind
    return 2 * size + lines * (OBJ + REF), size


def _replace(a: dict, b: Budget) -> int:
    s, old, new, count = a["s"], a["old"], a["new"], a["count"]
    n = _tb(s, b)
    if isinstance(s, str) and isinstance(old, str):
        hits = s.count(old) if old else n + 1
    else:
        hits = n + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    grow = (escaped_len(new) if isinstance(new, str) else _tb(new, b)) - (len(old) if isinstance(old, str) else 0)
    return n + hits * max(grow, 0)


def _join(a: dict, b: Budget) -> tuple[int, int]:
    items, sep = a["value"], a["d"]
    if not hasattr(items, "__len__"):
        return 0, 0
    b.tick(len(items))
    size = sum(_tb(x, b) for x in items) + max(len(items) - 1, 0) * _tb(sep, b)
    return 2 * size + len(items) * OBJ, size


def _format(a: dict, b: Budget) -> int:
    fmt = a["value"]
    return printf_bound(fmt, a["kwargs"] or tuple(a["args"]), b) if isinstance(fmt, str) else _tb(fmt, b)


def _sized(a: dict, key: str = "value") -> int:
    v = a[key]
    return len(v) if hasattr(v, "__len__") else 0


def _slice(a: dict, b: Budget) -> tuple[int, int]:
    slices = a["slices"] if isinstance(a["slices"], int) else 1
    b.tick(max(slices, 0))  # it yields `slices` lists whatever its input
    return REF * _sized(a) + OBJ * max(slices, 0), max(slices, 0)


def _batch(a: dict, b: Budget) -> tuple[int, int]:
    count = a["linecount"] if isinstance(a["linecount"], int) else 1
    n = _sized(a)
    fill = 2 * REF * max(count, 0) if a["fill_with"] is not None else 0  # [fill] * n, then added to the batch
    return REF * n + OBJ * (n // max(count, 1) + 1) + fill, max(count, 0)


def _sum(a: dict, b: Budget) -> tuple[int, int]:
    start, items = a["start"], a["iterable"]
    if not isinstance(start, (list, tuple)) or not hasattr(items, "__len__"):
        return 0, 0
    b.tick(len(items))
    total = len(start) + sum(len(x) for x in items if hasattr(x, "__len__"))
    return REF * total * (len(items) + 2) // 2, total  # each addition copies the sum so far


def _escape(a: dict, b: Budget) -> int:
    s = a["s"] if "s" in a else a["value"]
    return escaped_len(s) if isinstance(s, str) else 6 * _tb(s, b)


def _tojson(a: dict, b: Budget) -> int:
    indent, seps = a["indent"], a["separators"]
    ind = len(indent) if isinstance(indent, str) else max(indent, 0) if isinstance(indent, int) else 0
    item_sep, key_sep = (
        (len(str(seps[0])), len(str(seps[1]))) if isinstance(seps, (list, tuple)) and len(seps) == 2 else (2, 2)
    )
    return _tb(
        a["value"], b, mode="json", ensure_ascii=bool(a["ensure_ascii"]), indent=ind, item_sep=item_sep, key_sep=key_sep
    )


def _pprint(a: dict, b: Budget) -> tuple[int, int]:
    steps = b.steps
    size = _tb(a["value"], b, mode="pprint")
    return size + 4 * OBJ * (b.steps - steps), size  # pformat does Python work per node


def _urlencode(a: dict, b: Budget) -> int:
    v = a["value"]
    if isinstance(v, Mapping):
        return sum(12 * (_tb(k, b) + _tb(x, b)) + 2 for k, x in v.items())
    return 12 * _tb(v, b)


def _urlize(a: dict, b: Budget) -> tuple[int, int]:
    v = a["value"]
    n = _tb(v, b)
    words = (count_any(v, _SPACES) if isinstance(v, str) else n) + 1
    extra = 96 + len(str(a["target"] or "")) + len(str(a["rel"] or ""))
    size = 12 * n + words * extra
    return 2 * size + words * OBJ, size


def _xmlattr(a: dict, b: Budget) -> int:
    d = a["d"]
    if not isinstance(d, Mapping):
        return 0
    return sum(6 * (_tb(k, b) + _tb(x, b)) + 4 for k, x in d.items()) + 1


def _truncate(a: dict, b: Budget) -> int:
    return _tb(a["s"], b) + _tb(a["end"], b)


def _wordcount(a: dict, b: Budget) -> tuple[int, int]:
    n = _tb(a["s"], b)
    return n + (n // 2 + 1) * (OBJ + REF), 0


_PRE: dict[str, tuple[tuple[str, ...], dict[str, Any], Pre]] = {
    "batch": (("value", "linecount", "fill_with"), {"fill_with": None}, _batch),
    "capitalize": (("s",), {}, _case),
    "center": (
        ("value", "width"),
        {"width": 80},
        lambda a, b: max(_tb(a["value"], b), a["width"] if isinstance(a["width"], int) else 0),
    ),
    "dictsort": (("value",), {}, lambda a, b: ((REF + OBJ) * _sized(a), _sized(a))),
    "e": (("s",), {}, _escape),
    "escape": (("s",), {}, _escape),
    "forceescape": (("value",), {}, _escape),
    "groupby": (("value",), {}, lambda a, b: ((REF + OBJ) * _sized(a), _sized(a))),
    "indent": (("s", "width", "first", "blank"), {"width": 4, "first": False, "blank": False}, _indent),
    "join": (("value", "d", "attribute"), {"d": "", "attribute": None}, _join),
    "list": (("value",), {}, lambda a, b: (REF * _sized(a), _sized(a))),
    "lower": (("s",), {}, _case),
    "pprint": (("value",), {}, _pprint),
    "replace": (("s", "old", "new", "count"), {"count": None}, _replace),
    "reverse": (("value",), {}, lambda a, b: len(a["value"]) if isinstance(a["value"], str) else 0),
    "safe": (("value",), {}, lambda a, b: _tb(a["value"], b)),
    "slice": (("value", "slices", "fill_with"), {"fill_with": None}, _slice),
    "sort": (("value",), {}, lambda a, b: (REF * _sized(a), _sized(a))),
    "string": (("s",), {}, lambda a, b: _tb(a["s"], b)),
    "sum": (("iterable", "attribute", "start"), {"attribute": None, "start": 0}, _sum),
    "title": (("s",), {}, _title),
    "tojson": (
        ("value", "ensure_ascii", "indent", "separators", "sort_keys"),
        {"ensure_ascii": False, "indent": None, "separators": None, "sort_keys": False},
        _tojson,
    ),
    "trim": (("value", "chars"), {"chars": None}, lambda a, b: _tb(a["value"], b)),
    "truncate": (
        ("s", "length", "killwords", "end", "leeway"),
        {"length": 255, "killwords": False, "end": "...", "leeway": None},
        _truncate,
    ),
    "upper": (("s",), {}, _case),
    "urlencode": (("value",), {}, _urlencode),
    "urlize": (
        ("value", "trim_url_limit", "nofollow", "target", "rel", "extra_schemes"),
        {"trim_url_limit": None, "nofollow": False, "target": None, "rel": None, "extra_schemes": None},
        _urlize,
    ),
    "wordcount": (("s",), {}, _wordcount),
    "xmlattr": (("d", "autospace"), {"autospace": True}, _xmlattr),
}
_WRAP = ("s", "width", "break_long_words", "wrapstring", "break_on_hyphens")


def _named(params: tuple[str, ...], defaults: dict, args: list, kwargs: dict) -> dict | None:
    """The filter's arguments by name (None when they do not fit: the filter itself then raises its error)."""
    if len(args) > len(params) or any(k not in params for k in kwargs):
        return None
    out = dict(defaults)
    out.update(zip(params, args))
    out.update(kwargs)
    return out if all(p in out for p in params) else None


@pass_environment
def _wordwrap(env: Any, s: Any, *args: Any, **kwargs: Any) -> str:
    budget = current()
    a = _named(
        _WRAP, {"width": 79, "break_long_words": True, "wrapstring": None, "break_on_hyphens": True}, [s, *args], kwargs
    )
    if a is None:
        raise TypeError("wordwrap() got unexpected arguments")
    text = a["s"] if isinstance(a["s"], str) else str(a["s"]) if _tb(a["s"], budget) <= budget.remaining() else ""
    wrapstring = env.newline_sequence if a["wrapstring"] is None else a["wrapstring"]
    width = a["width"]
    if not isinstance(width, int) or not isinstance(wrapstring, str):
        raise TypeError("wordwrap() needs an integer width and a string wrapstring")
    return wordwrap(text, width, bool(a["break_long_words"]), wrapstring, bool(a["break_on_hyphens"]), budget)


def _striptags(value: Any) -> str:
    budget = current()
    if hasattr(value, "__html__"):
        value = value.__html__()
    budget.reserve(_tb(value, budget))
    return striptags(str(value), budget)


def guard_filter(name: str, fn: Callable) -> Callable:
    """`fn` behind the budget: a step, iterator input materialized, integer arguments bounded, the result's size
    reserved before it is built where the filter can amplify, measured after it otherwise."""
    own = {"wordwrap": _wordwrap, "striptags": _striptags}.get(name)
    fn = own or fn
    first = 1 if hasattr(fn, "jinja_pass_arg") else 0  # environment/context/eval context comes first
    pre = _PRE.get(name)

    def run(*args: Any, **kwargs: Any) -> Any:
        budget = current()
        budget.tick()
        args_l = list(args)
        if len(args_l) > first:
            args_l[first] = materialize(args_l[first], budget)
        budget.check_args(args_l[first + 1 :])
        budget.check_args(kwargs.values())
        reserved = own is not None  # these reserve as they go
        if name == "format":
            a = {"value": args_l[first] if len(args_l) > first else "", "args": args_l[first + 1 :], "kwargs": kwargs}
            budget.reserve(_format(a, budget))
            reserved = True
        elif pre is not None:
            a = _named(pre[0], pre[1], args_l[first:], kwargs)
            if a is not None:
                got = pre[2](a, budget)
                total, size = got if isinstance(got, tuple) else (got, got)
                budget.reserve(total, size)
                reserved = True
        result = fn(*args_l, **kwargs)
        if not reserved and len(args_l) > first and result is not args_l[first]:
            budget.reserve(units(result), 0)
        return budget.check_size(result)

    if hasattr(fn, "jinja_pass_arg"):
        run.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
    return run
