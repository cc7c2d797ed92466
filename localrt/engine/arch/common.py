"""Building blocks shared by the decoder-only architectures: weight lookup, attention, gated FFN."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from simd_kernels import paged

from ...errors import MissingTensor, ModelLoadError
from ..backends.backend import QTensor


@dataclass(frozen=True)
class Batch:
    """Tokens to run together; they may belong to several sequences (cache slots)."""

    tokens: np.ndarray  # (n_tok,) int64
    positions: np.ndarray  # (n_tok,) int64, continuing each slot's cache
    slots: np.ndarray  # (n_tok,) int64

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Layer:
    """One block's weights, GGUF names minus `blk.N.` and `.weight`; vectors are float32 arrays."""

    attn_norm: np.ndarray
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_output: QTensor
    ffn_norm: np.ndarray
    ffn_gate: QTensor | None = None  # dense FFN (None in a mixture-of-experts layer)
    ffn_up: QTensor | None = None
    ffn_down: QTensor | None = None
    attn_q_bias: np.ndarray | None = None
    attn_k_bias: np.ndarray | None = None
    attn_v_bias: np.ndarray | None = None
    attn_output_bias: np.ndarray | None = None
    attn_q_norm: np.ndarray | None = None
    attn_k_norm: np.ndarray | None = None
    post_attention_norm: np.ndarray | None = None
    post_ffw_norm: np.ndarray | None = None
    attn_sinks: np.ndarray | None = None  # (n_head,) per-head logit joining the softmax denominator (gpt-oss)
    # Mixture of experts (see .moe): the router (n_expert, n_embd) and, per expert, a 2-D view of its slice
    # of the stacked 3-D tensors: gate/up (n_ff_exp, n_embd), down (n_embd, n_ff_exp).
    ffn_gate_inp: QTensor | None = None
    ffn_gate_exps: list[QTensor] | None = None
    ffn_up_exps: list[QTensor] | None = None
    ffn_down_exps: list[QTensor] | None = None
    # Their biases (gpt-oss), f32: router (n_expert,), gate/up (n_expert, n_ff_exp), down (n_expert, n_embd).
    ffn_gate_inp_bias: np.ndarray | None = None
    ffn_gate_exps_bias: np.ndarray | None = None
    ffn_up_exps_bias: np.ndarray | None = None
    ffn_down_exps_bias: np.ndarray | None = None


@dataclass
class Weights:
    token_embd: QTensor
    output_norm: np.ndarray
    output: QTensor  # token_embd itself when the file ties the output
    layers: list[Layer]
    rope_freqs: np.ndarray  # (n_rot/2,) f32 rope divisors: rope_freqs (llama3) or rope_factors_short, else ones
    # Device per layer, then one for output_norm + output (see localrt.engine.backends.offload); empty: all on the model's backend.
    devices: list = field(default_factory=list)
    longrope: tuple | None = (
        None  # (rope_factors_short, rope_factors_long), each (n_rot/2,) f32 or None; see select_rope_factors
    )


def layer_devices(be, w: Weights) -> list:
    """The device of each layer and, last, of the output layer."""
    return w.devices or [be] * (len(w.layers) + 1)


def cross(x, src, dst):
    """The residual stream x moved from device src to dst (a no-op on the same device)."""
    return x if dst is src else dst.put(src.to_host(x))


def add_norm_next(dev, nxt, x, delta, norm_w, eps: float, h):
    """x += delta on dev, then h = rms_norm(x) * norm_w on nxt (the next layer's or the output's device).

    Returns (x, h) as they live on nxt: only the residual crosses a device boundary."""
    if nxt is dev:
        dev.ops.add_rms_norm(x, delta, norm_w, eps, h)
        return x, h
    x += delta
    x = cross(x, dev, nxt)
    h = nxt.xp.empty_like(x)  # (n_tok, n_embd) on nxt
    nxt.ops.rms_norm(x, norm_w, eps, h)
    return x, h


class Experts(list):
    """The per-expert (rows, cols) views of a stacked expert tensor, and `stacked`: the whole tensor as one
    (n_expert * rows, cols) QTensor (the same raw rows), for a kernel that reads only the chosen experts' rows."""

    stacked: QTensor


