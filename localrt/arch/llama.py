"""llama (also SmolLM2 and Mistral 7B-type files): RMSNorm, NORMAL rope, SwiGLU, GQA, optional biases.

GGUF llama q/k rows are already permuted by the converter for NORMAL (adjacent-pair) rope.
"""
from __future__ import annotations

import numpy as np

from simd_kernels import ops

from .common import Batch, TensorSource, Weights, attention, gated_ffn, load_common, load_layer


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, lambda il: load_layer(cfg, src, il))


def forward(be, cfg, w: Weights, batch: Batch, cache) -> np.ndarray:
    """Final-normed hidden states (n_tok, n_embd) of the batch; stores its keys in the cache."""
    x = be.embed(w.token_embd, batch.tokens)  # (n_tok, n_embd) residual stream
    h = np.empty_like(x)  # (n_tok, n_embd) normed input of the next sub-block
    ops.rms_norm(x, w.layers[0].attn_norm, cfg.rms_eps, h)
    for il, L in enumerate(w.layers):
        a = attention(be, cfg, w, L, il, h, batch, cache, cfg.rope_base, cfg.rope_freq_scale)
        ops.add_rms_norm(x, a, L.ffn_norm, cfg.rms_eps, h)
        f = gated_ffn(be, L, h, ops.swiglu)
        next_norm = w.layers[il + 1].attn_norm if il + 1 < cfg.n_layer else w.output_norm
        ops.add_rms_norm(x, f, next_norm, cfg.rms_eps, h)
    return h
