"""gpt-oss (OpenAI's gpt-oss-20b / -120b; llama.cpp's arch "gpt-oss", Ollama's "gptoss"): NEOX rope, usually YaRN;
even layers attend within a sliding window (pattern 2), odd layers to everything; every attention has a learned
per-head sink (`attn_sinks` (n_head,), a logit in the softmax denominator with no value), q/k/v biases where the file
has them and an output bias; the FFN is a mixture of experts with biases everywhere (router, gate, up, down), gated
"softmax_weight" (top-k of the router's logits, softmax over the k) and the clamped swiglu_oai activation (see .moe).

The pre-FFN norm is `post_attention_norm` (llama.cpp's LLM_TENSOR_ATTN_POST_NORM); there is no `ffn_norm`, and the
output matrix is never tied. Sliding-window layers use rope.freq_base_swa where the file has it, the same scaling.
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
    layer_devices,
    load_common,
)
from .moe import moe_ffn

__all__ = ["BLOCK", "GLOBALS", "REQUIRED_KEYS", "ROPE_MODE", "load", "forward"]


ROPE_MODE = ops.ROPE_NEOX
# llama.cpp reads these with no default for gpt-oss (expert_count and expert_used_count are required of every MoE).
REQUIRED_KEYS = ("attention.layer_norm_rms_epsilon", "attention.sliding_window", "expert_feed_forward_length")
BLOCK = {name: spec for name, spec in block_tensors().items() if not name.startswith("ffn_")}  # q/k/v biases optional
BLOCK.update(
    {
        "attn_output.bias": (("n_embd",), True),
        "attn_sinks.weight": (("n_head",), True),
        "post_attention_norm.weight": (("n_embd",), True),  # the pre-FFN norm
        "ffn_gate_inp.weight": (("n_expert", "n_embd"), True),
        "ffn_gate_inp.bias": (("n_expert",), True),
        "ffn_gate_exps.weight": (("n_expert", "n_ff_exp", "n_embd"), True),
        "ffn_gate_exps.bias": (("n_expert", "n_ff_exp"), True),
        "ffn_up_exps.weight": (("n_expert", "n_ff_exp", "n_embd"), True),
        "ffn_up_exps.bias": (("n_expert", "n_ff_exp"), True),
        "ffn_down_exps.weight": (("n_expert", "n_embd", "n_ff_exp"), True),
        "ffn_down_exps.bias": (("n_expert", "n_embd"), True),
    }
)
GLOBALS = {
    "token_embd.weight": (("n_vocab", "n_embd"), True),
    "output_norm.weight": (("n_embd",), True),
    "output.weight": (("n_vocab", "n_embd"), True),  # llama.cpp requires it: gpt-oss never ties its output
}


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, BLOCK, GLOBALS, extra=lambda il: {"ffn_norm": None})


def forward(be, cfg, w: Weights, batch: Batch, cache) -> np.ndarray:
    """Final-normed hidden states (n_tok, n_embd) of the batch; stores its keys in the cache."""
    devs = layer_devices(be, w)
    x = cross(be.embed(w.token_embd, batch.tokens), be, devs[0])  # (n_tok, n_embd) residual stream
    h = devs[0].xp.empty_like(x)  # (n_tok, n_embd) normed input of the next sub-block
    devs[0].ops.rms_norm(x, w.layers[0].attn_norm, cfg.rms_eps, h)
    for il, L in enumerate(w.layers):
        dev = devs[il]
        local = cfg.windows[il] > 0
        base = cfg.rope_base_swa if local else cfg.rope_base
        scale = cfg.rope_freq_scale_swa if local else cfg.rope_freq_scale
        a = attention(dev, cfg, w, L, il, h, batch, cache, base, scale)  # with sinks and the output bias
        dev.ops.add_rms_norm(x, a, L.post_attention_norm, cfg.rms_eps, h)
        f = moe_ffn(dev, cfg, L, h)
        next_norm = w.layers[il + 1].attn_norm if il + 1 < cfg.n_layer else w.output_norm
        x, h = add_norm_next(dev, devs[il + 1], x, f, next_norm, cfg.rms_eps, h)
    return h  # on the output layer's device
