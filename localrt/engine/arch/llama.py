"""llama (also SmolLM2 and Mistral 7B-type files): RMSNorm, NORMAL rope, SwiGLU, GQA, optional biases.

GGUF llama q/k rows are already permuted by the converter for NORMAL (adjacent-pair) rope.
"""

from __future__ import annotations

import numpy as np

from simd_kernels import ops

from .common import (
    Batch,
    TensorSource,
    Weights,
    add_norm_next,
    attention,
    block_tensors,
    cross,
    gated_ffn,
    layer_devices,
    load_common,
)
from .moe import moe_ffn


ROPE_MODE = ops.ROPE_NORMAL
BLOCK = block_tensors()  # q/k/v biases are read when present


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, BLOCK)


def forward(be, cfg, w: Weights, batch: Batch, cache) -> np.ndarray:
    """Final-normed hidden states (n_tok, n_embd) of the batch; stores its keys in the cache."""
    devs = layer_devices(be, w)
    x = cross(be.embed(w.token_embd, batch.tokens), be, devs[0])  # (n_tok, n_embd) residual stream
    h = devs[0].xp.empty_like(x)  # (n_tok, n_embd) normed input of the next sub-block
    devs[0].ops.rms_norm(x, w.layers[0].attn_norm, cfg.rms_eps, h)
    for il, L in enumerate(w.layers):
        dev = devs[il]
        a = attention(dev, cfg, w, L, il, h, batch, cache, cfg.rope_base, cfg.rope_freq_scale)
        dev.ops.add_rms_norm(x, a, L.ffn_norm, cfg.rms_eps, h)
        f = moe_ffn(dev, cfg, L, h) if L.ffn_gate_inp is not None else gated_ffn(dev, L, h, dev.ops.swiglu)
        next_norm = w.layers[il + 1].attn_norm if il + 1 < cfg.n_layer else w.output_norm
        x, h = add_norm_next(dev, devs[il + 1], x, f, next_norm, cfg.rms_eps, h)
    return h  # on the output layer's device
