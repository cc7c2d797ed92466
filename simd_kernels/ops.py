"""Numba kernels for everything in a transformer layer that is not a weight matmul.

Numerics follow llama.cpp's CPU backend where it matters for agreement: RMSNorm sums squares in
float64, RoPE builds its angles by repeated float32 multiplication, softmax runs in float32.
Every kernel writes into a caller-owned buffer so that the decode step allocates nothing per layer.
Each public function checks the shapes (and index ranges) it will index with, once per call, and raises
KernelArgumentError before a kernel could read or write out of bounds; the @njit kernels (`_name`) check nothing.
"""

from __future__ import annotations

import math

import numpy as np

from . import attend, checks, threads
from .jit import njit
from .vmath import expf, tanhf

ROPE_NORMAL = 0  # pairs (x[2i], x[2i+1]); GGUF llama q/k rows are permuted for this
ROPE_NEOX = 2  # pairs (x[i], x[i + n_rot/2]), as HF rotate_half
# Token rows from which element-wise FFN kernels split over the prefill team: the rows from which a forward's linears
# run on that team too (the backend's BLAS_MIN_TOKENS). Below it the linears run on Numba's threads, and handing a
# SwiGLU to the team's pool between two of them cost more than the SwiGLU itself (docs/measurements.md).
TEAM_MIN_ROWS = 64


