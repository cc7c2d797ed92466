"""HF-style Jinja chat templates (a GGUF's `tokenizer.chat_template`), rendered in Jinja's immutable sandbox
with a source-size cap, an output-size cap, a loop/call budget and a wall-clock limit. Every operation that can
build a large value is sized before it runs, against one value's cap and what is left of the render's allowance
(see _jinja_budget); a refused render's memory is released before the error leaves.

Semantics follow transformers' `apply_chat_template`: `messages`, `tools`, `add_generation_prompt`,
`bos_token`, `eos_token`, `raise_exception`, `strftime_now`, `tojson` (no HTML escaping), `trim_blocks` and
`lstrip_blocks`, loop controls. Any failure, including a sandbox violation, is a TemplateError."""

from __future__ import annotations

import datetime
import json
import sys
import traceback
from functools import update_wrapper
from typing import Any, Iterator, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from ._jinja_bounds import BoundedEscapeFormatter, BoundedFormatter, escaped_len, method_bound, printf_bound
from ._jinja_budget import MAX_INT_BITS, REF, JinjaLimits, _budget, current, enter, leave, refuse, text_bound, units
from ._jinja_filters import guard_filter, materialize
from ._jinja_text import striptags as _linear_striptags
from .errors import TemplateError

__all__ = ["MAX_INT_BITS", "MAX_SOURCE", "JinjaLimits", "JinjaTemplate"]

MAX_SOURCE = 256 * 1024  # characters; the largest real chat templates are tens of KiB
_ITER = "__localrt_iter"  # global that every {% for %} iterable is routed through
_CONCAT = "__localrt_concat"  # global that every `~` concatenation is routed through
_DATA = "__localrt_data"  # global that every piece of literal template text is routed through
_SLICE = "__localrt_slice"  # global that every `x[a:b:c]` is routed through (Jinja compiles slices inline)


def _guard_iter(iterable: Any) -> Iterator[Any]:
    budget = current()
    for item in iterable:
        budget.tick()
        yield item


def _guard_concat(*parts: Any) -> str:
    budget = current()
    budget.tick()
    budget.reserve(sum(text_bound(p, budget) for p in parts))
    return "".join(map(str, parts))


def _data(text: str) -> str:
    return text  # literal text as an expression, so that finalize counts it inside macros and loops too


def _guard_slice(obj: Any, start: Any, stop: Any, step: Any) -> Any:
    budget = current()
    budget.tick()
    sl = slice(start, stop, step)
    if isinstance(obj, (str, bytes, list, tuple)):
        n = len(range(*sl.indices(len(obj))))
        budget.reserve(n * (1 if isinstance(obj, (str, bytes)) else REF), n)
    return obj[sl]


def _finalize(value: Any) -> Any:
    """Every `{{ ... }}` and literal text goes through here before str(): its printed size is reserved first
    (a list of a thousand references to one long string prints a thousand copies of it)."""
    budget = _budget.get(None)
    if budget is None:
        return value  # a constant folded while compiling
    budget.reserve(text_bound(value, budget))
    return value


