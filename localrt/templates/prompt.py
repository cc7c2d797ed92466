"""Building the prompt for /api/chat and /api/generate the way Ollama does, for Go or Jinja templates.

- chat: the model's SYSTEM goes first unless the request starts with a system message; Modelfile MESSAGEs
  come before the request's; old messages are dropped to fit num_ctx (system messages and the latest message
  are always kept).
- generate: `raw` skips the template; `system` overrides the model's SYSTEM; `suffix` (fill-in-middle)
  needs a template that uses `.Suffix`; `context` text is put in front; `images` are refused (text only)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import InvalidRequest
from ._goexec import Limits
from ._ollama_data import check_message
from .errors import TemplateError
from .gotemplate import GoTemplate
from .harmony import is_harmony_source, reasoning_effort, render_think
from .jinja import JinjaLimits, JinjaTemplate
from .ollama_exec import execute

DEFAULT_TEMPLATE = "{{ .Prompt }}"  # Ollama's template for a model that has none

CountTokens = Callable[[str], int]


class GoChatTemplate:
    kind = "go"

    def __init__(self, source: str, limits: Limits = Limits()):
        self.template = GoTemplate(source, add_response=True)
        self.source = source
        self.limits = limits
        self.supports_tools = self.template.uses("tools")
        self.supports_insert = self.template.uses("suffix")
        self.harmony = is_harmony_source(source)  # gpt-oss: a request without think is sent true, as Ollama does

    def render(self, messages: list[dict], tools: list | None = None, think: bool | str | None = None) -> str:
        """`messages` in Ollama's wire shape (checked here)."""
        think = render_think(think) if self.harmony else think
        return execute(self.template, check_messages(messages), tools=tools, think=think, limits=self.limits)

    def render_insert(self, prompt: str, suffix: str, think: bool | str | None = None) -> str:
        return execute(self.template, [], prompt=prompt, suffix=suffix, think=think, limits=self.limits)


