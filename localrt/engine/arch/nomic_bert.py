"""nomic-bert (nomic-embed-text v1 and v1.5): the bert encoder with rotary positions and a SwiGLU feed-forward.

As llama.cpp's `src/models/nomic-bert.cpp` (tensors) and the nomic branches of `src/models/bert.cpp` (graph):
- no position embedding: q and k are rotated (NEOX pairs (i, i + n_rot/2)) by each token's position in its own
  sequence, with `nomic-bert.rope.freq_base` (1000 in nomic's files). The key is required here, where llama.cpp
  would fall back to 10000: a base the model was not trained with gives wrong vectors, not an error;
- `attn_qkv` (n_q + n_k + n_v, n_embd) holds q's rows, then k's, then v's (build_qkv's views), with an optional
  `attn_qkv.bias`; files with separate attn_q/attn_k/attn_v (and their optional biases) are read too;
- FFN = ffn_down(silu(ffn_gate x) * ffn_up x) (LLM_FFN_SILU, LLM_FFN_PAR: ggml_swiglu_split(gate, up)). The graph
  passes no FFN biases, so any `ffn_*.bias` in a file is not used, as in llama.cpp;
- token type row 0 added, post-norm LayerNorms with biases, attention over the whole sequence at scale
  1/sqrt(head_dim) with keys and values at float16: bert's, reused from `.bert`.
The trained context (`nomic-bert.context_length`, 2048 in nomic's files) bounds an input; no tensor does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simd_kernels import ops

from ..backends.backend import QTensor
from .bert import _linear, attend_sequences, layer_norm
from .common import TensorSource, TensorTable, dims
from .phi3 import (
    check_tensors,  # each block: attn_qkv, or all three of attn_q, attn_k, attn_v
)

__all__ = [
    "BLOCK",
    "ENCODER",
    "GLOBALS",
    "NORM_EPS_KEY",
    "REQUIRED_KEYS",
    "ROPE_MODE",
    "check_tensors",
    "encode",
    "load",
]

ROPE_MODE = ops.ROPE_NEOX
ENCODER = True
NORM_EPS_KEY = "attention.layer_norm_epsilon"
REQUIRED_KEYS = ("rope.freq_base",)  # see the module docstring

GLOBALS: TensorTable = {
    "token_embd.weight": (("n_vocab", "n_embd"), True),
    "token_types.weight": (("n_token_types", "n_embd"), False),
    "token_embd_norm.weight": (("n_embd",), True),
    "token_embd_norm.bias": (("n_embd",), True),
}

BLOCK: TensorTable = {
    "attn_qkv.weight": (("n_qkv", "n_embd"), False),  # fused (the converter's layout) ...
    "attn_qkv.bias": (("n_qkv",), False),
    "attn_q.weight": (("n_q", "n_embd"), False),  # ... or separate; check_tensors wants one of the two
    "attn_k.weight": (("n_k", "n_embd"), False),
    "attn_v.weight": (("n_v", "n_embd"), False),
    "attn_q.bias": (("n_q",), False),
    "attn_k.bias": (("n_k",), False),
    "attn_v.bias": (("n_v",), False),
    "attn_output.weight": (("n_embd", "n_o"), True),
    "attn_output.bias": (("n_embd",), False),
    "attn_output_norm.weight": (("n_embd",), True),
    "attn_output_norm.bias": (("n_embd",), True),
    "ffn_gate.weight": (("n_ff", "n_embd"), True),
    "ffn_up.weight": (("n_ff", "n_embd"), True),
    "ffn_down.weight": (("n_embd", "n_ff"), True),
    "layer_output_norm.weight": (("n_embd",), True),
    "layer_output_norm.bias": (("n_embd",), True),
}
_QKV = ("attn_q", "attn_k", "attn_v")
_ROWS = {"attn_q": "n_q", "attn_k": "n_k", "attn_v": "n_v"}  # each one's rows, as `dims` names them


@dataclass
class NomicLayer:
    """One block, GGUF names minus `blk.N.`; vectors float32. `attn_qkv` is the fused weight, or None with attn_q,
    attn_k and attn_v set; `biases` is what bert's `_linear` adds ("attn_qkv" (n_qkv,) or per matrix, else None)."""

    attn_qkv: QTensor | None
    attn_q: QTensor | None
    attn_k: QTensor | None
    attn_v: QTensor | None
    attn_output: QTensor
    ffn_gate: QTensor
    ffn_up: QTensor
    ffn_down: QTensor
    attn_output_norm: tuple[np.ndarray, np.ndarray]  # (weight, bias), each (n_embd,)
    layer_output_norm: tuple[np.ndarray, np.ndarray]
    biases: dict[str, np.ndarray | None]


@dataclass
class NomicWeights:
    token_embd: QTensor
    type_row: np.ndarray | None  # (n_embd,) token type 0's embedding, or None
    embd_norm: tuple[np.ndarray, np.ndarray]
    layers: list[NomicLayer]
    rope_freqs: np.ndarray  # (n_rot/2,) float32 ones: nomic has no frequency factors


