"""The built-in models: created offline, through the ordinary create() path, from the GGUF files that the
installed PyPI packages carry, the first time they are asked for.

`smollm2:135m` (SmolLM2-135M-Instruct, ChatML) and `gemma3:270m` (Gemma 3 270M, Gemma turns). The bare
names `smollm2` and `gemma3` (tag `latest`) resolve to them as well: they are the only sizes available
offline. Each gets a Go TEMPLATE equivalent to the model's Hugging Face chat template, its end-of-turn
stop strings, and the sampling defaults its authors recommend."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import store as st

from . import builtin_models
from .create import create

# ChatML over .Messages. A model SYSTEM reaches the template as a leading system message (Ollama inserts it
# when the request has none), which reproduces the GGUF's own template and its default system prompt.
CHATML_TEMPLATE = """{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Gemma 3 turns: the assistant speaks as "model"; a leading system message is put in front of the first
# user turn, separated by a blank line (Gemma has no system role), as the Hugging Face template does.
GEMMA3_TEMPLATE = """{{- range $i, $m := .Messages }}
{{- if eq $m.Role "user" }}<start_of_turn>user
{{ if and (eq $i 1) (eq (index $.Messages 0).Role "system") }}{{ (index $.Messages 0).Content }}

{{ end }}{{ $m.Content }}<end_of_turn>
{{ else if eq $m.Role "assistant" }}<start_of_turn>model
{{ $m.Content }}<end_of_turn>
{{ end }}
{{- end }}<start_of_turn>model
"""


@dataclass(frozen=True)
class Builtin:
    name: str  # canonical display name, e.g. "smollm2:135m"
    gguf_path: Callable[[], object]
    template: str
    system: str | None
    params: tuple[tuple[str, object], ...]  # list values are repeated PARAMETER lines
    license: str

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
            template=CHATML_TEMPLATE,
            system=SMOLLM2_SYSTEM,
            # The SmolLM2-Instruct model card samples with temperature 0.2, top_p 0.9.
            params=(("stop", ["<|im_start|>", "<|im_end|>"]), ("temperature", 0.2), ("top_p", 0.9)),
            license="Apache License 2.0 (SmolLM2 by Hugging Face)",
        ),
        Builtin(
            name="gemma3:270m",
            gguf_path=builtin_models.gemma3_path,
            template=GEMMA3_TEMPLATE,
            system=None,
            # Google's recommended sampling for Gemma 3, as Ollama's library ships it.
            params=(("stop", ["<end_of_turn>"]), ("temperature", 1.0), ("top_k", 64), ("top_p", 0.95)),
            license="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        ),
    )
}
# Bare names (tag latest) -> the only built-in size.
ALIASES = {"smollm2:latest": "smollm2:135m", "gemma3:latest": "gemma3:270m"}

_locks: dict[str, threading.Lock] = {name: threading.Lock() for name in BUILTINS}


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


def ensure_builtin(store: st.Store, name: str) -> bool:
    """Make sure built-in model `name` is in the store, creating it from the installed package if needed.

    Returns False when `name` is not a built-in (nothing done), True when it is stored afterwards. Raises
    builtin_models.BuiltinModelMissing when its PyPI package is not installed."""
    spec = builtin_for(name)
    if spec is None:
        return False
    requested = st.names.parse(name)
    with _locks[spec.name]:
        if store.exists(requested):
            return True
        if not store.exists(spec.name):
            for _ in create(store, spec.name, spec.modelfile(str(spec.gguf_path()))):
                pass
        if not requested.equal_fold(st.names.parse(spec.name)):
            store.copy(spec.name, requested)
    return True


def model_record(store: st.Store, name: str) -> st.ModelRecord:
    """`store.model_record(name)`, creating a built-in model first if that is what `name` refers to.
    Raises store.ManifestNotFound for an unknown model, store.InvalidName for a bad name."""
    try:
        return store.model_record(name)
    except st.ManifestNotFound:
        if not ensure_builtin(store, name):
            raise
    return store.model_record(name)
