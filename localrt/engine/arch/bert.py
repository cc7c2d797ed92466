"""bert (all-minilm, bge, mxbai-embed-large, snowflake-arctic-embed): an encoder. Learned absolute positions and
token-type row 0 are added to the token embedding, LayerNorm (with bias) after the embedding and after each
sub-block (post-norm), attention over the whole input (not causal, no KV cache), a GELU feed-forward with biases.

As llama.cpp's `src/models/bert.cpp`: token types are all 0 ("sentence A"), GELU is the tanh form looked up at
float16 input precision (ggml's GELU table), keys and values are attended at float16 (its flash-attention path).
A reranker (pooling_type 4, rank) adds a classification head over the [CLS] state (`rank`); its query and document
are then token type 0 too, as llama.cpp runs them (Hugging Face gives the document type 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from simd_kernels import ops, threads

from ...errors import InvalidModel
from ..backends.backend import QTensor
from .common import TensorSource, TensorTable, dims

ROPE_MODE = ops.ROPE_NORMAL  # unused: positions are learned
ENCODER = True
NORM_EPS_KEY = "attention.layer_norm_epsilon"
QUERY_CHUNK = 256  # query rows per attention step: scores are (n_head, QUERY_CHUNK, n_tok) float32

GLOBALS: TensorTable = {
    "token_embd.weight": (("n_vocab", "n_embd"), True),
    "token_types.weight": (("n_token_types", "n_embd"), False),
    "position_embd.weight": (("n_ctx_train", "n_embd"), True),
    "token_embd_norm.weight": (("n_embd",), True),
    "token_embd_norm.bias": (("n_embd",), True),
    # A reranker's classification head (pooling_type 4, rank), as llama.cpp's converter names it: a dense layer and
    # tanh (cls), then the projection to the scores (cls.output); a reranker has one or both (check_tensors).
    "cls.weight": (("n_embd", "n_embd"), False),
    "cls.bias": (("n_embd",), False),
    "cls.output.weight": (("n_cls_out", "n_embd"), False),
    "cls.output.bias": (("n_cls_out",), False),
}
HEAD = ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")

BLOCK: TensorTable = {
    "attn_q.weight": (("n_q", "n_embd"), True),
    "attn_k.weight": (("n_k", "n_embd"), True),
    "attn_v.weight": (("n_v", "n_embd"), True),
    "attn_q.bias": (("n_q",), False),
    "attn_k.bias": (("n_k",), False),
    "attn_v.bias": (("n_v",), False),
    "attn_output.weight": (("n_embd", "n_o"), True),
    "attn_output.bias": (("n_embd",), False),
    "attn_output_norm.weight": (("n_embd",), True),
    "attn_output_norm.bias": (("n_embd",), True),
    "ffn_up.weight": (("n_ff", "n_embd"), True),
    "ffn_up.bias": (("n_ff",), False),
    "ffn_down.weight": (("n_embd", "n_ff"), True),
    "ffn_down.bias": (("n_embd",), False),
    "layer_output_norm.weight": (("n_embd",), True),
    "layer_output_norm.bias": (("n_embd",), True),
}


@dataclass
class EncoderLayer:
    """One block, GGUF names minus `blk.N.`; vectors (biases, norms) float32, absent biases None."""

    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_output: QTensor
    ffn_up: QTensor
    ffn_down: QTensor
    attn_output_norm: tuple[np.ndarray, np.ndarray]  # (weight, bias), each (n_embd,)
    layer_output_norm: tuple[np.ndarray, np.ndarray]
    biases: dict[str, np.ndarray | None]  # "attn_q" ... "ffn_down" -> (rows,) or None


@dataclass
class EncoderWeights:
    token_embd: QTensor
    position_embd: QTensor
    type_row: np.ndarray | None  # (n_embd,) token type 0's embedding, or None
    embd_norm: tuple[np.ndarray, np.ndarray]
    layers: list[EncoderLayer]
    head: dict[str, QTensor | np.ndarray | None] = field(default_factory=dict)  # HEAD name -> tensor, or None


def check_tensors(cfg, tensors) -> None:
    """A reranker (pooling_type rank) must have a classification head: without one llama.cpp would score by the
    first value of the [CLS] token's hidden state, which no reranker is trained to give."""
    if cfg.rank and "cls.weight" not in tensors and "cls.output.weight" not in tensors:
        raise InvalidModel(
            f"{cfg.arch}.pooling_type is 4 (rank) but the file has neither tensor 'cls.weight' nor "
            "'cls.output.weight': a reranker needs its classification head"
        )


MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down")


def load(cfg, src: TensorSource) -> EncoderWeights:
    d = dims(cfg)

    def fetch(name: str, spec):
        shape = tuple(d[k] for k in spec[0])
        if len(shape) == 2:
            return src.matrix(name, *shape) if spec[1] or src.has(name) else None
        return src.vector(name, shape[0], required=spec[1])

    g = {name: fetch(name, spec) for name, spec in GLOBALS.items()}
    types = g["token_types.weight"]
    layers = []
    for il in range(cfg.n_layer):
        t = {name: fetch(f"blk.{il}.{name}", spec) for name, spec in BLOCK.items()}
        layers.append(
            EncoderLayer(
                **{m: t[f"{m}.weight"] for m in MATRICES},
                attn_output_norm=(t["attn_output_norm.weight"], t["attn_output_norm.bias"]),
                layer_output_norm=(t["layer_output_norm.weight"], t["layer_output_norm.bias"]),
                biases={m: t.get(f"{m}.bias") for m in MATRICES},
            )
        )
    return EncoderWeights(
        token_embd=g["token_embd.weight"],
        position_embd=g["position_embd.weight"],
        type_row=None if types is None else src.backend.embed(types, np.zeros(1, np.int64))[0],
        embd_norm=(g["token_embd_norm.weight"], g["token_embd_norm.bias"]),
        layers=layers,
        head={name: g[name] for name in HEAD},
    )


def encode(be, cfg, w: EncoderWeights, tokens: np.ndarray, lengths: list[int] | None = None) -> np.ndarray:
    """Hidden states (n_tok, n_embd) float32 of one or more sequences laid end to end (`lengths`, default one):
    the matrices run on all their tokens at once, and each token attends to every token of its own sequence."""
    lengths = [len(tokens)] if lengths is None else lengths
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])  # (n_tok,) from 0 in each
    x = be.embed(w.token_embd, tokens) + be.embed(w.position_embd, positions)  # (n_tok, n_embd)
    if w.type_row is not None:
        x += w.type_row
    x = layer_norm(x, *w.embd_norm, cfg.norm_eps)
    starts = np.cumsum([0] + lengths)
    for L in w.layers:
        att = attend_sequences(cfg, *(_linear(be, L, m, x) for m in ("attn_q", "attn_k", "attn_v")), starts)
        a = _linear(be, L, "attn_output", att)
        x = layer_norm(x + a, *L.attn_output_norm, cfg.norm_eps)
        f = _linear(be, L, "ffn_down", gelu(_linear(be, L, "ffn_up", x)))
        x = layer_norm(x + f, *L.layer_output_norm, cfg.norm_eps)
    return x


def rank(be, cfg, w: EncoderWeights, hidden: np.ndarray, lengths: list[int], mean: bool = False) -> np.ndarray:
    """The classification head's outputs (n_seq, n_cls_out) float32 for sequences laid end to end in hidden
    (n_tok, n_embd), as llama.cpp's rank pooling: each sequence's first token ([CLS]), or the mean of its tokens
    when `mean` (classifier.pooling_type 1); then tanh(cls x + cls.bias) if the file has cls, then
    cls.output x + cls.output.bias if it has cls.output. Raw scores: no sigmoid, as llama-server returns them."""
    starts = np.cumsum([0] + list(lengths))  # (n_seq + 1,)
    if mean:
        x = np.stack([hidden[a:b].mean(axis=0, dtype=np.float64) for a, b in pairwise(starts)])
        x = x.astype(np.float32)  # (n_seq, n_embd)
    else:
        x = np.ascontiguousarray(hidden[starts[:-1]])  # (n_seq, n_embd)
    h = w.head
    if h.get("cls.weight") is not None:
        x = be.linear(h["cls.weight"], x)  # (n_seq, n_embd)
        if h["cls.bias"] is not None:
            x += h["cls.bias"]
        x = np.tanh(x)
    if h.get("cls.output.weight") is not None:
        x = be.linear(h["cls.output.weight"], np.ascontiguousarray(x))  # (n_seq, n_cls_out)
        if h["cls.output.bias"] is not None:
            x += h["cls.output.bias"]
    return x[:, : cfg.n_cls_out]  # without cls.output, llama.cpp reads the first n_cls_out values