def rms_norm(x, w, eps, out):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w.  x, out: (n_tok, n) f32; w: (n,) f32."""
    checks.norm(x, w, eps, out)
    return _rms_norm(x, w, eps, out)


def add_rms_norm(x, delta, w, eps, out):
    """x += delta (the residual), then out = rms_norm(x) * w.  All (n_tok, n) f32 but w (n,)."""
    checks.norm(x, w, eps, out, delta)
    return _add_rms_norm(x, delta, w, eps, out)


def rms_norm_heads(x, w, eps):
    """In place, per head: x (n_tok, n_head, head_dim) f32, w (head_dim,) f32 (gemma3 q/k norms)."""
    checks.norm_heads(x, w, eps)
    return _rms_norm_heads(x, w, eps)


@njit(cache=True, nogil=True)
def _rms_norm(x, w, eps, out):
    n_tok, n = x.shape
    for t in range(n_tok):
        ss = 0.0  # float64 accumulator, as ggml
        for i in range(n):
            ss += np.float64(x[t, i]) * x[t, i]
        scale = np.float32(1.0 / math.sqrt(np.float32(ss / n) + eps))
        for i in range(n):
            out[t, i] = x[t, i] * scale * w[i]
    return out


@njit(cache=True, nogil=True)
def _add_rms_norm(x, delta, w, eps, out):
    n_tok, n = x.shape
    for t in range(n_tok):
        for i in range(n):
            x[t, i] += delta[t, i]
    return _rms_norm(x, w, eps, out)


@njit(cache=True, nogil=True)
def _rms_norm_heads(x, w, eps):
    n_tok, n_head, hd = x.shape
    for t in range(n_tok):
        for h in range(n_head):
            ss = 0.0
            for i in range(hd):
                ss += np.float64(x[t, h, i]) * x[t, h, i]
            scale = np.float32(1.0 / math.sqrt(np.float32(ss / hd) + eps))
            for i in range(hd):
                x[t, h, i] = x[t, h, i] * scale * w[i]
    return x


def rope(x, positions, n_rot, base, freq_scale, freq_factors, mode, yarn=None):
    """Rotate x (n_tok, n_head, head_dim) f32 in place by position (n_tok,) int.

    theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factors[i], the angle built by repeated
    multiplication in float32 as ggml does; dims from n_rot on pass through unchanged.
    freq_factors: (n_rot/2,) f32 (ones when the file has none). n_rot: even, 2..head_dim.
    yarn: None, or (n_ctx_orig, ext_factor, attn_factor, beta_fast, beta_slow), llama.cpp's YaRN parameters
    (see `_rope_yarn`).
    """
    checks.rope(x, positions, n_rot, base, freq_factors, mode, (ROPE_NORMAL, ROPE_NEOX))
    if yarn is None:
        return _rope(x, positions, n_rot, base, freq_scale, freq_factors, mode)
    n_ctx_orig, ext_factor, attn_factor, beta_fast, beta_slow = yarn
    checks.positive("freq_scale", freq_scale)
    low, high = yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast, beta_slow)
    return _rope_yarn(
        x,
        positions,
        n_rot,
        np.float32(base),
        np.float32(freq_scale),
        freq_factors,
        mode,
        np.float32(ext_factor),
        np.float32(attn_factor),
        low,
        high,
    )


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple:
    """YaRN's correction range (low, high) in rotation pairs, in float32 as ggml_rope_yarn_corr_dims: the pairs
    below `low` turn more than beta_fast times over the original context (kept as trained: extrapolated), those
    above `high` fewer than beta_slow times (interpolated by freq_scale), a linear ramp between."""
    f32 = np.float32

    def corr_dim(turns: float) -> np.float32:
        return (
            f32(n_rot)
            * f32(np.log(f32(n_ctx_orig) / (f32(turns) * f32(2) * f32(math.pi))))
            / (f32(2) * f32(np.log(f32(base))))
        )

    low = f32(max(0.0, math.floor(corr_dim(beta_fast))))
    high = f32(min(n_rot - 1, math.ceil(corr_dim(beta_slow))))
    return low, high


# YaRN (ggml's rope_yarn): pair i's angle is pos * base^(-2i/n_rot) / ff_i (extrapolated) mixed with freq_scale times
# it (interpolated) by ramp_i * ext_factor, ramp_i = 1 - clamp((i - low) / max(0.001, high - low), 0, 1); cos and
# sin are scaled by attn_factor * (1 + 0.1 ln(1 / freq_scale)) when ext_factor is not 0. Float32 throughout.
@njit(cache=True, nogil=True)
def _rope_yarn(x, positions, n_rot, base, freq_scale, freq_factors, mode, ext_factor, attn_factor, low, high):
    n_tok, n_head, _ = x.shape
    half = n_rot // 2
    one = np.float32(1.0)
    theta_scale = np.float32(base ** np.float32(-2.0 / n_rot))
    mscale = attn_factor
    if ext_factor != 0:
        mscale = np.float32(mscale * (one + np.float32(0.1) * np.float32(math.log(one / freq_scale))))
    span = max(np.float32(0.001), np.float32(high - low))
    cos = np.empty(half, np.float32)  # (n_rot/2,)
    sin = np.empty(half, np.float32)  # (n_rot/2,)
    for t in range(n_tok):
        theta = np.float32(positions[t])
        for i in range(half):
            extrap = np.float32(theta / freq_factors[i])
            a = np.float32(freq_scale * extrap)  # interpolated
            if ext_factor != 0:
                ramp = one - min(one, max(np.float32(0.0), np.float32((np.float32(i) - low) / span)))
                mix = np.float32(ramp * ext_factor)
                a = np.float32(np.float32(a * (one - mix)) + np.float32(extrap * mix))
            cos[i] = np.float32(math.cos(a)) * mscale
            sin[i] = np.float32(math.sin(a)) * mscale
            theta = np.float32(theta * theta_scale)
        for h in range(n_head):
            for i in range(half):
                if mode == ROPE_NEOX:
                    i0 = i
                    i1 = i + half
                else:
                    i0 = 2 * i
                    i1 = 2 * i + 1
                a = x[t, h, i0]
                b = x[t, h, i1]
                x[t, h, i0] = a * cos[i] - b * sin[i]
                x[t, h, i1] = a * sin[i] + b * cos[i]
    return x


@njit(cache=True, nogil=True)
def _rope(x, positions, n_rot, base, freq_scale, freq_factors, mode):
    n_tok, n_head, _ = x.shape
    half = n_rot // 2
    theta_scale = np.float32(np.float32(base) ** np.float32(-2.0 / n_rot))
    cos = np.empty(half, np.float32)  # (n_rot/2,)
    sin = np.empty(half, np.float32)  # (n_rot/2,)
    for t in range(n_tok):
        theta = np.float32(positions[t])
        for i in range(half):
            a = np.float32(freq_scale * (theta / freq_factors[i]))
            cos[i] = math.cos(a)
            sin[i] = math.sin(a)
            theta = np.float32(theta * theta_scale)
        for h in range(n_head):
            for i in range(half):
                if mode == ROPE_NEOX:
                    i0 = i
                    i1 = i + half
                else:
                    i0 = 2 * i
                    i1 = 2 * i + 1
                a = x[t, h, i0]
                b = x[t, h, i1]
                x[t, h, i0] = a * cos[i] - b * sin[i]
                x[t, h, i1] = a * sin[i] + b * cos[i]
    return x


def add_bias(x, b):
    """x (n_tok, n) += b (n,), in place."""
    checks.bias(x, b)
    return _add_bias(x, b)


@njit(cache=True, nogil=True)
def _add_bias(x, b):
    n_tok, n = x.shape
    for t in range(n_tok):
        for i in range(n):
            x[t, i] += b[i]
    return x


def softmax_rows(x):
    """In place softmax over the last axis of x (n_rows, n) f32."""
    checks.dims("x", x, 2)
    return _softmax_rows(x)


@njit(cache=True, nogil=True)
def _softmax_rows(x):
    for r in range(x.shape[0]):
        m = -np.inf
        for i in range(x.shape[1]):
            m = max(m, x[r, i])
        s = 0.0
        for i in range(x.shape[1]):
            e = np.float32(math.exp(x[r, i] - m))
            x[r, i] = e
            s += e
        inv = np.float32(1.0 / s)
        for i in range(x.shape[1]):
            x[r, i] *= inv
    return x


def swiglu(gate, up, out):
    """out = silu(gate) * up.  All (n_tok, n_ff) f32."""
    return _on_team(_swiglu_rows, gate, up, out)


# error_model="numpy": a float division is not checked for zero (1 + e^-g >= 1), which lets the loop vectorize.
# Callers pass out=gate (in place), and LLVM's runtime overlap check sends a loop that writes out while reading gate
# down its scalar path (several times slower: docs/measurements.md): so silu goes into a buffer of its own first,
# and the second loop multiplies it by up into out. The roundings are the one-loop form's, (g / (1 + e^-g)) * up.
@njit(cache=True, nogil=True, error_model="numpy")
def _swiglu_rows(gate, up, out):
    n_tok, n = gate.shape
    silu = np.empty(n, np.float32)  # (n_ff,) one row's silu(gate)
    for t in range(n_tok):
        for i in range(n):
            g = gate[t, i]
            silu[i] = g / (np.float32(1.0) + expf(-g))  # expf: the loop vectorizes
        for i in range(n):
            out[t, i] = silu[i] * up[t, i]
    return out


SWIGLU_OAI_ALPHA = np.float32(1.702)  # gpt-oss's gated activation (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants)
SWIGLU_OAI_LIMIT = np.float32(7.0)


def swiglu_oai(gate, up, out):
    """gpt-oss's clamped SwiGLU, all (n_tok, n_ff) f32: g = min(gate, 7), u = clamp(up, -7, 7),
    out = g * sigmoid(1.702 g) * (u + 1), as ggml's swiglu_oai."""
    return _on_team(_swiglu_oai_rows, gate, up, out)


