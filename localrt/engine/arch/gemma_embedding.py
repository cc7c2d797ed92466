"""gemma-embedding (Google's EmbeddingGemma, embeddinggemma-300m): gemma3's body run as an encoder.

As llama.cpp's `src/models/gemma-embedding.cpp` (hparams, tensors, graph) and `llama_model::build_graph` (pooling,
then the Dense projections):
- gemma3's block: the token embedding scaled by sqrt(n_embd), RMS norms whose weights already hold Gemma's +1,
  q and k RMS-normed per head then rotated (NEOX) by each token's position in its own sequence, sandwich norms
  (post_attention_norm, post_ffw_norm), FFN = ffn_down(gelu_tanh(ffn_gate x) * ffn_up x), a final output_norm;
- attention is not causal and has no KV cache: a token sees every token of its sequence on global layers, and on
  local (sliding-window) layers only those with |i - j| <= attention.sliding_window // 2 (LLAMA_SWA_TYPE_SYMMETRIC);
  local layers are il % p < p - 1 for attention.sliding_window_pattern p (default 6), or the file's per-layer
  bools, and rotate with rope.freq_base_swa (default 10000), global ones with rope.freq_base;
- q.k is scaled by 1 / sqrt(attention.key_length) (no 27B rule here), keys and values attended at float16;
- a file converted with sentence-transformers' Dense modules has `dense_2.weight` (dense_2_feat_out, n_embd) and
  `dense_3.weight` (n_embd, dense_3_feat_in), applied without bias, in that order, to the pooled vector (`project`;
  llama.cpp applies them to each token's state where it does not pool: the same map, it is linear).
`{arch}.attention.sliding_window` and `{arch}.attention.layer_norm_rms_epsilon` are required, as in llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simd_kernels import ops

from ...errors import InvalidModel
from .. import validate
from ..backends.backend import QTensor
from .bert import attend_sequences
from .common import (
    Layer,
    TensorSource,
    TensorTable,
    block_tensors,
    dims,
    gated_ffn,
    load_layer,
)

ROPE_MODE = ops.ROPE_NEOX
ENCODER = True
TOKEN_TYPES = False  # no token_types tensor, and no tokenizer.ggml.token_type_count to require
NORM_EPS_KEY = "attention.layer_norm_rms_epsilon"
REQUIRED_KEYS = ("attention.sliding_window", "attention.layer_norm_rms_epsilon")
DENSE_KEYS = ("dense_2_feat_in", "dense_2_feat_out", "dense_3_feat_in", "dense_3_feat_out")

GLOBALS: TensorTable = {
    "token_embd.weight": (("n_vocab", "n_embd"), True),
    "output_norm.weight": (("n_embd",), True),
    "dense_2.weight": (("n_dense_2_out", "n_embd"), False),  # sentence-transformers' 2_Dense
    "dense_3.weight": (("n_embd", "n_dense_3_in"), False),  # ... and 3_Dense
}
BLOCK: TensorTable = block_tensors(qk_norm=True, sandwich=True)


@dataclass
class GemmaEmbeddingWeights:
    token_embd: QTensor
    output_norm: np.ndarray  # (n_embd,)
    layers: list[Layer]  # common.Layer: GGUF names minus `blk.N.` and `.weight`
    rope_freqs: np.ndarray  # (n_rot/2,) float32 ones: no frequency factors
    dense: list[QTensor]  # dense_2 then dense_3, those the file has


def config_keys(k) -> dict:
    """The Dense projections' widths for ModelConfig (0: none), checked as llama.cpp asserts them: dense_2 reads
    n_embd (dense_2_feat_in) and dense_3 gives n_embd back (dense_3_feat_out), so the embedding stays n_embd wide."""
    got = {s: k.int(s, 0, lo=0, hi=validate.MAX_WIDTH) for s in DENSE_KEYS}
    n_embd = k.int("embedding_length")
    for s in ("dense_2_feat_in", "dense_3_feat_out"):
        if got[s] not in (0, n_embd):
            raise InvalidModel(
                f"{k.name(s)} is {got[s]} but {k.name('embedding_length')} is {n_embd}: the Dense "
                "projections must read and give back the embedding's width"
            )
    return {"n_dense_2_out": got["dense_2_feat_out"], "n_dense_3_in": got["dense_3_feat_in"]}


def check_tensors(cfg, tensors) -> None:
    """A Dense tensor needs its width key (llama.cpp would read a 0-wide tensor), and dense_3 must take what dense_2
    gives (n_embd without dense_2)."""
    arch = cfg.arch
    if cfg.rank:
        raise InvalidModel(f"{arch}.pooling_type is 4 (rank) but {arch} has no classification head to score with")
    for name, key, width in (
        ("dense_2.weight", "dense_2_feat_out", cfg.n_dense_2_out),
        ("dense_3.weight", "dense_3_feat_in", cfg.n_dense_3_in),
    ):
        if name in tensors and width == 0:
            raise InvalidModel(f"the file has tensor {name!r} but no {arch}.{key} (its width)")
    if "dense_3.weight" in tensors:
        fed = cfg.n_dense_2_out if "dense_2.weight" in tensors else cfg.n_embd
        if cfg.n_dense_3_in != fed:
            raise InvalidModel(
                f"{arch}.dense_3_feat_in is {cfg.n_dense_3_in} but dense_3 is fed {fed} values "
                f"({arch}.dense_2_feat_out, or the embedding_length without dense_2)"
            )
    elif "dense_2.weight" in tensors and cfg.n_dense_2_out != cfg.n_embd:
        raise InvalidModel(
            f"{arch}.dense_2_feat_out is {cfg.n_dense_2_out} and the file has no dense_3.weight: the "
            f"embedding would be {cfg.n_dense_2_out} wide, not {arch}.embedding_length ({cfg.n_embd})"
        )


def load(cfg, src: TensorSource) -> GemmaEmbeddingWeights:
    check_tensors(cfg, src.tensors)
    d = dims(cfg)
    dense = [
        src.matrix(name, *(d[x] for x in GLOBALS[name][0]))
        for name in ("dense_2.weight", "dense_3.weight")
        if src.has(name)
    ]
    return GemmaEmbeddingWeights(
        token_embd=src.matrix("token_embd.weight", cfg.n_vocab, cfg.n_embd),
        output_norm=src.vector("output_norm.weight", cfg.n_embd),
        layers=[load_layer(cfg, src, il, BLOCK) for il in range(cfg.n_layer)],
        rope_freqs=np.ones(cfg.n_rot // 2, np.float32),
        dense=dense,
    )


def encode(be, cfg, w: GemmaEmbeddingWeights, tokens: np.ndarray, lengths: list[int] | None = None) -> np.ndarray:
    """Final-normed hidden states (n_tok, n_embd) float32 of one or more sequences laid end to end (`lengths`,
    default one), before the Dense projections: the matrices run on all their tokens at once, each token is rotated
    by its position in its own sequence and attends within that sequence (within the window on local layers)."""
    lengths = [len(tokens)] if lengths is None else lengths
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])  # (n_tok,) from 0 in each
    n = len(tokens)
    starts = np.cumsum([0] + lengths)  # (n_seq + 1,)
    x = be.embed(w.token_embd, tokens)  # (n_tok, n_embd) residual stream
    x *= np.float32(cfg.embed_scale)
    h = np.empty_like(x)  # (n_tok, n_embd) normed input of a sub-block
    for il, L in enumerate(w.layers):
        window = cfg.windows[il]
        base, scale = (
            (cfg.rope_base_swa, cfg.rope_freq_scale_swa) if window > 0 else (cfg.rope_base, cfg.rope_freq_scale)
        )
        be.ops.rms_norm(x, L.attn_norm, cfg.rms_eps, h)
        # q (n_tok, n_head * head_dim), k (n_tok, n_head_kv * head_dim), v (n_tok, n_head_kv * head_dim_v)
        q, k, v = be.linears((L.attn_q, L.attn_k, L.attn_v), h)
        for t, b in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
            if b is not None:
                t += b
        q3 = q.reshape(n, cfg.n_head, cfg.head_dim)  # views: normed and rotated in place
        k3 = k.reshape(n, cfg.n_head_kv, cfg.head_dim)
        be.ops.rms_norm_heads(q3, L.attn_q_norm, cfg.rms_eps)
        be.ops.rms_norm_heads(k3, L.attn_k_norm, cfg.rms_eps)
        be.ops.rope(q3, positions, cfg.n_rot, base, scale, w.rope_freqs, cfg.rope_mode)
        be.ops.rope(k3, positions, cfg.n_rot, base, scale, w.rope_freqs, cfg.rope_mode)
        att = attend_sequences(cfg, q, k, v, starts, window)  # (n_tok, n_head * head_dim_v)
        a = be.linear(L.attn_output, att)  # (n_tok, n_embd)
        if L.attn_output_bias is not None:
            a += L.attn_output_bias
        be.ops.rms_norm(a, L.post_attention_norm, cfg.rms_eps, a)
        be.ops.add_rms_norm(x, a, L.ffn_norm, cfg.rms_eps, h)  # x += a; h = ffn_norm(x)
        f = gated_ffn(be, L, h, be.ops.geglu_tanh)  # (n_tok, n_embd)
        be.ops.rms_norm(f, L.post_ffw_norm, cfg.rms_eps, f)
        x += f
    return be.ops.rms_norm(x, w.output_norm, cfg.rms_eps, h)


def project(be, cfg, w: GemmaEmbeddingWeights, pooled: np.ndarray) -> np.ndarray:
    """The Dense projections (dense_2, then dense_3, those the file has) of pooled (n, n_embd) -> (n, n_embd)."""
    for t in w.dense:
        pooled = be.linear(t, np.ascontiguousarray(pooled, np.float32))  # (n, rows of t)
    return pooled
