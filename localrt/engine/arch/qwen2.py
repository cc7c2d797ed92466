"""qwen2: the llama graph with q/k/v biases and NEOX rope (no q/k permutation in the converter)."""
from __future__ import annotations

from .common import TensorSource, Weights, load_common, load_layer
from .llama import forward

__all__ = ["load", "forward"]


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, lambda il: load_layer(cfg, src, il, biases=True))
