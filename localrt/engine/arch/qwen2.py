"""qwen2: the llama graph with q/k/v biases and NEOX rope (no q/k permutation in the converter)."""

from __future__ import annotations

from simd_kernels import ops

from .common import TensorSource, Weights, block_tensors, load_common
from .llama import forward

__all__ = ["BLOCK", "ROPE_MODE", "load", "forward"]


ROPE_MODE = ops.ROPE_NEOX
BLOCK = block_tensors(biases=True)


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, BLOCK)
