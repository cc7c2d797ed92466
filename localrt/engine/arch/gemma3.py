"""gemma3: scaled embedding, q/k norms, sandwich norms, GELU-tanh gated FFN, local/global layers.

Norm weights in the file already include Gemma's +1. Local (sliding-window) layers use rope base
`rope_base_swa` and scale `rope_freq_scale_swa` (gemma3: none); global layers use the file's base and scaling.
gemma2 runs this same forward (its layers have no q/k norms; its soft-capping is in the config).
"""

from __future__ import annotations

import numpy as np

from simd_kernels import ops

from .common import (
    Batch,
    TensorSource,
    Weights,
    attention,
    block_tensors,
    cross,
    gated_ffn,
    layer_devices,
    load_common,
)


ROPE_MODE = ops.ROPE_NEOX
BLOCK = block_tensors(qk_norm=True, sandwich=True)


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, BLOCK)


def forward(be, cfg, w: Weights, batch: Batch, cache) -> np.ndarray:
    """Final-normed hidden states (n_tok, n_embd) of the batch; stores its keys in the cache."""
    devs = layer_devices(be, w)
    x = be.embed(w.token_embd, batch.tokens)  # (n_tok, n_embd) residual stream
    x *= np.float32(cfg.embed_scale)
    prev = be
    for il, L in enumerate(w.layers):
        dev = devs[il]
        if il == 0 or dev is not prev:
            x = cross(x, prev, dev)
            h = dev.xp.empty_like(x)  # (n_tok, n_embd) normed input of the next sub-block
        prev = dev
        local = cfg.windows[il] > 0
        base = cfg.rope_base_swa if local else cfg.rope_base
        scale = cfg.rope_freq_scale_swa if local else cfg.rope_freq_scale
        dev.ops.rms_norm(x, L.attn_norm, cfg.rms_eps, h)
        a = attention(dev, cfg, w, L, il, h, batch, cache, base, scale)
        dev.ops.rms_norm(a, L.post_attention_norm, cfg.rms_eps, a)
        dev.ops.add_rms_norm(x, a, L.ffn_norm, cfg.rms_eps, h)
        f = gated_ffn(dev, L, h, dev.ops.geglu_tanh)
        dev.ops.rms_norm(f, L.post_ffw_norm, cfg.rms_eps, f)
        x += f
    out_dev = devs[-1]
    x = cross(x, prev, out_dev)
    return out_dev.ops.rms_norm(x, w.output_norm, cfg.rms_eps, out_dev.xp.empty_like(x))  # on the output's device