class TensorSource:
    """Looks tensors up by GGUF name; a missing required one is a MissingTensor naming it."""

    def __init__(self, tensors: dict[str, QTensor], backend) -> None:
        self.tensors = tensors
        self.backend = backend

    def matrix(self, name: str, rows: int, cols: int) -> QTensor:
        t = self._get(name)
        if t.shape != (rows, cols):
            raise ModelLoadError(f"tensor {name!r} has shape {t.shape}, expected {(rows, cols)}")
        self.backend.check(t)
        return t

    def experts(self, name: str, n_expert: int, rows: int, cols: int) -> Experts:
        """Each expert's (rows, cols) slice of a stacked (n_expert, rows, cols) weight, viewed in place: its raw
        block rows e * rows .. (e + 1) * rows of the file's (n_expert * rows, row_bytes) data, not a copy."""
        t = self._get(name)
        if t.shape != (n_expert, rows, cols) or t.data.shape[0] != n_expert * rows:
            raise ModelLoadError(f"tensor {name!r} has shape {t.shape}, expected {(n_expert, rows, cols)}")
        self.backend.check(t)
        views = Experts(
            QTensor(f"{name}[{e}]", t.ggml_type, (rows, cols), t.data[e * rows : (e + 1) * rows])
            for e in range(n_expert)
        )
        views.stacked = QTensor(name, t.ggml_type, (n_expert * rows, cols), t.data)  # every expert's rows in turn
        return views

    def vector(self, name: str, n: int, required: bool = True) -> np.ndarray | None:
        if not required and name not in self.tensors:
            return None
        t = self._get(name)
        if t.shape != (n,):
            raise ModelLoadError(f"tensor {name!r} has shape {t.shape}, expected {(n,)}")
        return self.backend.vector(t)

    def array(self, name: str, shape: tuple[int, ...], required: bool = True) -> np.ndarray | None:
        """A small float tensor of any rank (a stack of per-expert biases) as float32 `shape`."""
        if not required and name not in self.tensors:
            return None
        t = self._get(name)
        if t.shape != shape:
            raise ModelLoadError(f"tensor {name!r} has shape {t.shape}, expected {shape}")
        return self.backend.vector(t)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def _get(self, name: str) -> QTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensor(name) from None


# What the forward indexes, as shapes in config dimensions (see `dims`): GGUF name -> (shape, required).
# The loader reads exactly these and localrt.engine.validate checks exactly these against the file.
TensorTable = dict[str, tuple[tuple[str, ...], bool]]

GLOBAL_TENSORS: TensorTable = {
    "token_embd.weight": (("n_vocab", "n_embd"), True),
    "output_norm.weight": (("n_embd",), True),
    "output.weight": (("n_vocab", "n_embd"), False),  # absent: tied to token_embd
    "rope_freqs.weight": (("n_rot_half",), False),
}


def block_tensors(*, biases: bool = False, qk_norm: bool = False, sandwich: bool = False) -> TensorTable:
    """One block's tensors, names minus `blk.N.`; `biases` requires q/k/v biases (qwen2), `qk_norm`/`sandwich` gemma's extras."""
    table: TensorTable = {
        "attn_norm.weight": (("n_embd",), True),
        "attn_q.weight": (("n_q", "n_embd"), True),
        "attn_k.weight": (("n_k", "n_embd"), True),
        "attn_v.weight": (("n_v", "n_embd"), True),
        "attn_output.weight": (("n_embd", "n_o"), True),
        "ffn_norm.weight": (("n_embd",), True),
        "ffn_gate.weight": (("n_ff", "n_embd"), True),
        "ffn_up.weight": (("n_ff", "n_embd"), True),
        "ffn_down.weight": (("n_embd", "n_ff"), True),
        "attn_q.bias": (("n_q",), biases),
        "attn_k.bias": (("n_k",), biases),
        "attn_v.bias": (("n_v",), biases),
        "attn_output.bias": (("n_embd",), False),
    }
    if qk_norm:
        table["attn_q_norm.weight"] = (("head_dim",), True)
        table["attn_k_norm.weight"] = (("head_dim",), True)
    if sandwich:
        table["post_attention_norm.weight"] = (("n_embd",), True)
        table["post_ffw_norm.weight"] = (("n_embd",), True)
    return table


