"""qwen3: the qwen2 graph without q/k/v biases, with per-head RMS norms of q and k (`attn_q_norm`, `attn_k_norm`)
applied before NEOX rope."""

from __future__ import annotations

from simd_kernels import ops

from .common import TensorSource, Weights, block_tensors, load_common
from .llama import forward

__all__ = ["BLOCK", "GLOBALS", "ROPE_MODE", "load", "forward"]


ROPE_MODE = ops.ROPE_NEOX
BLOCK = block_tensors(qk_norm=True)  # q/k/v biases are read when present, as llama.cpp does
GLOBALS = {
    "token_embd.weight": (("n_vocab", "n_embd"), True),
    "output_norm.weight": (("n_embd",), True),
    "output.weight": (("n_vocab", "n_embd"), False),  # absent: tied to token_embd
}  # no rope_freqs: llama.cpp's qwen3 graph rotates without factors


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, BLOCK, GLOBALS)
