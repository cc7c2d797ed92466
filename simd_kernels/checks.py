"""Argument checks for the kernels' Python entry points: cheap (shape tuples, one pass over the index arrays),
run once per call, so that a wrong shape or index raises here and no kernel ever reads or writes out of bounds."""

from __future__ import annotations

import math

import numpy as np

from .jit import njit


class KernelArgumentError(ValueError):
    """A kernel was called with an unsupported type, a wrong shape or a wrong dtype."""


def dims(name: str, a, ndim: int) -> tuple[int, ...]:
    """a.shape, which must have ndim dimensions."""
    shape = a.shape
    if len(shape) != ndim:
        raise KernelArgumentError(f"{name} must be {ndim}-D, got shape {shape}")
    return shape


def shape(name: str, a, want: tuple[int, ...]) -> None:
    if a.shape != want:
        raise KernelArgumentError(f"{name} must have shape {want}, got {a.shape}")


def positive(name: str, x) -> None:
    """A finite number > 0 (a rope base, an eps divisor, a softcap)."""
    if not (math.isfinite(x) and x > 0):
        raise KernelArgumentError(f"{name} must be a finite number greater than 0, got {x}")


def kv_dtype(k_cache, v_cache) -> None:
    """KV caches are float32, or uint16 holding float16 bits (an F16 cache), both the same."""
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (np.float32, np.uint16):
        raise KernelArgumentError(
            f"KV caches must both be float32 or uint16 (float16 bits), got {k_cache.dtype}, {v_cache.dtype}"
        )


def rows_index(positions, slots, n_tok: int, n_slots: int) -> int:
    """Checks positions/slots (n_tok,) as kernels index with them; returns the largest position."""
    if positions.shape != (n_tok,) or slots.shape != (n_tok,):
        raise KernelArgumentError(
            f"positions and slots must have shape ({n_tok},), got {positions.shape} and {slots.shape}"
        )
    if n_tok == 0:
        return -1
    p_lo, p_hi, s_lo, s_hi = _bounds(positions, slots)
    if p_lo < 0:
        raise KernelArgumentError(f"positions must be >= 0, got {p_lo}")
    if s_lo < 0 or s_hi >= n_slots:
        raise KernelArgumentError(f"slots must lie in [0, {n_slots}), got {s_lo}..{s_hi}")
    return p_hi


@njit(cache=True, nogil=True)
def _bounds(positions, slots):
    """(min, max) of positions and of slots in one pass: one dispatch instead of four NumPy reductions."""
    p_lo = p_hi = np.int64(positions[0])
    s_lo = s_hi = np.int64(slots[0])
    for t in range(positions.shape[0]):
        p_lo = min(p_lo, np.int64(positions[t]))
        p_hi = max(p_hi, np.int64(positions[t]))
        s_lo = min(s_lo, np.int64(slots[t]))
        s_hi = max(s_hi, np.int64(slots[t]))
    return p_lo, p_hi, s_lo, s_hi


# -- the checks of each simd_kernels.ops entry point (the CUDA backend's ops call the same ones) ----------------


def norm(x, w, eps, out, delta=None) -> None:
    """rms_norm / add_rms_norm: x, out (and delta) (n_tok, n); w (n,); eps > 0."""
    n = dims("x", x, 2)[1]
    shape("w", w, (n,))
    shape("out", out, x.shape)
    if delta is not None:
        shape("delta", delta, x.shape)
    positive("eps", eps)


def norm_heads(x, w, eps) -> None:
    """rms_norm_heads: x (n_tok, n_head, head_dim); w (head_dim,)."""
    shape("w", w, (dims("x", x, 3)[2],))
    positive("eps", eps)


def rope(x, positions, n_rot, base, freq_factors, mode, modes: tuple) -> None:
    """x (n_tok, n_head, head_dim); positions (n_tok,); n_rot even in 2..head_dim; freq_factors (n_rot/2,)."""
    n_tok, _, hd = dims("x", x, 3)
    if not (isinstance(n_rot, (int, np.integer)) and 2 <= n_rot <= hd and n_rot % 2 == 0):
        raise KernelArgumentError(f"n_rot must be even and in 2..head_dim ({hd}), got {n_rot}")
    if mode not in modes:
        raise KernelArgumentError(f"rope mode must be one of {modes}, got {mode}")
    shape("positions", positions, (n_tok,))
    shape("freq_factors", freq_factors, (n_rot // 2,))
    positive("rope base", base)


def bias(x, b) -> None:
    shape("b", b, (dims("x", x, 2)[1],))


def gated(gate, up, out) -> int:
    """swiglu / geglu_tanh: gate, up, out all (n_tok, n_ff); returns n_tok."""
    n_tok = dims("gate", gate, 2)[0]
    shape("up", up, gate.shape)
    shape("out", out, gate.shape)
    return n_tok


def kv_store(k, v, k_cache, v_cache, positions, slots) -> None:
    """k (n_tok, n_kv, hd), v (n_tok, n_kv, hd_v) into caches (n_slots, n_kv, cap, hd[_v]) at slots/positions."""
    n_tok, n_kv, hd = dims("k", k, 3)
    n_slots, _, cap, _ = dims("k_cache", k_cache, 4)
    hd_v = dims("v", v, 3)[2]
    shape("v", v, (n_tok, n_kv, hd_v))
    shape("k_cache", k_cache, (n_slots, n_kv, cap, hd))
    shape("v_cache", v_cache, (n_slots, n_kv, cap, hd_v))
    kv_dtype(k_cache, v_cache)
    if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:  # a store would convert values, not copy float16 bits
        raise KernelArgumentError(f"k, v ({k.dtype}, {v.dtype}) must have the caches' dtype {k_cache.dtype}")
    if cap == 0:
        raise KernelArgumentError("the KV cache holds no positions")
    rows_index(positions, slots, n_tok, n_slots)


def attention(q, k_cache, v_cache, positions, slots, window, out) -> int:
    """q (n_tok, n_head, hd) over caches (n_slots, n_kv, cap, hd[_v]) into out (n_tok, n_head, hd_v); returns n_tok.

    Every query position must still be in the cache: below cap, or (a sliding-window ring) within a window
    that fits the ring."""
    n_tok, n_head, hd = dims("q", q, 3)
    n_slots, n_kv, cap, _ = dims("k_cache", k_cache, 4)
    hd_v = dims("v_cache", v_cache, 4)[3]
    shape("k_cache", k_cache, (n_slots, n_kv, cap, hd))
    shape("v_cache", v_cache, (n_slots, n_kv, cap, hd_v))
    shape("out", out, (n_tok, n_head, hd_v))
    kv_dtype(k_cache, v_cache)
    if n_kv == 0 or n_head % n_kv:
        raise KernelArgumentError(f"{n_head} query heads cannot share {n_kv} KV heads")
    p_max = rows_index(positions, slots, n_tok, n_slots)
    if n_tok and p_max >= cap and (window <= 0 or window > cap):
        raise KernelArgumentError(f"position {p_max} is beyond the {cap} positions the cache holds (window {window})")
    return n_tok
