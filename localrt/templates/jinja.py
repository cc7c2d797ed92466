"""HF-style Jinja chat templates (a GGUF's `tokenizer.chat_template`), rendered in Jinja's immutable sandbox
with a source-size cap, an output-size cap, a loop/call budget and a wall-clock limit.

Semantics follow transformers' `apply_chat_template`: `messages`, `tools`, `add_generation_prompt`,
`bos_token`, `eos_token`, `raise_exception`, `strftime_now`, `tojson` (no HTML escaping), `trim_blocks` and
`lstrip_blocks`, loop controls. Any failure, including a sandbox violation, is a TemplateError."""
from __future__ import annotations

import contextvars
import datetime
import json
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from .errors import TemplateError

MAX_SOURCE = 256 * 1024      # characters; the largest real chat templates are tens of KiB
MAX_INT_BITS = 4096          # integers a template may build (stops 9**9**9 and repeated squaring)
_ITER = "__localrt_iter"     # global that every {% for %} iterable is routed through
_CONCAT = "__localrt_concat"  # global that every `~` concatenation is routed through


@dataclass(frozen=True)
class JinjaLimits:
    max_output: int = 8 << 20       # characters of output, and of any one string or list built on the way
    max_steps: int = 2_000_000      # loop iterations + calls + guarded operations per render
    timeout_s: float = 5.0          # wall-clock limit of one render


class _Budget:
    def __init__(self, limits: JinjaLimits):
        self.limits = limits
        self.steps = 0
        self.deadline = time.monotonic() + limits.timeout_s

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self.limits.max_steps:
            raise TemplateError(f"template exceeds {self.limits.max_steps} steps", kind="jinja")
        if self.steps & 255 == 0 and time.monotonic() > self.deadline:
            raise TemplateError(f"template rendering exceeds {self.limits.timeout_s:g} s", kind="jinja")

    def check_size(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple)) and len(value) > self.limits.max_output:
            raise TemplateError(f"template builds a value longer than {self.limits.max_output}", kind="jinja")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise TemplateError("template builds an integer that is too large", kind="jinja")
        return value

    def check_args(self, args: Iterable[Any]) -> None:
        """Integer arguments (widths, counts) large enough to build an oversized value are refused up front."""
        for a in args:
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.limits.max_output:
                raise TemplateError(f"template argument {a} is out of bounds", kind="jinja")


_budget: contextvars.ContextVar[_Budget] = contextvars.ContextVar("localrt_jinja_budget")


def _current() -> _Budget:
    try:
        return _budget.get()
    except LookupError:
        raise TemplateError("template rendered outside render_jinja", kind="jinja") from None


def _guard_iter(iterable: Any) -> Iterator[Any]:
    budget = _current()
    for item in iterable:
        budget.tick()
        yield item


def _guard_concat(*parts: Any) -> str:
    budget = _current()
    budget.tick()
    return budget.check_size("".join(map(str, parts)))


