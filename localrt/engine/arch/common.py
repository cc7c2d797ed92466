"""Building blocks shared by the decoder-only architectures: weight lookup, attention, gated FFN."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
    ffn_gate: QTensor
    ffn_up: QTensor
    ffn_down: QTensor
    attn_q_bias: np.ndarray | None = None
    attn_k_bias: np.ndarray | None = None
    attn_v_bias: np.ndarray | None = None
    attn_output_bias: np.ndarray | None = None
    attn_q_norm: np.ndarray | None = None
    attn_k_norm: np.ndarray | None = None
    post_attention_norm: np.ndarray | None = None
    post_ffw_norm: np.ndarray | None = None


@dataclass
class Weights:
    token_embd: QTensor
    output_norm: np.ndarray
    output: QTensor  # token_embd itself when the file ties the output
    layers: list[Layer]
    rope_freqs: np.ndarray  # (n_rot/2,) f32, ones unless the file has rope_freqs
    # Device per layer, then one for output_norm + output (see localrt.engine.backends.offload); empty: all on the model's backend.
    devices: list = field(default_factory=list)


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

    def vector(self, name: str, n: int, required: bool = True) -> np.ndarray | None:
        if not required and name not in self.tensors:
            return None
        t = self._get(name)
        if t.shape != (n,):
            raise ModelLoadError(f"tensor {name!r} has shape {t.shape}, expected {(n,)}")
        return self.backend.vector(t)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def _get(self, name: str) -> QTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensor(name) from None


def load_common(cfg, src: TensorSource, layer_fn) -> Weights:
    """token_embd / output_norm / output (tied when absent) / rope_freqs, and layer_fn(il) per block."""
    embd = src.matrix("token_embd.weight", cfg.n_vocab, cfg.n_embd)
    output = src.matrix("output.weight", cfg.n_vocab, cfg.n_embd) if src.has("output.weight") else embd
    freqs = src.vector("rope_freqs.weight", cfg.n_rot // 2, required=False)
    return Weights(
        token_embd=embd,
        output_norm=src.vector("output_norm.weight", cfg.n_embd),
        output=output,
        layers=[layer_fn(il) for il in range(cfg.n_layer)],
        rope_freqs=freqs if freqs is not None else np.ones(cfg.n_rot // 2, np.float32),
    )


def load_layer(cfg, src: TensorSource, il: int, *, biases: bool = False, qk_norm: bool = False, sandwich: bool = False) -> Layer:
    """Block il's tensors; `biases` requires q/k/v biases (qwen2), `qk_norm`/`sandwich` gemma's extras."""
    p = f"blk.{il}."
    n_q, n_kv = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    n_v = cfg.n_head_kv * cfg.head_dim_v
    layer = Layer(
        attn_norm=src.vector(p + "attn_norm.weight", cfg.n_embd),
        attn_q=src.matrix(p + "attn_q.weight", n_q, cfg.n_embd),
        attn_k=src.matrix(p + "attn_k.weight", n_kv, cfg.n_embd),
        attn_v=src.matrix(p + "attn_v.weight", n_v, cfg.n_embd),
        attn_output=src.matrix(p + "attn_output.weight", cfg.n_embd, cfg.n_head * cfg.head_dim_v),
        ffn_norm=src.vector(p + "ffn_norm.weight", cfg.n_embd),
        ffn_gate=src.matrix(p + "ffn_gate.weight", cfg.n_ff, cfg.n_embd),
        ffn_up=src.matrix(p + "ffn_up.weight", cfg.n_ff, cfg.n_embd),
        ffn_down=src.matrix(p + "ffn_down.weight", cfg.n_embd, cfg.n_ff),
        attn_q_bias=src.vector(p + "attn_q.bias", n_q, required=biases),
        attn_k_bias=src.vector(p + "attn_k.bias", n_kv, required=biases),
        attn_v_bias=src.vector(p + "attn_v.bias", n_v, required=biases),
        attn_output_bias=src.vector(p + "attn_output.bias", cfg.n_embd, required=False),
    )
    if qk_norm:
        layer.attn_q_norm = src.vector(p + "attn_q_norm.weight", cfg.head_dim)
        layer.attn_k_norm = src.vector(p + "attn_k_norm.weight", cfg.head_dim)
    if sandwich:
        layer.post_attention_norm = src.vector(p + "post_attention_norm.weight", cfg.n_embd)
        layer.post_ffw_norm = src.vector(p + "post_ffw_norm.weight", cfg.n_embd)
    return layer


def attention(be, cfg, w: Weights, L: Layer, il: int, h: np.ndarray, batch: Batch, cache, rope_base: float, freq_scale: float) -> np.ndarray:
    """Wo . softmax(q k^T * scale + mask) v for h (n_tok, n_embd); keys are stored in cache layer il."""
    n = len(batch)
    q = be.linear(L.attn_q, h)  # (n_tok, n_head * head_dim)
    k = be.linear(L.attn_k, h)  # (n_tok, n_head_kv * head_dim)
    v = be.linear(L.attn_v, h)  # (n_tok, n_head_kv * head_dim_v)
    for x, b in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
        if b is not None:
            be.ops.add_bias(x, b)
    q3 = q.reshape(n, cfg.n_head, cfg.head_dim)
    k3 = k.reshape(n, cfg.n_head_kv, cfg.head_dim)
    if L.attn_q_norm is not None:
        be.ops.rms_norm_heads(q3, L.attn_q_norm, cfg.rms_eps)
        be.ops.rms_norm_heads(k3, L.attn_k_norm, cfg.rms_eps)
    be.ops.rope(q3, batch.positions, cfg.n_rot, rope_base, freq_scale, w.rope_freqs, cfg.rope_mode)
    be.ops.rope(k3, batch.positions, cfg.n_rot, rope_base, freq_scale, w.rope_freqs, cfg.rope_mode)
    v3 = v.reshape(n, cfg.n_head_kv, cfg.head_dim_v)
    if cache.as_f16:  # what llama.cpp's default F16 cache keeps (NumPy converts with F16C, fast)
        k3, v3 = k3.astype(np.float16).astype(np.float32), v3.astype(np.float16).astype(np.float32)
    be.ops.kv_store(k3, v3, cache.k[il], cache.v[il], batch.positions, batch.slots)
    a = be.xp.empty((n, cfg.n_head, cfg.head_dim_v), np.float32)  # (n_tok, n_head, head_dim_v)
    be.attention(q3, cache.k[il], cache.v[il], batch.positions, batch.slots, cfg.windows[il], cfg.attn_scale, a)
    out = be.linear(L.attn_output, a.reshape(n, -1))  # (n_tok, n_embd)
    if L.attn_output_bias is not None:
        be.ops.add_bias(out, L.attn_output_bias)
    return out


def gated_ffn(be, L: Layer, m: np.ndarray, act) -> np.ndarray:
    """Wdown . (act(Wgate m) * Wup m) for m (n_tok, n_embd); act is be.ops.swiglu or be.ops.geglu_tanh."""
    gate = be.linear(L.ffn_gate, m)  # (n_tok, n_ff)
    up = be.linear(L.ffn_up, m)  # (n_tok, n_ff)
    act(gate, up, gate)
    return be.linear(L.ffn_down, gate)  # (n_tok, n_embd)
