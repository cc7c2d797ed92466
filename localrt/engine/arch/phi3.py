"""phi3 (Phi-3, Phi-3.5-mini, Phi-4-mini): the llama graph with NEOX rope, fused projections and longrope.

- `attn_qkv` (n_q + n_k + n_v, n_embd) holds q's output rows, then k's, then v's (llama.cpp's build_qkv views);
  files with separate attn_q/attn_k/attn_v are read too. An `attn_qkv.bias` splits the same way.
- `ffn_up` (2 n_ff, n_embd) holds the gate's rows, then up's (ggml_swiglu of the fused product: silu of the
  first half times the second); there is no ffn_gate.
Both are split into row views of the mapped blocks at load (no copy), so the rest is the shared llama forward.
- Longrope: `rope_factors_short` / `rope_factors_long` divide the rope frequencies, the long ones when the loaded
  context exceeds rope.scaling.original_context_length (`common.select_rope_factors`), and
  rope.scaling.attn_factor scales the rotated dims (config.rope_attn_factor). Partial rotary is allowed.
- attention.sliding_window is not applied, as in llama.cpp (config warns).
"""

from __future__ import annotations

import numpy as np

from simd_kernels import ops

from ...errors import MissingTensor
from ..backends.backend import QTensor
from .common import TensorSource, Weights, block_tensors, dims, load_common
from .llama import forward

__all__ = ["BLOCK", "GLOBALS", "ROPE_MODE", "check_tensors", "load", "forward"]


ROPE_MODE = ops.ROPE_NEOX
_SEPARATE = block_tensors()
BLOCK = {
    "attn_norm.weight": _SEPARATE["attn_norm.weight"],
    "attn_qkv.weight": (("n_qkv", "n_embd"), False),  # fused (the converter's layout) ...
    "attn_qkv.bias": (("n_qkv",), False),
    "attn_q.weight": (("n_q", "n_embd"), False),  # ... or separate; check_tensors wants one of the two
    "attn_k.weight": (("n_k", "n_embd"), False),
    "attn_v.weight": (("n_v", "n_embd"), False),
    "attn_output.weight": _SEPARATE["attn_output.weight"],
    "attn_output.bias": _SEPARATE["attn_output.bias"],
    "ffn_norm.weight": _SEPARATE["ffn_norm.weight"],
    "ffn_up.weight": (("n_ff2", "n_embd"), True),  # gate rows, then up rows
    "ffn_down.weight": _SEPARATE["ffn_down.weight"],
}
GLOBALS = {
    "token_embd.weight": (("n_vocab", "n_embd"), True),
    "output_norm.weight": (("n_embd",), True),
    "output.weight": (("n_vocab", "n_embd"), False),  # absent: tied to token_embd
    "rope_factors_long.weight": (("n_rot_half",), False),
    "rope_factors_short.weight": (("n_rot_half",), False),
}
_QKV = ("attn_q.weight", "attn_k.weight", "attn_v.weight")


def check_tensors(cfg, tensors) -> None:
    """Each block has its attention either fused or as all three of q, k and v."""
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        if p + "attn_qkv.weight" not in tensors:
            for name in _QKV:
                if p + name not in tensors:
                    raise MissingTensor(p + "attn_qkv.weight")


def split_rows(t: QTensor, sizes: list[int], names: list[str]) -> list[QTensor]:
    """Row views of a (sum(sizes), cols) weight: its raw block rows, not a copy."""
    out, r0 = [], 0
    for n, name in zip(sizes, names):
        out.append(QTensor(name, t.ggml_type, (n, t.shape[1]), t.data[r0 : r0 + n]))
        r0 += n
    return out


def load(cfg, src: TensorSource) -> Weights:
    check_tensors(cfg, src.tensors)
    d = dims(cfg)
    sizes = [d["n_q"], d["n_k"], d["n_v"]]

    def fused(il: int) -> dict:
        p = f"blk.{il}."
        if src.has(p + "attn_qkv.weight"):
            q, k, v = split_rows(
                src.matrix(p + "attn_qkv.weight", d["n_qkv"], cfg.n_embd), sizes, [p + n for n in _QKV]
            )
        else:
            q, k, v = (src.matrix(p + n, rows, cfg.n_embd) for n, rows in zip(_QKV, sizes))
        bias = src.vector(p + "attn_qkv.bias", d["n_qkv"], required=False)
        qb, kb, vb = (
            np.split(bias, np.cumsum(sizes)[:-1]) if bias is not None else (None, None, None)
        )  # (n_q,), (n_k,), (n_v,)
        gate, up = split_rows(
            src.matrix(p + "ffn_up.weight", 2 * cfg.n_ff, cfg.n_embd),
            [cfg.n_ff] * 2,
            [p + "ffn_up.weight[gate]", p + "ffn_up.weight[up]"],
        )
        return dict(
            attn_q=q, attn_k=k, attn_v=v, attn_q_bias=qb, attn_k_bias=kb, attn_v_bias=vb, ffn_gate=gate, ffn_up=up
        )

    plain = {
        n: spec for n, spec in BLOCK.items() if n not in ("attn_qkv.weight", "attn_qkv.bias", "ffn_up.weight", *_QKV)
    }
    return load_common(cfg, src, plain, GLOBALS, extra=fused)
