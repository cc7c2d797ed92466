"""Dot kernels for unquantized weights: F32, F16, BF16.

Weights w: uint8 (rows, cols * itemsize), read in place. As in ggml's CPU backend, F16 and BF16
weights dot against activations rounded to the weight type (their vec_dot_type), accumulated in f32.
x: float32 (n_tok, cols); out: float32 (n_tok, rows).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .half import bf16_to_f32, f16_to_f32, round_bf16, round_f16
from .jit import njit
from .rows import group_rows, n_groups

# Lets LLVM reorder the float sums into SIMD lanes; NaN/inf semantics are kept.
_FAST = {"reassoc", "contract"}


@njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
def _mul_f32_values(wf, x, out):
    """wf: float32 (rows, cols); x: float32 (n_tok, cols); out: float32 (n_tok, rows)."""
    n_rows, cols = wf.shape
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for i in range(cols):
                xv = x[t, i]
                a0 += wf[r0, i] * xv
                a1 += wf[r1, i] * xv
                a2 += wf[r2, i] * xv
                a3 += wf[r3, i] * xv
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


@njit(cache=True, nogil=True)
def mul_f32(w, x, out):
    """F32 weights: w viewed as float32 (rows, cols)."""
    _mul_f32_values(w.view(np.float32), x, out)


@njit(cache=True, nogil=True, parallel=True)
def _round_rows(x, to_bf16):
    """x: float32 (n_tok, cols) -> a copy rounded to f16 or bf16 precision."""
    y = np.empty_like(x)  # (n_tok, cols)
    for t in prange(x.shape[0]):
        for i in range(x.shape[1]):
            y[t, i] = round_bf16(x[t, i]) if to_bf16 else round_f16(x[t, i])
    return y


@njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
def mul_f16(w, x, out):
    """F16 weights (2 B each, little-endian)."""
    xr = _round_rows(x, False)
    n_rows = w.shape[0]
    cols = w.shape[1] // 2
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for i in range(cols):
                xv = xr[t, i]
                a0 += f16_to_f32(w[r0, 2 * i], w[r0, 2 * i + 1]) * xv
                a1 += f16_to_f32(w[r1, 2 * i], w[r1, 2 * i + 1]) * xv
                a2 += f16_to_f32(w[r2, 2 * i], w[r2, 2 * i + 1]) * xv
                a3 += f16_to_f32(w[r3, 2 * i], w[r3, 2 * i + 1]) * xv
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


@njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
def mul_bf16(w, x, out):
    """BF16 weights (2 B each, little-endian: the upper half of a float32)."""
    xr = _round_rows(x, True)
    n_rows = w.shape[0]
    cols = w.shape[1] // 2
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for i in range(cols):
                xv = xr[t, i]
                a0 += bf16_to_f32(w[r0, 2 * i], w[r0, 2 * i + 1]) * xv
                a1 += bf16_to_f32(w[r1, 2 * i], w[r1, 2 * i + 1]) * xv
                a2 += bf16_to_f32(w[r2, 2 * i], w[r2, 2 * i + 1]) * xv
                a3 += bf16_to_f32(w[r3, 2 * i], w[r3, 2 * i + 1]) * xv
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3
