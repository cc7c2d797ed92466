"""Which chat template is in effect for a model, and why, plus default stop strings per template family.

Order: a Modelfile TEMPLATE (Go) > the GGUF's `tokenizer.chat_template` (Jinja) > a built-in Go template for
the model family (Gemma 3 ships none in its GGUF) > Ollama's plain `{{ .Prompt }}`."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Mapping

from .errors import TemplateError
from .jinja import JinjaTemplate
from .prompt import DEFAULT_TEMPLATE, ChatTemplate, load_template

CHATML = """{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""

LLAMA3 = """{{- if .System }}<|start_header_id|>system<|end_header_id|>

{{ .System }}<|eot_id|>
{{- end }}
{{- range .Messages }}{{ if ne .Role "system" }}<|start_header_id|>{{ .Role }}<|end_header_id|>

{{ .Content }}<|eot_id|>{{ end }}{{ end }}<|start_header_id|>assistant<|end_header_id|>

"""

# Gemma has no system turn: the system text opens the first user turn
GEMMA3 = """{{- $sys := .System }}
{{- range .Messages }}
{{- if eq .Role "user" }}<start_of_turn>user
{{ if $sys }}{{ $sys }}

{{ $sys = "" }}{{ end }}{{ .Content }}<end_of_turn>
{{ else if eq .Role "assistant" }}<start_of_turn>model
{{ .Content }}<end_of_turn>
{{ end }}
{{- end }}<start_of_turn>model
"""

GEMMA = """{{- $sys := .System }}
{{- range .Messages }}
{{- if eq .Role "user" }}<start_of_turn>user
{{ if $sys }}{{ $sys }}
{{ $sys = "" }}{{ end }}{{ .Content }}<end_of_turn>
{{ else if eq .Role "assistant" }}<start_of_turn>model
{{ .Content }}<end_of_turn>
{{ end }}
{{- end }}<start_of_turn>model
"""

MISTRAL = """{{- $sys := .System }}
{{- range .Messages }}
{{- if eq .Role "user" }}[INST] {{ if $sys }}{{ $sys }}

{{ $sys = "" }}{{ end }}{{ .Content }}[/INST]
{{- else if eq .Role "assistant" }} {{ .Content }}</s>
{{- end }}
{{- end }}"""

PHI3 = """{{- range .Messages }}<|{{ .Role }}|>
{{ .Content }}<|end|>
{{ end }}<|assistant|>
"""


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    stop: tuple[str, ...]
    marker: str  # a special token whose presence in the vocabulary or template identifies the family


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("chatml", CHATML, ("<|im_start|>", "<|im_end|>"), "<|im_start|>"),
        Family("llama3", LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "<|start_header_id|>"),
        Family("gemma3", GEMMA3, ("<end_of_turn>",), "<start_of_turn>"),
        Family("gemma", GEMMA, ("<start_of_turn>", "<end_of_turn>"), "<start_of_turn>"),
        Family("mistral", MISTRAL, ("[INST]", "[/INST]"), "[INST]"),
        Family("phi3", PHI3, ("<|end|>", "<|system|>", "<|user|>", "<|assistant|>"), "<|assistant|>"),
    )
}
_ARCH_FAMILY = {
    "gemma3": "gemma3",
    "gemma3n": "gemma3",
    "gemma2": "gemma",
    "gemma": "gemma",
    "phi3": "phi3",
    "qwen2": "chatml",
    "qwen2moe": "chatml",
    "qwen3": "chatml",
}
_MARKER_ORDER = ("llama3", "chatml", "gemma", "phi3", "mistral")  # how markers are tried in vocab or text


@dataclass(frozen=True)
class TemplateChoice:
    kind: str  # "go" or "jinja"
    source: str
    origin: str  # "modelfile", "gguf", "builtin:<family>" or "default"
    reason: str  # one sentence for `show`
    stop: tuple[str, ...]  # default stop strings of the template's family (merge with PARAMETER stop)
    bos_token: str = ""
    eos_token: str = ""
    strip_bos: bool = False  # the tokenizer adds BOS, so a Jinja template's own leading BOS is dropped

    def load(self) -> ChatTemplate:
        return load_template(self.source, self.kind, self.bos_token, self.eos_token, self.strip_bos)