def _linear(be, L: EncoderLayer, name: str, x: np.ndarray) -> np.ndarray:
    y = be.linear(getattr(L, name), np.ascontiguousarray(x))  # (n_tok, rows)
    b = L.biases[name]
    if b is not None:
        y += b
    return y


def attend_sequences(
    cfg, q: np.ndarray, k: np.ndarray, v: np.ndarray, starts: np.ndarray, window: int = 0
) -> np.ndarray:
    """`_attention` of each sequence laid end to end in q, k, v (n_tok, ...; sequence i is rows starts[i] to
    starts[i + 1]): (n_tok, n_head * head_dim_v). Several sequences share the prefill team, one a member at a time
    (each member's BLAS is single-threaded); a sequence alone splits its softmax over the team instead."""
    seqs = list(zip(*(np.split(m, starts[1:-1]) for m in (q, k, v))))
    if len(seqs) == 1:
        return _attention(cfg, *seqs[0], window)
    team = threads.team()
    outs: list = [None] * len(seqs)

    def part(i: int) -> None:
        for j in range(i, len(seqs), team.n):
            outs[j] = _attention(cfg, *seqs[j], window, split=False)

    team.run(part)
    return np.concatenate(outs)


def _attention(cfg, q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int = 0, split: bool = True) -> np.ndarray:
    """Softmax(q k^T / sqrt(head_dim)) v over all tokens of one sequence, per head; (n_tok, n_head * head_dim_v).
    window > 0: a symmetric sliding window (gemma-embedding's local layers), token i sees token j only where
    |i - j| <= window // 2 (llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC). split: the softmax over the prefill team (not
    from inside a team member)."""
    n, nh, nkv = len(q), cfg.n_head, cfg.n_head_kv
    q = q.reshape(n, nh, cfg.head_dim).transpose(1, 0, 2)  # (n_head, n_tok, head_dim)
    # keys and values at float16, as llama.cpp attends them
    k = to_f16_precision(k).reshape(n, nkv, cfg.head_dim).transpose(1, 2, 0)  # (n_kv, head_dim, n_tok)
    v = to_f16_precision(v).reshape(n, nkv, cfg.head_dim_v).transpose(1, 0, 2)  # (n_kv, n_tok, head_dim_v)
    if nkv != nh:  # grouped heads: each kv head serves n_head / n_head_kv query heads
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
    out = np.empty((nh, n, cfg.head_dim_v), np.float32)  # (n_head, n_tok, head_dim_v)
    scale = np.float32(1.0 / np.sqrt(cfg.head_dim))
    for lo in range(0, n, QUERY_CHUNK):
        s = np.matmul(q[:, lo : lo + QUERY_CHUNK], k) * scale  # (n_head, chunk, n_tok)
        if window > 0:
            rows = np.arange(lo, lo + s.shape[1])[:, None]  # (chunk, 1) query positions
            s[:, np.abs(rows - np.arange(n)[None, :]) > window // 2] = -np.inf  # (chunk, n_tok) outside the window
        ops.softmax_rows_team(s.reshape(-1, n), split)  # in place: s is matmul's own C-contiguous result
        out[:, lo : lo + QUERY_CHUNK] = np.matmul(s, v)
    return out.transpose(1, 0, 2).reshape(n, nh * cfg.head_dim_v)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, sums in float64 as ggml_norm."""
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float64)
    c = (x - mean).astype(np.float32)
    var = np.mean(np.square(c, dtype=np.float64), axis=-1, keepdims=True)
    return (c * (1.0 / np.sqrt(var + eps)).astype(np.float32)) * weight + bias


def to_f16_precision(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to float16's 10 mantissa bits (nearest, ties to even), kept as float32: what a
    float16 round trip gives for every value in float16's normal range, at a fraction of astype's cost (NumPy
    converts to float16 one value at a time). Below that range (|x| < 6.1e-5) float16 would keep fewer bits;
    the difference is under 1e-8 there."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = (u + (np.uint32(0x0FFF) + ((u >> np.uint32(13)) & np.uint32(1)))) & np.uint32(0xFFFFE000)
    return r.view(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml's GELU (simd_kernels.ops.gelu_f16): the tanh form of the float16-rounded input, rounded to float16 (its
    lookup table); identity from 10 up and 0 from -10 down. In place: x is the up projection's own output."""
    return ops.gelu_f16(x, x)
