"""The resource budget of one Jinja render, and size bounds computed before anything is built.

Every operation of a template that can build a value (a filter, a method call, `*`, `+`, `%`, `~`, a slice,
an output expression) says first how large its result can get; the budget refuses it when that is more than
one value may hold (`max_output`) or more than what is left of the render's allowance (`max_built`, counted
over the whole render and never given back). Sizes are in "units": a character of a string, `REF` per element
of a list, `OBJ` per small object created on the way (a piece of a split, a chunk of a wrap)."""

from __future__ import annotations

import contextvars
import time
from collections.abc import ItemsView, KeysView, Mapping, ValuesView
from dataclasses import dataclass
from typing import Any

from jinja2.runtime import Undefined
from jinja2.utils import Namespace

from .errors import TemplateError

MAX_INT_BITS = 4096  # integers a template may build (stops 9**9**9 and repeated squaring)
REF = 8  # units per element of a list or tuple (a pointer)
OBJ = 64  # units per small object an operation creates (a str header is ~50 bytes)
_EXACT_REPR = 1 << 16  # strings up to this long get an exact repr/json length, longer ones a bound


@dataclass(frozen=True)
class JinjaLimits:
    max_output: int = 8 << 20  # characters of output, and of any one string or list built on the way
    max_steps: int = 2_000_000  # loop iterations + calls + guarded operations per render
    timeout_s: float = 5.0  # wall-clock limit of one render
    max_built: int | None = None  # units built over the whole render; None = 8 x max_output


def refuse(msg: str) -> TemplateError:
    return TemplateError(msg, kind="jinja")