def family_of_text(text: str) -> Family | None:
    """The family whose turn marker a template text uses (for stop strings of Modelfile/GGUF templates)."""
    for name in _MARKER_ORDER:
        if FAMILIES[name].marker in text:
            return FAMILIES[name]
    return None


def builtin_family(metadata: Mapping[str, Any]) -> tuple[Family | None, str]:
    """The built-in family for a GGUF without a chat template: by architecture, then by special tokens."""
    arch = str(metadata.get("general.architecture", ""))
    if arch in _ARCH_FAMILY:
        return FAMILIES[_ARCH_FAMILY[arch]], f"architecture {arch!r}"
    tokens = _tokens(metadata)
    vocab = set(tokens) if tokens is not None else set()
    for name in _MARKER_ORDER:
        if FAMILIES[name].marker in vocab:
            return FAMILIES[name], f"vocabulary has {FAMILIES[name].marker}"
    return None, f"architecture {arch!r} and its vocabulary match no known chat format"


def _tokens(metadata: Mapping[str, Any]) -> Sequence[str] | None:
    """tokenizer.ggml.tokens: a list of str, or the loader's gguf_io.StringArray over the mapped file."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    return tokens if isinstance(tokens, Sequence) and not isinstance(tokens, (str, bytes)) else None


def _special(metadata: Mapping[str, Any], key: str) -> str:
    tokens = _tokens(metadata)
    idx = metadata.get(key)
    if tokens is not None and isinstance(idx, int) and 0 <= idx < len(tokens):
        return tokens[idx]
    return ""


def _adds_bos(metadata: Mapping[str, Any]) -> bool:
    """Whether tokenizing the prompt adds BOS (llama.cpp's default is on for SentencePiece vocabularies)."""
    flag = metadata.get("tokenizer.ggml.add_bos_token")
    if isinstance(flag, bool):
        return flag
    return metadata.get("tokenizer.ggml.model") == "llama"


def choose_template(metadata: Mapping[str, Any], modelfile_template: str | None = None) -> TemplateChoice:
    """The template in effect for a model, which one and why. A Modelfile template that does not parse is
    an error (the user wrote it); a GGUF template Jinja cannot compile is skipped, and `reason` says so."""
    if modelfile_template:
        load_template(modelfile_template, "go")  # raises TemplateError with a position if it does not parse
        fam = family_of_text(modelfile_template)
        return TemplateChoice(
            "go", modelfile_template, "modelfile", "TEMPLATE from the Modelfile", fam.stop if fam else ()
        )
    skipped = ""
    gguf = metadata.get("tokenizer.chat_template")
    if isinstance(gguf, str) and gguf.strip():
        try:
            JinjaTemplate(gguf)
        except TemplateError as e:
            skipped = f" (the GGUF chat template was rejected: {e.msg})"
        else:
            fam = family_of_text(gguf)
            return TemplateChoice(
                "jinja",
                gguf,
                "gguf",
                "tokenizer.chat_template from the GGUF file",
                fam.stop if fam else (),
                _special(metadata, "tokenizer.ggml.bos_token_id"),
                _special(metadata, "tokenizer.ggml.eos_token_id"),
                _adds_bos(metadata),
            )
    fam, why = builtin_family(metadata)
    if fam is not None:
        return TemplateChoice(
            "go",
            fam.template,
            f"builtin:{fam.name}",
            f"no template in the Modelfile or GGUF; built-in {fam.name} template ({why}){skipped}",
            fam.stop,
        )
    return TemplateChoice(
        "go",
        DEFAULT_TEMPLATE,
        "default",
        f"no template in the Modelfile or GGUF and {why}: the prompt is passed as is{skipped}",
        (),
    )