def dims(cfg) -> dict[str, int]:
    """The config dimensions the tensor tables are written in."""
    return {
        "n_vocab": cfg.n_vocab,
        "n_embd": cfg.n_embd,
        "n_head": cfg.n_head,
        "n_q": cfg.n_head * cfg.head_dim,
        "n_k": cfg.n_head_kv * cfg.head_dim,
        "n_v": cfg.n_head_kv * cfg.head_dim_v,
        "n_o": cfg.n_head * cfg.head_dim_v,
        "n_ff": cfg.n_ff,
        "head_dim": cfg.head_dim,
        "n_rot_half": cfg.n_rot // 2,
        "n_qkv": cfg.n_head * cfg.head_dim + cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v),
        "n_ff2": 2 * cfg.n_ff,
        "n_expert": cfg.n_expert,
        "n_ff_exp": cfg.n_ff_exp,
        "n_ctx_train": cfg.n_ctx_train,
        "n_token_types": cfg.n_token_types,
        "n_cls_out": cfg.n_cls_out,
        "n_dense_2_out": cfg.n_dense_2_out,
        "n_dense_3_in": cfg.n_dense_3_in,
    }


def _fetch(src: TensorSource, name: str, shape: tuple[int, ...], required: bool):
    if name.endswith(".bias") and len(shape) > 1:  # biases are float arrays whatever their rank
        return src.array(name, shape, required=required)
    if len(shape) == 3:
        return src.experts(name, *shape) if required or src.has(name) else None
    if len(shape) == 2:
        return src.matrix(name, *shape) if required or src.has(name) else None
    return src.vector(name, shape[0], required=required)