class Budget:
    def __init__(self, limits: JinjaLimits):
        self.limits = limits
        self.steps = 0
        self.built = 0
        self.max_built = limits.max_built if limits.max_built is not None else 8 * limits.max_output
        self.deadline = time.monotonic() + limits.timeout_s

    def tick(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.limits.max_steps:
            raise refuse(f"template exceeds {self.limits.max_steps} steps")
        if self.steps & 255 < n:
            self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise refuse(f"template rendering exceeds {self.limits.timeout_s:g} s")

    def remaining(self) -> int:
        return max(0, self.max_built - self.built)

    def reserve(self, units: int, value_units: int | None = None) -> None:
        """Account for an operation before it runs: `units` it allocates in all, `value_units` the size of the
        one value it returns (defaults to `units`). Refused when either is over its limit."""
        value = units if value_units is None else value_units
        if value > self.limits.max_output:
            raise refuse(f"template builds a value of up to {value} characters, more than {self.limits.max_output}")
        if self.built + units > self.max_built:
            raise refuse(f"template builds more than {self.max_built} characters in all")
        self.built += units
        self.check_time()  # a costly operation is about to run: the deadline is checked before each one

    def check_size(self, value: Any) -> Any:
        if isinstance(value, (str, bytes, list, tuple)) and len(value) > self.limits.max_output:
            raise refuse(f"template builds a value longer than {self.limits.max_output}")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise refuse("template builds an integer that is too large")
        return value

    def check_args(self, args: Any) -> None:
        """Integer arguments (widths, counts) large enough to build an oversized value are refused up front."""
        for a in args:
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.limits.max_output:
                raise refuse(f"template argument {a} is out of bounds")


_budget: contextvars.ContextVar[Budget] = contextvars.ContextVar("localrt_jinja_budget")


def current() -> Budget:
    try:
        return _budget.get()
    except LookupError:
        raise refuse("template rendered outside render_jinja") from None


def enter(limits: JinjaLimits) -> tuple[Budget, Any]:
    budget = Budget(limits)
    return budget, _budget.set(budget)


def leave(token: Any) -> None:
    _budget.reset(token)


def units(value: Any) -> int:
    """What a value just built costs, for results whose size was not known beforehand."""
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return REF * len(value)
    if isinstance(value, Mapping):
        return 2 * OBJ * len(value)
    return 0


def int_digits(v: int) -> int:
    return (v.bit_length() * 1233 >> 12) + 2  # log10(2) ~ 1233/4096, plus sign and rounding


def _str_bound(s: str, mode: str, ensure_ascii: bool, cache: dict[int, int]) -> int:
    """Length of repr(s) (mode "repr") or json.dumps(s) (mode "json"), exact for short strings."""
    key = id(s)
    if key in cache:
        return cache[key]
    n = len(s)
    if n <= _EXACT_REPR:
        import json

        out = len(json.dumps(s, ensure_ascii=ensure_ascii)) if mode == "json" else len(repr(s))
    elif mode == "json":
        plain = s.isprintable() and (s.isascii() or not ensure_ascii)
        out = 2 + n + s.count('"') + s.count("\\") if plain else 2 + (12 if ensure_ascii else 6) * n
    else:
        out = 2 + n + s.count("'") + s.count("\\") if s.isprintable() else 2 + (4 if s.isascii() else 10) * n
    if type(s) is not str and mode != "json":
        out += 2 + len(type(s).__name__)  # Markup('...')
    cache[key] = out
    return out


def text_bound(
    value: Any,
    budget: Budget,
    *,
    mode: str = "str",
    ensure_ascii: bool = False,
    indent: int = 0,
    item_sep: int = 2,
    key_sep: int = 2,
    limit: int | None = None,
) -> int:
    """An upper bound on len(str(value)) (mode "str"), repr(value) ("repr"), json.dumps(value, ...) ("json")
    or pprint.pformat(value) ("pprint"), found without building it. Each node visited is a step, a container met
    again (shared references) is counted from memory, and counting stops once the bound passes `limit`
    (default: what is left of the budget), since that is refused anyway. A value that contains itself is
    refused: printing it never ends."""
    if isinstance(value, str) and mode == "str":
        return len(value)
    if limit is None:
        limit = budget.remaining() + 1
    layout = mode == "pprint" or (mode == "json" and indent > 0)  # sizes depend on depth
    total = 0
    cache: dict[int, int] = {}
    memo: dict[tuple[int, int], int] = {}
    path: set[int] = set()
    # (iterator over the children, their depth, the container's id, total when it was entered)
    stack: list[tuple[Any, int, int, int]] = [(iter((value,)), 0, 0, 0)]
    while stack:
        it, depth, cid, start = stack[-1]
        v = next(it, _DONE)
        if v is _DONE:
            stack.pop()
            if cid:
                path.discard(cid)
                memo[(cid, depth if layout else 0)] = total - start
            continue
        budget.tick()
        if isinstance(v, str):
            total += len(v) if (mode == "str" and depth == 0) else _str_bound(v, mode, ensure_ascii, cache)
        elif isinstance(v, (bytes, bytearray)):
            total += 4 * len(v) + 14
        elif v is None or isinstance(v, (bool, float)):
            total += 26  # the longest float repr is 24 characters
        elif isinstance(v, int):
            total += int_digits(v)
        elif isinstance(v, Undefined):
            total += 0 if (mode == "str" and depth == 0) else 16
        elif isinstance(v, (Mapping, Namespace, list, tuple, KeysView, ValuesView, ItemsView)):
            key = (id(v), depth + 1 if layout else 0)
            if key in memo and mode != "pprint":  # pformat itself walks every copy: so does its bound
                total += memo[key]
            elif id(v) in path:
                raise refuse("template prints a value that contains itself")
            else:
                before = total
                if isinstance(v, (Mapping, Namespace)):
                    items = v.items() if isinstance(v, Mapping) else v._Namespace__attrs.items()  # type: ignore
                    total += 16 + len(items) * (item_sep + key_sep + 2 + _line(mode, indent, depth))
                    children = _flat(items)
                else:
                    total += 16 + len(v) * (item_sep + _line(mode, indent, depth))
                    children = iter(v)
                path.add(id(v))
                stack.append((children, depth + 1, id(v), before))
        else:
            total += 256  # any other object prints as a short repr: <generator ...>, range(0, 9), <Macro 'f'>
        if total > limit:
            break
    return total


_DONE = object()


def _flat(items: Any) -> Any:
    for k, x in items:
        yield k
        yield x


def _line(mode: str, indent: int, depth: int) -> int:
    """What layout adds per element: json's newline and indent, pprint's newline and nesting indent."""
    if mode == "json" and indent:
        return 1 + indent * (depth + 1)
    if mode == "pprint":
        return 2 + depth
    return 0