class _Guards(NodeTransformer):
    """Routes every for-loop iterable and every `~` through the budget (neither reaches a sandbox hook)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name(_ITER, "load"), [node.iter], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.Name(_CONCAT, "load"), node.nodes, [], None, None, lineno=node.lineno)


def _amplifies(obj: Any, args: tuple, budget: _Budget) -> None:
    """Refuse str.replace calls whose result could exceed the output cap before Python builds it."""
    if getattr(obj, "__name__", None) == "replace" and isinstance(getattr(obj, "__self__", None), str):
        s = obj.__self__
        if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            worst = len(s) + (len(s) // max(1, len(args[0])) + 1) * len(args[1])
            if worst > budget.limits.max_output:
                raise TemplateError("template builds a value that is too long", kind="jinja")


def _repeat_size(left: Any, right: Any) -> int:
    """Length of `seq * n` (either order), or 0 when the operands are not a sequence and a count."""
    seq, n = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
        return len(seq) * max(n, 0)
    return 0


class _Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        tree = _Guards().visit(tree)
        tree.set_environment(self)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _current()
        budget.tick()
        if operator == "**" and isinstance(right, int) and abs(right) > 64 and not isinstance(left, float):
            raise TemplateError("template exponent is too large", kind="jinja")
        if operator == "*" and _repeat_size(left, right) > budget.limits.max_output:
            raise TemplateError("template builds a value that is too long", kind="jinja")
        if operator == "%" and isinstance(left, str):
            raise TemplateError("printf-style string formatting is not allowed in templates", kind="jinja")
        return budget.check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _current()
        budget.tick()
        budget.check_args(args)
        budget.check_args(kwargs.values())
        _amplifies(__obj, args, budget)
        return budget.check_size(super().call(__context, __obj, *args, **kwargs))

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # the default returns an Undefined that prints as "", hiding the attempt; refuse it instead
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _raise_exception(message: Any) -> None:
    raise TemplateError(f"template raised: {message}", kind="jinja")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' tojson: no HTML escaping (Jinja's own escapes <, >, &, ')."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Generation(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (marks assistant text for training masks):
    rendering keeps the body as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _guarded_filter(fn: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        budget = _current()
        budget.tick()
        budget.check_args(args[1:])
        budget.check_args(kwargs.values())
        return budget.check_size(fn(*args, **kwargs))

    # keep Jinja's pass_context/pass_environment markers so filters get their arguments
    for marker in ("jinja_pass_arg",):
        if hasattr(fn, marker):
            setattr(run, marker, getattr(fn, marker))
    return run


def _make_env() -> _Env:
    env = _Env(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _Generation],
               autoescape=False, cache_size=64)
    for name in ("cycler", "joiner", "lipsum"):
        env.globals.pop(name, None)
    env.globals.update({"raise_exception": _raise_exception, "strftime_now": _strftime_now,
                        _ITER: _guard_iter, _CONCAT: _guard_concat})
    env.filters["tojson"] = _tojson
    env.filters = {k: _guarded_filter(f) for k, f in env.filters.items()}
    return env


_ENV = _make_env()


class JinjaTemplate:
    """A compiled chat template; `render` is safe to call from several threads."""

    def __init__(self, source: str, *, max_source: int = MAX_SOURCE):
        if not isinstance(source, str):
            raise TemplateError(f"template must be a string, not {type(source).__name__}", kind="jinja")
        if len(source) > max_source:
            raise TemplateError(f"template is {len(source)} characters, more than the limit of {max_source}",
                                kind="jinja")
        self.source = source
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(e.message or "syntax error", line=e.lineno, col=None, kind="jinja") from None
        except RecursionError:
            raise TemplateError("template nesting too deep", kind="jinja") from None

    def render(self, variables: dict[str, Any], limits: JinjaLimits = JinjaLimits()) -> str:
        budget = _Budget(limits)
        token = _budget.set(budget)
        out: list[str] = []
        size = 0
        try:
            for chunk in self._template.generate(**variables):
                size += len(chunk)
                if size > limits.max_output:
                    raise TemplateError(f"template output exceeds {limits.max_output} characters", kind="jinja")
                out.append(chunk)
                budget.tick()
        except TemplateError:
            raise
        except RecursionError:
            raise TemplateError("template recursion too deep", kind="jinja") from None
        except MemoryError:
            raise TemplateError("template ran out of memory", kind="jinja") from None
        except Exception as e:  # noqa: BLE001  any failure of untrusted template code is a template error
            raise TemplateError(f"{type(e).__name__}: {e}", line=_template_line(e), kind="jinja") from None
        finally:
            _budget.reset(token)
        return "".join(out)


def _template_line(e: BaseException) -> int | None:
    """The template line of the innermost traceback frame that belongs to the template, if any."""
    line = getattr(e, "lineno", None)
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
