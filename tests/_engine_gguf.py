"""Tiny random-weight llama / qwen2 / gemma3 GGUF files and a plain NumPy float64 reference forward.

The reference is written in Hugging Face terms, independently of the engine: llama's q/k rows are
un-permuted back to HF order and every model uses rotate_half (NEOX) rope, so the converter's
permutation + NORMAL rope claim is checked too. Files are written with the `gguf` package's writer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import quants


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to U+0100 on."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = 0
    chars = []
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


# A byte-level BPE vocabulary: the 256 byte characters, three merges, and an EOS control token.
MERGES = ["Ġ t", "h e", "Ġt he"]
TOKENS = _gpt2_byte_chars() + ["Ġt", "he", "Ġthe", "<|endoftext|>"]
EOS_ID = len(TOKENS) - 1


@dataclass(frozen=True)
class Spec:
    arch: str = "llama"
    n_vocab: int = len(TOKENS)
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 96
    n_ctx_train: int = 256
    rope_base: float = 10000.0
    eps: float = 1e-5
    window: int = 0  # gemma3 sliding window
    softcap: float = 0.0  # gemma3 final logit softcapping
    wtype: int = 0  # ggml type of the matrices: 0 = F32, 8 = Q8_0
    tied: bool = True
    seed: int = 0


def make_weights(spec: Spec) -> dict[str, np.ndarray]:
    """GGUF-named float32 weights (NumPy order), already as the file will hold them (after quantization)."""
    rng = np.random.default_rng(spec.seed)
    q_out, kv_out = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim

    def mat(rows, cols, scale=None):
        m = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(scale or 1 / math.sqrt(cols))
        if spec.wtype != 0:  # the reference sees exactly the values the file stores
            m = quants.dequantize(quants.quantize(m, spec.wtype), spec.wtype).astype(np.float32)
        return m

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": mat(spec.n_vocab, spec.n_embd, 1.0), "output_norm.weight": norm(spec.n_embd)}
    if not spec.tied:
        w["output.weight"] = mat(spec.n_vocab, spec.n_embd)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(spec.n_embd)
        w[p + "attn_q.weight"] = mat(q_out, spec.n_embd)
        w[p + "attn_k.weight"] = mat(kv_out, spec.n_embd)
        w[p + "attn_v.weight"] = mat(kv_out, spec.n_embd)
        w[p + "attn_output.weight"] = mat(spec.n_embd, q_out)
        w[p + "ffn_norm.weight"] = norm(spec.n_embd)
        w[p + "ffn_gate.weight"] = mat(spec.n_ff, spec.n_embd)
        w[p + "ffn_up.weight"] = mat(spec.n_ff, spec.n_embd)
        w[p + "ffn_down.weight"] = mat(spec.n_embd, spec.n_ff)
        if spec.arch == "qwen2":
            for name, n in (("attn_q", q_out), ("attn_k", kv_out), ("attn_v", kv_out)):
                w[p + name + ".bias"] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if spec.arch == "gemma3":
            w[p + "attn_q_norm.weight"] = norm(spec.head_dim)
            w[p + "attn_k_norm.weight"] = norm(spec.head_dim)
            w[p + "post_attention_norm.weight"] = norm(spec.n_embd)
            w[p + "post_ffw_norm.weight"] = norm(spec.n_embd)
    return w


def add_hparams(wr: gguf.GGUFWriter, spec) -> None:
    """The decoder hyperparameters every tiny model states, from a spec with the fields of `Spec` (also
    `archgen.Case`): sizes, heads, rope base, norm eps; key/value length only where the head size is not
    n_embd / n_head; the sliding window when there is one."""
    wr.add_block_count(spec.n_layer)
    wr.add_context_length(spec.n_ctx_train)
    wr.add_embedding_length(spec.n_embd)
    wr.add_feed_forward_length(spec.n_ff)
    wr.add_head_count(spec.n_head)
    wr.add_head_count_kv(spec.n_head_kv)
    wr.add_rope_freq_base(spec.rope_base)
    wr.add_layer_norm_rms_eps(spec.eps)
    if spec.head_dim != spec.n_embd // spec.n_head:
        wr.add_key_length(spec.head_dim)
        wr.add_value_length(spec.head_dim)
    if spec.window:
        wr.add_sliding_window(spec.window)


def write_model(path: Path, spec: Spec, *, drop: str | None = None, extra: dict | None = None) -> dict[str, np.ndarray]:
    """Write the model to path (leaving out tensor `drop`, for error tests; `extra`: more uint32 metadata);
    returns its weights."""
    weights = make_weights(spec)
    a = spec.arch
    wr = gguf.GGUFWriter(str(path), a)
    add_hparams(wr, spec)
    for key, value in (extra or {}).items():
        wr.add_uint32(key, value)
    if spec.softcap:
        wr.add_float32(f"{a}.final_logit_softcapping", spec.softcap)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("default")
    wr.add_token_list(TOKENS)
    wr.add_token_types([1] * (len(TOKENS) - 1) + [3])
    wr.add_token_merges(MERGES)
    wr.add_eos_token_id(EOS_ID)
    wr.add_bos_token_id(EOS_ID)
    wr.add_add_bos_token(False)
    for name, arr in weights.items():
        if name == drop:
            continue
        if arr.ndim == 2 and spec.wtype != 0:
            raw = quants.quantize(arr, spec.wtype)
            wr.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType(spec.wtype))
        else:
            wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return weights


# -- reference forward (float64, Hugging Face conventions) -------------------------------------------


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _unpermute(w, n_head):
    """GGUF llama q/k rows -> HF order (inverse of the converter's permute)."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _rope_neox(x, pos, base):
    """x (n_tok, n_heads, hd): HF rotate_half rope."""
    hd = x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, hd, 2) / hd)
    ang = pos[:, None] * inv[None, :]  # (n_tok, hd/2)
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    half = hd // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def reference_logits(spec: Spec, weights: dict[str, np.ndarray], ids) -> np.ndarray:
    """Teacher-forced logits (len(ids), n_vocab) float64 of one sequence from position 0."""
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    gemma = spec.arch == "gemma3"
    x = W["token_embd.weight"][ids]
    if gemma:
        x = x * math.sqrt(spec.n_embd)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        local = gemma and spec.window > 0 and il % 6 < 5
        h = _rms(x, W[p + "attn_norm.weight"], spec.eps)
        wq, wk = W[p + "attn_q.weight"], W[p + "attn_k.weight"]
        if spec.arch == "llama":
            wq, wk = _unpermute(wq, spec.n_head), _unpermute(wk, spec.n_head_kv)
        q = h @ wq.T + W.get(p + "attn_q.bias", 0)
        k = h @ wk.T + W.get(p + "attn_k.bias", 0)
        v = h @ W[p + "attn_v.weight"].T + W.get(p + "attn_v.bias", 0)
        q = q.reshape(n, spec.n_head, spec.head_dim)
        k = k.reshape(n, spec.n_head_kv, spec.head_dim)
        v = v.reshape(n, spec.n_head_kv, spec.head_dim)
        if gemma:
            q = _rms(q, W[p + "attn_q_norm.weight"], spec.eps)
            k = _rms(k, W[p + "attn_k_norm.weight"], spec.eps)
        base = 10000.0 if local else spec.rope_base
        q, k = _rope_neox(q, pos, base), _rope_neox(k, pos, base)
        group = spec.n_head // spec.n_head_kv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (n, n_head, hd)
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(spec.head_dim)
        qi, ki = np.arange(n)[:, None], np.arange(n)[None, :]
        visible = ki <= qi
        if local:
            visible &= qi - ki < spec.window
        s = np.where(visible[None], s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", pr, v).reshape(n, -1) @ W[p + "attn_output.weight"].T
        if gemma:
            a = _rms(a, W[p + "post_attention_norm.weight"], spec.eps)
        x = x + a
        m = _rms(x, W[p + "ffn_norm.weight"], spec.eps)
        g, u = m @ W[p + "ffn_gate.weight"].T, m @ W[p + "ffn_up.weight"].T
        act = _gelu_tanh(g) if gemma else g / (1 + np.exp(-g))
        f = (act * u) @ W[p + "ffn_down.weight"].T
        if gemma:
            f = _rms(f, W[p + "post_ffw_norm.weight"], spec.eps)
        x = x + f
    out = W.get("output.weight", W["token_embd.weight"])
    logits = _rms(x, W["output_norm.weight"], spec.eps) @ out.T
    if spec.softcap:
        logits = spec.softcap * np.tanh(logits / spec.softcap)
    return logits