def load(cfg, src: TensorSource) -> NomicWeights:
    check_tensors(cfg, src.tensors)
    types = src.matrix("token_types.weight", cfg.n_token_types, cfg.n_embd) if src.has("token_types.weight") else None
    return NomicWeights(
        token_embd=src.matrix("token_embd.weight", cfg.n_vocab, cfg.n_embd),
        type_row=None if types is None else src.backend.embed(types, np.zeros(1, np.int64))[0],
        embd_norm=(src.vector("token_embd_norm.weight", cfg.n_embd), src.vector("token_embd_norm.bias", cfg.n_embd)),
        layers=[_load_layer(cfg, src, f"blk.{il}.") for il in range(cfg.n_layer)],
        rope_freqs=np.ones(cfg.n_rot // 2, np.float32),
    )


def _load_layer(cfg, src: TensorSource, p: str) -> NomicLayer:
    d = dims(cfg)

    def vec(name: str, n: int, required: bool = True):
        return src.vector(p + name, n, required=required)

    fused = src.has(p + "attn_qkv.weight")
    qkv = src.matrix(p + "attn_qkv.weight", d["n_qkv"], cfg.n_embd) if fused else None
    sep = [None] * 3 if fused else [src.matrix(f"{p}{m}.weight", d[_ROWS[m]], cfg.n_embd) for m in _QKV]
    qkv_b = vec("attn_qkv.bias", d["n_qkv"], False) if fused else None
    sep_b = [vec(f"{m}.bias", d[_ROWS[m]], False) for m in _QKV]
    if fused and qkv_b is None and all(b is not None for b in sep_b):
        # fused weights with separate biases (legacy files): llama.cpp adds their concatenation, and only all three
        qkv_b = np.concatenate(sep_b)  # (n_qkv,)
    return NomicLayer(
        attn_qkv=qkv,
        attn_q=sep[0],
        attn_k=sep[1],
        attn_v=sep[2],
        attn_output=src.matrix(p + "attn_output.weight", cfg.n_embd, d["n_o"]),
        ffn_gate=src.matrix(p + "ffn_gate.weight", cfg.n_ff, cfg.n_embd),
        ffn_up=src.matrix(p + "ffn_up.weight", cfg.n_ff, cfg.n_embd),
        ffn_down=src.matrix(p + "ffn_down.weight", cfg.n_embd, cfg.n_ff),
        attn_output_norm=(vec("attn_output_norm.weight", cfg.n_embd), vec("attn_output_norm.bias", cfg.n_embd)),
        layer_output_norm=(vec("layer_output_norm.weight", cfg.n_embd), vec("layer_output_norm.bias", cfg.n_embd)),
        biases={
            "attn_qkv": qkv_b,
            **({} if fused else dict(zip(_QKV, sep_b))),
            "attn_output": vec("attn_output.bias", cfg.n_embd, False),
        },
    )


def encode(be, cfg, w: NomicWeights, tokens: np.ndarray, lengths: list[int] | None = None) -> np.ndarray:
    """Hidden states (n_tok, n_embd) float32 of one or more sequences laid end to end (`lengths`, default one):
    the matrices run on all their tokens at once, each token is rotated by its position in its own sequence and
    attends to every token of that sequence."""
    lengths = [len(tokens)] if lengths is None else lengths
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])  # (n_tok,) from 0 in each
    n = len(tokens)
    x = be.embed(w.token_embd, tokens)  # (n_tok, n_embd)
    if w.type_row is not None:
        x += w.type_row
    x = layer_norm(x, *w.embd_norm, cfg.norm_eps)
    starts = np.cumsum([0] + lengths)
    n_q, n_k = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    for L in w.layers:
        q, k, v = _qkv(be, L, x, n_q, n_k)
        q3 = q.reshape(n, cfg.n_head, cfg.head_dim)  # views of q and k: rotated in place
        k3 = k.reshape(n, cfg.n_head_kv, cfg.head_dim)
        be.ops.rope(q3, positions, cfg.n_rot, cfg.rope_base, cfg.rope_freq_scale, w.rope_freqs, cfg.rope_mode)
        be.ops.rope(k3, positions, cfg.n_rot, cfg.rope_base, cfg.rope_freq_scale, w.rope_freqs, cfg.rope_mode)
        if cfg.rope_attn_factor != 1.0:  # ggml scales cos and sin: the rotated dims only
            q3[:, :, : cfg.n_rot] *= np.float32(cfg.rope_attn_factor)
            k3[:, :, : cfg.n_rot] *= np.float32(cfg.rope_attn_factor)
        att = attend_sequences(cfg, q, k, v, starts)  # (n_tok, n_o)
        a = _linear(be, L, "attn_output", att)
        x = layer_norm(x + a, *L.attn_output_norm, cfg.norm_eps)
        gate = be.linear(L.ffn_gate, x)  # (n_tok, n_ff)
        be.ops.swiglu(gate, be.linear(L.ffn_up, x), gate)  # silu(gate) * up, in place
        f = be.linear(L.ffn_down, gate)  # (n_tok, n_embd)
        x = layer_norm(x + f, *L.layer_output_norm, cfg.norm_eps)
    return x


def _qkv(be, L: NomicLayer, x: np.ndarray, n_q: int, n_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (n_tok, n_q), k (n_tok, n_k), v (n_tok, n_v), each contiguous (rope rotates them in place)."""
    if L.attn_qkv is not None:
        qkv = _linear(be, L, "attn_qkv", x)  # (n_tok, n_qkv): one product, split by columns
        return (
            np.ascontiguousarray(qkv[:, :n_q]),
            np.ascontiguousarray(qkv[:, n_q : n_q + n_k]),
            np.ascontiguousarray(qkv[:, n_q + n_k :]),
        )
    return tuple(_linear(be, L, m, x) for m in _QKV)