def load_common(
    cfg, src: TensorSource, block: TensorTable, globals_: TensorTable = GLOBAL_TENSORS, extra=None
) -> Weights:
    """The tensors of `globals_` (output tied to token_embd when absent) and, per block, the tensors of `block`
    plus the Layer fields `extra(il)` returns (an arch's split fused tensors)."""
    d = dims(cfg)
    g = {name: _fetch(src, name, tuple(d[k] for k in shape), req) for name, (shape, req) in globals_.items()}
    longrope = g.get("rope_factors_short.weight"), g.get("rope_factors_long.weight")
    freqs = g.get("rope_freqs.weight")
    if freqs is None:
        freqs = longrope[0]
    return Weights(
        token_embd=g["token_embd.weight"],
        output_norm=g["output_norm.weight"],
        output=g["output.weight"] if g.get("output.weight") is not None else g["token_embd.weight"],
        layers=[load_layer(cfg, src, il, block, **(extra(il) if extra else {})) for il in range(cfg.n_layer)],
        rope_freqs=freqs if freqs is not None else np.ones(cfg.n_rot // 2, np.float32),  # (n_rot/2,)
        longrope=longrope if any(f is not None for f in longrope) else None,
    )


def select_rope_factors(w: Weights, cfg, n_ctx: int) -> None:
    """Longrope (phi3): as llama.cpp, a context above rope.scaling.original_context_length rotates with
    rope_factors_long (none if the file has none), else with rope_factors_short; fixed for the loaded model."""
    if w.longrope is not None:
        chosen = w.longrope[1] if n_ctx > cfg.rope_orig_ctx else w.longrope[0]
        w.rope_freqs = chosen if chosen is not None else np.ones(cfg.n_rot // 2, np.float32)  # (n_rot/2,)


def load_layer(cfg, src: TensorSource, il: int, block: TensorTable, **fields) -> Layer:
    """Block il's tensors as a Layer (field = GGUF name minus `.weight`, dots as underscores), plus `fields`."""
    d = dims(cfg)
    for name, (shape, required) in block.items():
        fields[name.removesuffix(".weight").replace(".", "_")] = _fetch(
            src, f"blk.{il}.{name}", tuple(d[k] for k in shape), required
        )
    return Layer(**fields)


def attention(
    be, cfg, w: Weights, L: Layer, il: int, h: np.ndarray, batch: Batch, cache, rope_base: float, freq_scale: float
) -> np.ndarray:
    """Wo . softmax(q k^T * scale + mask) v for h (n_tok, n_embd); keys are stored in cache layer il."""
    n = len(batch)
    # q (n_tok, n_head * head_dim), k (n_tok, n_head_kv * head_dim), v (n_tok, n_head_kv * head_dim_v)
    q, k, v = be.linears((L.attn_q, L.attn_k, L.attn_v), h)
    for x, b in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
        if b is not None:
            be.ops.add_bias(x, b)
    q3 = q.reshape(n, cfg.n_head, cfg.head_dim)
    k3 = k.reshape(n, cfg.n_head_kv, cfg.head_dim)
    if L.attn_q_norm is not None:
        be.ops.rms_norm_heads(q3, L.attn_q_norm, cfg.rms_eps)
        be.ops.rms_norm_heads(k3, L.attn_k_norm, cfg.rms_eps)
    if cfg.rope_yarn:  # YaRN: its magnitude scaling (rope.scaling.attn_factor included) is in the kernel's cos, sin
        be.ops.rope(
            q3, batch.positions, cfg.n_rot, rope_base, freq_scale, w.rope_freqs, cfg.rope_mode, yarn=cfg.rope_yarn
        )
        be.ops.rope(
            k3, batch.positions, cfg.n_rot, rope_base, freq_scale, w.rope_freqs, cfg.rope_mode, yarn=cfg.rope_yarn
        )
    else:
        be.ops.rope(q3, batch.positions, cfg.n_rot, rope_base, freq_scale, w.rope_freqs, cfg.rope_mode)
        be.ops.rope(k3, batch.positions, cfg.n_rot, rope_base, freq_scale, w.rope_freqs, cfg.rope_mode)
    if cfg.rope_attn_factor != 1.0 and not cfg.rope_yarn:  # ggml scales cos and sin: the rotated dims only
        q3[:, :, : cfg.n_rot] *= np.float32(cfg.rope_attn_factor)
        k3[:, :, : cfg.n_rot] *= np.float32(cfg.rope_attn_factor)
    v3 = v.reshape(n, cfg.n_head_kv, cfg.head_dim_v)
    if (
        cache.k[il].dtype == np.uint16
    ):  # float16 bits, what llama.cpp's default F16 cache keeps (NumPy rounds with F16C)
        k3, v3 = k3.astype(np.float16).view(np.uint16), v3.astype(np.float16).view(np.uint16)
    elif cache.as_f16:  # a layer on a device: its float32 cache holds the same float16-rounded values
        k3, v3 = k3.astype(np.float16).astype(np.float32), v3.astype(np.float16).astype(np.float32)
    a = be.xp.empty((n, cfg.n_head, cfg.head_dim_v), np.float32)  # (n_tok, n_head, head_dim_v)
    table = cache.table_of(il)  # (n_slots, max_blocks) for a layer in the paged pool (host only), else None
    if table is None:
        be.ops.kv_store(k3, v3, cache.k[il], cache.v[il], batch.positions, batch.slots)
        be.attention(
            q3,
            cache.k[il],
            cache.v[il],
            batch.positions,
            batch.slots,
            cfg.windows[il],
            cfg.attn_scale,
            a,
            softcap=cfg.attn_softcap,
            sinks=L.attn_sinks,
        )
    else:
        paged.kv_store_paged(k3, v3, cache.k[il], cache.v[il], table, batch.positions, batch.slots)
        be.attention(
            q3,
            cache.k[il],
            cache.v[il],
            batch.positions,
            batch.slots,
            cfg.windows[il],
            cfg.attn_scale,
            a,
            softcap=cfg.attn_softcap,
            table=table,
            sinks=L.attn_sinks,
        )
    out = be.linear(L.attn_output, a.reshape(n, -1))  # (n_tok, n_embd)
    if L.attn_output_bias is not None:
        be.ops.add_bias(out, L.attn_output_bias)
    return out


def gated_ffn(be, L: Layer, m: np.ndarray, act) -> np.ndarray:
    """Wdown . (act(Wgate m) * Wup m) for m (n_tok, n_embd); act is be.ops.swiglu or be.ops.geglu_tanh."""
    gate, up = be.linears((L.ffn_gate, L.ffn_up), m)  # (n_tok, n_ff) each
    act(gate, up, gate)
    return be.linear(L.ffn_down, gate)  # (n_tok, n_embd)