class _Guards(NodeTransformer):
    """Routes every for-loop iterable, every `~` and every literal text through the budget (none of them reaches a
    sandbox hook)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name(_ITER, "load"), [node.iter], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.Name(_CONCAT, "load"), node.nodes, [], None, None, lineno=node.lineno)

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if not isinstance(node.arg, nodes.Slice) or node.ctx != "load":
            return node
        parts = [p if p is not None else nodes.Const(None) for p in (node.arg.start, node.arg.stop, node.arg.step)]
        return nodes.Call(nodes.Name(_SLICE, "load"), [node.node, *parts], [], None, None, lineno=node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [
            nodes.Call(nodes.Name(_DATA, "load"), [nodes.Const(n.data)], [], None, None, lineno=n.lineno)
            if isinstance(n, nodes.TemplateData)
            else n
            for n in node.nodes
        ]
        return node


def _seq_units(v: Any) -> int:
    return len(v) if isinstance(v, (str, bytes)) else REF * len(v) if isinstance(v, (list, tuple)) else 0


def _binop_bound(operator: str, left: Any, right: Any, budget: Any) -> tuple[int, int] | None:
    """(units, result size) of `left op right` for the operators that build sequences, before Python does."""
    if operator == "*":
        seq, n = (left, right) if isinstance(left, (str, bytes, list, tuple)) else (right, left)
        if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
            k = max(n, 0)
            return _seq_units(seq) * k, len(seq) * k
    elif operator == "+":
        if isinstance(left, str) and isinstance(right, str):
            lm, rm = isinstance(left, Markup), isinstance(right, Markup)
            size = (len(left) if lm or not rm else escaped_len(left)) + (
                len(right) if rm or not lm else escaped_len(right)
            )
            return size, size
        if isinstance(left, (bytes, list, tuple)) and isinstance(right, (bytes, list, tuple)):
            return _seq_units(left) + _seq_units(right), len(left) + len(right)
    elif operator == "%" and isinstance(left, str):
        size = printf_bound(left, right, budget) * (6 if isinstance(left, Markup) else 1)
        return size, size
    return None


class _Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

    def handle_exception(self, source: str | None = None) -> NoReturn:
        """A render failure propagates with its own frames. Jinja's rewrite would copy the template's locals into
        fake frames whose globals hold the exception: a cycle that keeps everything the render built until a
        full collection, which stalls every thread of a daemon with a large heap. Syntax errors are rewritten as
        usual (they hold no render state)."""
        if isinstance(sys.exc_info()[1], jinja2.TemplateSyntaxError):
            super().handle_exception(source)
        raise  # noqa: PLE0704  re-raises the exception being handled, traceback unchanged

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        tree = _Guards().visit(tree)
        tree.set_environment(self)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = current()
        budget.tick()
        if operator == "**" and isinstance(right, int) and abs(right) > 64 and not isinstance(left, float):
            raise refuse("template exponent is too large")
        bound = _binop_bound(operator, left, right, budget)
        if bound is not None:
            budget.reserve(*bound)
        return budget.check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = current()
        budget.tick()
        budget.check_args(args)
        budget.check_args(kwargs.values())
        name = getattr(__obj, "__name__", "")
        if name in ("join", "fromkeys") and args:
            args = (materialize(args[0], budget),) + args[1:]
        if name == "striptags" and isinstance(getattr(__obj, "__self__", None), Markup) and not args and not kwargs:
            return _linear_striptags(str(__obj.__self__), budget)  # markupsafe's own loop is quadratic
        if __obj is _strftime_now and args:
            budget.reserve(32 * text_bound(args[0], budget) + 64)
        bound = method_bound(__obj, args, kwargs, budget)
        if bound is not None:
            budget.reserve(*bound)
        result = super().call(__context, __obj, *args, **kwargs)
        if bound is None:
            budget.reserve(units(result), 0)
        return budget.check_size(result)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(argument, slice) and isinstance(obj, (str, bytes, list, tuple)):
            budget = current()
            budget.tick()
            n = len(range(*argument.indices(len(obj))))
            budget.reserve(n * (1 if isinstance(obj, (str, bytes)) else REF), n)
        return super().getitem(obj, argument)

    def wrap_str_format(self, value: Any) -> Any:
        """Jinja's sandboxed str.format / format_map, with each field's size checked before it is formatted."""
        if getattr(value, "__name__", None) not in ("format", "format_map") or not isinstance(
            getattr(value, "__self__", None), str
        ):
            return None
        f_self = value.__self__
        is_map = value.__name__ == "format_map"
        env = self

        def wrapper(*args: Any, **kwargs: Any) -> str:
            budget = current()
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument and no keywords")
                kwargs, args = args[0], ()
            cls = BoundedEscapeFormatter if isinstance(f_self, Markup) else BoundedFormatter
            extra = {"escape": f_self.escape} if isinstance(f_self, Markup) else {}
            formatter = cls(env, budget, f_self, **extra)
            return type(f_self)(formatter.vformat(f_self, args, kwargs))

        return update_wrapper(wrapper, value)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # the default returns an Undefined that prints as "", hiding the attempt; refuse it instead
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _raise_exception(message: Any) -> None:
    raise TemplateError(f"template raised: {message}", kind="jinja")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' tojson: no HTML escaping (Jinja's own escapes <, >, &, ')."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Generation(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (marks assistant text for training masks):
    rendering keeps the body as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _make_env() -> _Env:
    env = _Env(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _Generation],
        autoescape=False,
        cache_size=64,
        finalize=_finalize,
    )
    for name in ("cycler", "joiner", "lipsum"):
        env.globals.pop(name, None)
    env.globals.update(
        {
            "raise_exception": _raise_exception,
            "strftime_now": _strftime_now,
            _ITER: _guard_iter,
            _CONCAT: _guard_concat,
            _DATA: _data,
            _SLICE: _guard_slice,
        }
    )
    env.filters["tojson"] = _tojson
    env.filters = {k: guard_filter(k, f) for k, f in env.filters.items()}
    return env


_ENV = _make_env()


class JinjaTemplate:
    """A compiled chat template; `render` is safe to call from several threads."""

    def __init__(self, source: str, *, max_source: int = MAX_SOURCE):
        if not isinstance(source, str):
            raise TemplateError(f"template must be a string, not {type(source).__name__}", kind="jinja")
        if len(source) > max_source:
            raise TemplateError(
                f"template is {len(source)} characters, more than the limit of {max_source}", kind="jinja"
            )
        self.source = source
        failure: tuple[str, int | None] | None = None
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            failure = (e.message or "syntax error", e.lineno)
        except RecursionError:
            failure = ("template nesting too deep", None)
        except MemoryError:
            failure = ("template too large to compile", None)
        except Exception as e:  # noqa: BLE001  Python's compiler refuses what Jinja accepts (25 nested for)
            failure = (f"template does not compile: {type(e).__name__}: {e}", None)
        if failure is not None:  # raised outside the except blocks: no traceback chain keeps the parse alive
            raise TemplateError(failure[0], line=failure[1], kind="jinja")

    def render(self, variables: dict[str, Any], limits: JinjaLimits = JinjaLimits()) -> str:
        budget, token = enter(limits)
        out: list[str] = []
        size = 0
        failure: tuple[str, int | None] | None = None
        gen = self._template.generate(**variables)
        try:
            for chunk in gen:
                size += len(chunk)
                if size > limits.max_output:
                    raise TemplateError(f"template output exceeds {limits.max_output} characters", kind="jinja")
                out.append(chunk)
                budget.tick()
        except TemplateError as e:
            failure = (e.msg, e.line)
            _scrub(e)
        except RecursionError as e:
            failure = ("template recursion too deep", None)
            _scrub(e)
        except MemoryError as e:
            failure = ("template ran out of memory", None)
            _scrub(e)
        except Exception as e:  # noqa: BLE001  any failure of untrusted template code is a template error
            failure = (f"{type(e).__name__}: {e}", _template_line(e))
            _scrub(e)
        finally:
            gen.close()
            leave(token)
        if failure is None:
            return "".join(out)
        del out, gen, variables  # the error's traceback holds this frame: it must not keep what the render built
        raise TemplateError(failure[0], line=failure[1], kind="jinja")


def _scrub(e: BaseException) -> None:
    """Drop the frames (and their locals) an exception and its chain hold."""
    seen = 0
    while e is not None and seen < 16:
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
        e.__traceback__ = None
        nxt = e.__context__ or e.__cause__
        e.__context__ = e.__cause__ = None
        e = nxt  # type: ignore[assignment]
        seen += 1


def _template_line(e: BaseException) -> int | None:
    """The template line of the innermost traceback frame that runs template code, if any (the frames are
    Jinja's generated Python; the template maps their lines back to its source)."""
    line = getattr(e, "lineno", None)
    tb = e.__traceback__
    while tb is not None:
        template = tb.tb_frame.f_globals.get("__jinja_template__")
        if template is not None:
            line = template.get_corresponding_lineno(tb.tb_lineno)
        tb = tb.tb_next
    return line
