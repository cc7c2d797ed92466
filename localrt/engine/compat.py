"""Parts of a model file this runtime loads past: Ollama's multimodal library files.

Ollama's own converter writes the vision tower and its projector into the text model's GGUF (gemma3: tensors
`v.*` such as `v.blk.0.attn_q.weight` and `mm.*` such as `mm.mm_input_projection.weight`, metadata
`gemma3.vision.*` and `gemma3.mm.tokens_per_image`), where llama.cpp keeps them in a separate mmproj file and its
text model never looks them up. This runtime runs the text model only: those tensors are set aside before the
validator, the private copy of the weights and the memory estimate see the file, so the model is exactly the one
a text-only file of the same weights gives, and the load says so once. `show` does not claim `vision`.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TypeVar

log = logging.getLogger("localrt.engine")

# the tower (Ollama's and llama.cpp's mmproj names) and the projector; no architecture here has a tensor named so
VISION_PREFIXES = ("v.", "mm.")

T = TypeVar("T")


def text_tensors(tensors: Mapping[str, T]) -> dict[str, T]:
    """The tensors the text model may use: all but the vision tower's and projector's."""
    return {name: t for name, t in tensors.items() if not name.startswith(VISION_PREFIXES)}


def text_model_tensors(metadata: Mapping, tensors: Mapping[str, T]) -> dict[str, T]:
    """text_tensors, and one log line when there were others (the loader's call: once per load)."""
    kept = text_tensors(tensors)
    if len(kept) != len(tensors):
        arch = metadata.get("general.architecture") or "model"
        log.warning("%s: %d vision tensors ignored: this runtime runs the text model only", arch,
                    len(tensors) - len(kept))
    return kept