# error_model="numpy" and a row buffer first, for the reasons of _swiglu_rows; the roundings are ggml's,
# (g / (1 + e^(alpha * -g))) * (u + 1).
@njit(cache=True, nogil=True, error_model="numpy")
def _swiglu_oai_rows(gate, up, out):
    n_tok, n = gate.shape
    act = np.empty(n, np.float32)  # (n_ff,) one row's g * sigmoid(alpha g)
    one = np.float32(1.0)
    for t in range(n_tok):
        for i in range(n):
            g = min(gate[t, i], SWIGLU_OAI_LIMIT)
            act[i] = g / (one + expf(SWIGLU_OAI_ALPHA * -g))
        for i in range(n):
            u = min(max(up[t, i], -SWIGLU_OAI_LIMIT), SWIGLU_OAI_LIMIT)
            out[t, i] = act[i] * (u + one)
    return out


def _on_team(kernel, gate, up, out):
    """kernel(gate, up, out) on row ranges split over the prefill team; small batches on this thread."""
    _rows_on_team(kernel, checks.gated(gate, up, out), gate, up, out)
    return out


def _rows_on_team(kernel, n_rows: int, *arrays) -> None:
    """kernel(*arrays) on ranges of their first n_rows rows split over the prefill team; under TEAM_MIN_ROWS rows
    on this thread."""
    if n_rows < TEAM_MIN_ROWS:
        kernel(*arrays)
        return
    team = threads.team()
    step = -(-n_rows // team.n)

    def part(i):
        rows = slice(i * step, min(n_rows, (i + 1) * step))
        kernel(*(a[rows] for a in arrays))

    team.run(part)


_GELU_C = np.float32(math.sqrt(2.0 / math.pi))


def geglu_tanh(gate, up, out):
    """out = gelu_tanh(gate) * up, all (n_tok, n_ff) f32, gelu computed in float32 around vmath.tanhf.

    (ggml's float16 GELU lookup table was tried twice: it moved Gemma 3 away from llama.cpp's reference
    logits, top-1 184/188 instead of 187/188, so the reference evidently computes it directly.)
    """
    return _on_team(_geglu_rows, gate, up, out)


# error_model="numpy": tanhf's division is not checked for zero (1 + e^-2u >= 1), which lets the loop vectorize. As in
# _swiglu_rows, gelu goes into a row buffer first (callers pass out=gate, and a loop that writes out while reading gate
# fails LLVM's overlap check and runs scalar, several times slower), with the one-loop form's
# roundings, ((0.5 g) (1 + tanh)) up.
@njit(cache=True, nogil=True, error_model="numpy")
def _geglu_rows(gate, up, out):
    n_tok, n = gate.shape
    gelu = np.empty(n, np.float32)  # (n_ff,) one row's gelu(gate)
    for t in range(n_tok):
        for i in range(n):
            g = gate[t, i]
            inner = _GELU_C * g * (np.float32(1.0) + np.float32(0.044715) * g * g)
            # tanh within float32 rounding of the exact value (libm's tanhf kept the loop scalar; the sigmoid form
            # 1 / (1 + exp(-2u)) moved greedy decoding on Gemma 3 off llama.cpp's path at a near-tie)
            gelu[i] = np.float32(0.5) * g * (np.float32(1.0) + tanhf(inner))
        for i in range(n):
            out[t, i] = gelu[i] * up[t, i]
    return out


def gelu_f16(x, out):
    """out = ggml's GELU of x, both (n_tok, n) f32 (out may be x): the tanh form of the float16-rounded input, rounded
    to float16 (what ggml's lookup table holds), x itself from 10 up and 0 from -10 down; bert's encoders use it."""
    _rows_on_team(_gelu_f16_rows, checks.gated(x, x, out), x, out)
    return out


@njit(inline="always")
def _f16_precision(v):
    """float32 v rounded to float16's 10 mantissa bits (nearest, ties to even), kept as float32 (normal range)."""
    u = np.float32(v).view(np.uint32)
    return np.uint32((u + (np.uint32(0x0FFF) + ((u >> np.uint32(13)) & np.uint32(1)))) & np.uint32(0xFFFFE000)).view(
        np.float32
    )


# error_model="numpy" as in _geglu_rows; a row buffer keeps the loop free of the in-place overlap (out may be x)
@njit(cache=True, nogil=True, error_model="numpy")
def _gelu_f16_rows(x, out):
    n_tok, n = x.shape
    row = np.empty(n, np.float32)  # (n,) one row's result
    for t in range(n_tok):
        for i in range(n):
            v = x[t, i]
            h = _f16_precision(v)
            y = h * h
            y = y * np.float32(0.044715)
            y = y + np.float32(1.0)
            y = y * h
            y = y * _GELU_C
            y = tanhf(y) + np.float32(1.0)
            y = y * h
            y = _f16_precision(y * np.float32(0.5))
            row[i] = v if v >= np.float32(10.0) else (np.float32(0.0) if v <= np.float32(-10.0) else y)
        for i in range(n):
            out[t, i] = row[i]
    return out


def softmax_rows_team(x, split: bool = True):
    """In place softmax over the last axis of x (n_rows, n) f32, C-contiguous, rows split over the prefill team
    (`split`; never from inside a team member): e^x by vmath.expf, the sum in float64 and a multiply by its inverse,
    as ggml's soft_max (the encoders' attention)."""
    checks.dims("x", x, 2)
    if split:
        _rows_on_team(_softmax_exp_rows, x.shape[0], x)
    else:
        _softmax_exp_rows(x)
    return x


# attend.py's softmax: e^x taken at x >= -87 (a masked -inf key gets 1.6e-38 / total, which no sum can see) and the
# exponentials in a loop of their own, so it vectorizes (error_model="numpy")
@njit(cache=True, nogil=True, error_model="numpy")
def _softmax_exp_rows(x):
    floor = np.float32(-87.0)
    for r in range(x.shape[0]):
        row = x[r]
        m = row[0]
        for j in range(1, row.shape[0]):
            m = max(m, row[j])
        for j in range(row.shape[0]):
            row[j] = expf(max(row[j] - m, floor))
        total = 0.0
        for j in range(row.shape[0]):
            total += row[j]
        inv = np.float32(1.0 / total)
        for j in range(row.shape[0]):
            row[j] *= inv
    return x


def kv_store(k, v, k_cache, v_cache, positions, slots):
    """Write k (n_tok, n_kv, head_dim), v (n_tok, n_kv, head_dim_v) into the caches (n_slots, n_kv, cap, head_dim[_v])
    at pos % cap.

    cap is n_ctx for full layers and a ring of window + n_batch for sliding-window layers. k, v and the caches
    share one dtype: float32, or uint16 float16 bits (an F16 cache; the caller rounds).
    """
    checks.kv_store(k, v, k_cache, v_cache, positions, slots)
    return _kv_store(k, v, k_cache, v_cache, positions, slots)


@njit(cache=True, nogil=True)
def _kv_store(k, v, k_cache, v_cache, positions, slots):
    cap = k_cache.shape[2]
    for t in range(k.shape[0]):
        s = slots[t]
        j = positions[t] % cap
        for h in range(k.shape[1]):
            k_cache[s, h, j, :] = k[t, h, :]
            v_cache[s, h, j, :] = v[t, h, :]


def attention(q, k_cache, v_cache, positions, slots, window, scale, out, softcap=0.0, sinks=None):
    """Causal attention of each query token over its own slot's cache.

    q: (n_tok, n_head, head_dim) f32; k_cache/v_cache: (n_slots, n_kv, cap, head_dim) f32, or uint16 holding
    float16 bits (an F16 cache), already holding every key up to each query's position; positions/slots: (n_tok,) int; window: 0 for
    full attention, else a key at p0 is visible to a query at p1 iff p1 - p0 < window.
    out: (n_tok, n_head, head_dim_v) f32.  Query head h reads KV head h // (n_head / n_kv).
    softcap > 0 caps each score s = q.k * scale as softcap * tanh(s / softcap) before the softmax (gemma2).
    sinks: None, or (n_head,) f32 per-head logits that join each softmax's denominator (gpt-oss; see attend.run).
    """
    if checks.attention(q, k_cache, v_cache, positions, slots, window, out) == 0:
        return out
    return attend.run(
        q,
        k_cache,
        v_cache,
        attend.NO_TABLE,
        False,
        positions,
        slots,
        window,
        scale,
        softcap,
        out,
        int(positions.max()),
        sinks,
    )


def softcap(x, cap):
    """In place x = cap * tanh(x / cap), any shape flattened by the caller to 1-D or 2-D; cap > 0."""
    checks.positive("softcap", cap)
    return _softcap(x, cap)


# error_model="numpy" and vmath.tanhf: the loop vectorizes (libm's tanhf kept it scalar, a noticeable share of every
# decode step over Gemma 2's 256k vocabulary: docs/measurements.md)
@njit(cache=True, nogil=True, error_model="numpy")
def _softcap(x, cap):
    flat = x.reshape(-1)
    for i in range(flat.size):
        flat[i] = cap * tanhf(flat[i] / cap)
    return x