class JinjaChatTemplate:
    """A GGUF chat template. A leading BOS in the output is dropped when the tokenizer adds BOS itself
    (`strip_bos`), so the prompt does not start with two."""

    kind = "jinja"

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        strip_bos: bool = False,
        limits: JinjaLimits = JinjaLimits(),
    ):
        self.template = JinjaTemplate(source)
        self.source = source
        self.bos_token, self.eos_token, self.strip_bos = bos_token, eos_token, strip_bos
        self.limits = limits
        self.supports_tools = "tools" in source
        self.supports_insert = False
        self.harmony = is_harmony_source(source)  # gpt-oss: `reasoning_effort`, and a turn's `thinking` by that name

    def render(self, messages: list[dict], tools: list | None = None, think: bool | str | None = None) -> str:
        """`messages` in Ollama's wire shape (checked here), handed to the template in HF's shape."""
        variables: dict[str, Any] = {
            "messages": [_hf_message(m, self.harmony) for m in check_messages(messages)],
            "tools": tools or None,
            "add_generation_prompt": True,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        if think is not None:
            variables["enable_thinking"] = bool(think)
        effort = reasoning_effort(think) if self.harmony else None
        if effort is not None:
            variables["reasoning_effort"] = effort
        text = self.template.render(variables, self.limits)
        if self.strip_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        return text

    def render_insert(self, prompt: str, suffix: str, think: bool | str | None = None) -> str:
        raise InvalidRequest("model does not support insert")


ChatTemplate = GoChatTemplate | JinjaChatTemplate


@functools.lru_cache(maxsize=64)
def load_template(
    source: str, kind: str, bos_token: str = "", eos_token: str = "", strip_bos: bool = False
) -> ChatTemplate:
    """Parse once per distinct template (parsing is the expensive part; rendering is per request).
    `strip_bos`: the tokenizer adds BOS itself, so a BOS the Jinja template writes first is dropped."""
    if kind == "go":
        return GoChatTemplate(source)
    if kind == "jinja":
        return JinjaChatTemplate(source, bos_token=bos_token, eos_token=eos_token, strip_bos=strip_bos)
    raise TemplateError(f"unknown template kind {kind!r}", kind=str(kind))


def _hf_message(m: dict, harmony: bool = False) -> dict:
    """A checked wire message in the shape HF chat templates read; a harmony template reads a turn's reasoning as
    `thinking` (llama.cpp copies `reasoning_content` there for gpt-oss)."""
    out: dict[str, Any] = {"role": m["role"], "content": m["content"]}
    if m["tool_calls"]:
        out["tool_calls"] = [
            {
                "type": "function",
                **({"id": c["id"]} if c["id"] else {}),
                "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
            }
            for c in m["tool_calls"]
        ]
    if m["tool_call_id"]:
        out["tool_call_id"] = m["tool_call_id"]
    if m["tool_name"]:
        out["name"] = m["tool_name"]
    if m["thinking"]:
        out["reasoning_content"] = m["thinking"]
        if harmony:
            out["thinking"] = m["thinking"]
    return out


def check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise InvalidRequest("messages must be a list")
    checked = [check_message(m, i) for i, m in enumerate(messages)]
    for i, m in enumerate(checked):
        if m["images"]:
            raise InvalidRequest(f"messages[{i}] has images, but this model does not support images")
    return checked


def chat_messages(messages: Any, model_system: str = "", model_messages: Sequence[dict] = ()) -> list[dict]:
    """Ollama's chat history: Modelfile MESSAGEs, then the request's; the model's SYSTEM in front unless
    the request's first message is a system message."""
    request = check_messages(messages)
    out = check_messages(list(model_messages)) + request
    if model_system and (not request or request[0]["role"] != "system"):
        out.insert(0, {**check_message({"role": "system", "content": model_system}, 0)})
    return out


@dataclass(frozen=True)
class Prompt:
    text: str
    n_tokens: int | None  # as counted while fitting num_ctx (None when not counted)
    n_dropped: int  # messages left out to fit num_ctx


def fit_messages(
    template: ChatTemplate,
    messages: list[dict],
    *,
    tools: list | None = None,
    think: bool | str | None = None,
    num_ctx: int | None = None,
    count_tokens: CountTokens | None = None,
    truncate: bool = True,
) -> Prompt:
    """Render `messages` (checked), dropping the oldest non-system messages until the prompt fits
    `num_ctx` tokens by `count_tokens`. The latest message is never dropped: if even it alone does not fit,
    the prompt with just it (and the system messages) is returned and `n_tokens` says how long it is."""
    if not messages or not truncate or num_ctx is None or count_tokens is None:
        text = template.render(messages, tools, think)
        return Prompt(text, count_tokens(text) if count_tokens else None, 0)
    cache: dict[int, tuple[str, int]] = {}

    def attempt(start: int) -> tuple[str, int]:
        if start not in cache:
            kept = [m for m in messages[:start] if m["role"] == "system"] + messages[start:]
            text = template.render(kept, tools, think)
            cache[start] = (text, count_tokens(text))
        return cache[start]

    last = len(messages) - 1
    if attempt(0)[1] <= num_ctx:
        return Prompt(*attempt(0), 0)
    # the prompt shrinks as the start moves right, so the first start that fits is found by bisection
    lo, hi = 1, last
    while lo < hi:
        mid = (lo + hi) // 2
        if attempt(mid)[1] <= num_ctx:
            hi = mid
        else:
            lo = mid + 1
    start = lo if last >= 1 else 0
    dropped = sum(1 for m in messages[:start] if m["role"] != "system")
    return Prompt(*attempt(start), dropped)


def chat_prompt(
    template: ChatTemplate,
    messages: Any,
    *,
    model_system: str = "",
    model_messages: Sequence[dict] = (),
    tools: list | None = None,
    think: bool | str | None = None,
    num_ctx: int | None = None,
    count_tokens: CountTokens | None = None,
    truncate: bool = True,
) -> Prompt:
    """The prompt for /api/chat."""
    if tools and not template.supports_tools:
        raise InvalidRequest("model does not support tools")
    history = chat_messages(messages, model_system, model_messages)
    return fit_messages(
        template, history, tools=tools, think=think, num_ctx=num_ctx, count_tokens=count_tokens, truncate=truncate
    )


def generate_prompt(
    template: ChatTemplate | None,
    prompt: str,
    *,
    system: str = "",
    model_system: str = "",
    model_messages: Sequence[dict] = (),
    suffix: str = "",
    raw: bool = False,
    template_override: str = "",
    images: Sequence[Any] | None = None,
    context_text: str = "",
    has_context: bool = False,
    think: bool | str | None = None,
    num_ctx: int | None = None,
    count_tokens: CountTokens | None = None,
    truncate: bool = True,
) -> Prompt:
    """The prompt for /api/generate. `context_text` is the detokenized `context` of an earlier reply
    (`has_context` says the field was given, even if empty)."""
    if raw and (template_override or system or has_context):
        raise InvalidRequest("raw mode does not support template, system, or context")
    if images:
        raise InvalidRequest("images are not supported: this model has no vision projector")
    if raw:
        return Prompt(prompt, None, 0)
    tmpl = GoChatTemplate(template_override) if template_override else template
    tmpl = tmpl or load_template(DEFAULT_TEMPLATE, "go")
    if suffix:
        if not tmpl.supports_insert:
            raise InvalidRequest("model does not support insert")
        # Ollama fills in the middle only with both parts; an empty prompt renders with no messages
        text = tmpl.render_insert(prompt, suffix, think) if prompt else tmpl.render([], None, think)
        return Prompt(context_text + text, None, 0)
    msgs: list[dict] = []
    if system or model_system:
        msgs.append({"role": "system", "content": system or model_system})
    if not has_context:
        msgs.extend(model_messages)
    msgs.append({"role": "user", "content": prompt})
    checked = check_messages(msgs)
    if template_override:
        return Prompt(context_text + tmpl.render(checked, None, think), None, 0)
    fitted = fit_messages(tmpl, checked, think=think, num_ctx=num_ctx, count_tokens=count_tokens, truncate=truncate)
    return Prompt(context_text + fitted.text, fitted.n_tokens, fitted.n_dropped)


def render_prompt(
    template_source: str,
    kind: str,
    messages: Any,
    system: str = "",
    tools: list | None = None,
    *,
    think: bool | str | None = None,
    bos_token: str = "",
    eos_token: str = "",
    strip_bos: bool = False,
    model_messages: Sequence[dict] = (),
) -> str:
    """One-call form: the chat prompt for `messages` with the model's SYSTEM `system`, no truncation."""
    template = load_template(template_source, kind, bos_token, eos_token, strip_bos)
    return chat_prompt(
        template, messages, model_system=system, model_messages=model_messages, tools=tools, think=think
    ).text
