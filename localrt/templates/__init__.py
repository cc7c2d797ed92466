"""Chat templates: Go text/template (Ollama Modelfiles), Jinja (GGUF `tokenizer.chat_template`), prompt
building for generate/chat, and the choice of template in effect for a model.

Typical use: `choice = choose_template(metadata, modelfile_template)`; `template = choice.load()`;
`chat_prompt(template, messages, model_system=..., tools=..., num_ctx=..., count_tokens=...)` or
`generate_prompt(template, prompt, system=..., suffix=..., raw=...)`."""

from __future__ import annotations

from .builtin import FAMILIES, TemplateChoice, choose_template
from .capabilities import capabilities, tool_call_tag
from .errors import TemplateError
from .gotemplate import GoTemplate, Limits
from .harmony import HarmonyParser, is_harmony
from .jinja import JinjaLimits, JinjaTemplate
from .prompt import (
    ChatTemplate,
    GoChatTemplate,
    JinjaChatTemplate,
    Prompt,
    chat_messages,
    chat_prompt,
    fit_messages,
    generate_prompt,
    load_template,
    render_prompt,
)
from .thinking import ThinkingParser, opens_reasoning, thinking_tags

__all__ = [
    "FAMILIES",
    "ChatTemplate",
    "GoChatTemplate",
    "GoTemplate",
    "JinjaChatTemplate",
    "JinjaLimits",
    "JinjaTemplate",
    "Limits",
    "Prompt",
    "TemplateChoice",
    "TemplateError",
    "capabilities",
    "chat_messages",
    "chat_prompt",
    "choose_template",
    "fit_messages",
    "generate_prompt",
    "load_template",
    "render_prompt",
    "tool_call_tag",
    "ThinkingParser",
    "opens_reasoning",
    "thinking_tags",
    "HarmonyParser",
    "is_harmony",
]
