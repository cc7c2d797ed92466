"""Fused dequantize x dot for the 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Weights w: uint8 (rows, n_blocks * block_bytes), raw GGUF blocks read in place.
Activations x: float32 (n_tok, cols), quantized once per call to Q8_0 (Q4_0, Q5_0, Q8_0) or Q8_1
(Q4_1, Q5_1) as llama.cpp does; every block dot product is then an exact integer sum.
Output out: float32 (n_tok, rows).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .actquant import QK, quantize_q8_0, quantize_q8_1
from .half import f16_to_f32
from .rows import group_rows, n_groups

I32 = np.int32  # Numba widens int arithmetic to int64; truncating each step keeps 32-bit SIMD lanes


@njit(inline="always")
def _dot4_i8(wi, r0, r1, r2, r3, o, xt, xo):
    """Σ w*x over 32 int8 weights at wi[r, o:o+32] and xt[xo:xo+32], for four rows."""
    s0 = s1 = s2 = s3 = I32(0)
    for i in range(QK):
        xv = I32(xt[xo + i])
        s0 = I32(s0 + I32(wi[r0, o + i]) * xv)
        s1 = I32(s1 + I32(wi[r1, o + i]) * xv)
        s2 = I32(s2 + I32(wi[r2, o + i]) * xv)
        s3 = I32(s3 + I32(wi[r3, o + i]) * xv)
    return s0, s1, s2, s3


@njit(inline="always")
def _dot4_q4(w, r0, r1, r2, r3, o, xt, xo):
    """Σ q*x over one block's 16 nibble bytes at w[r, o:o+16] (low nibble = element j, high = j+16)."""
    s0 = s1 = s2 = s3 = I32(0)
    for j in range(QK // 2):
        xl = I32(xt[xo + j])
        xh = I32(xt[xo + 16 + j])
        b0 = I32(w[r0, o + j])
        b1 = I32(w[r1, o + j])
        b2 = I32(w[r2, o + j])
        b3 = I32(w[r3, o + j])
        s0 = I32(s0 + I32((b0 & 15) * xl) + I32((b0 >> 4) * xh))
        s1 = I32(s1 + I32((b1 & 15) * xl) + I32((b1 >> 4) * xh))
        s2 = I32(s2 + I32((b2 & 15) * xl) + I32((b2 >> 4) * xh))
        s3 = I32(s3 + I32((b3 & 15) * xl) + I32((b3 >> 4) * xh))
    return s0, s1, s2, s3


# _BIT16[byte, k] = 16 * bit k of byte: the fifth-bit contribution, by table lookup rather than
# per-element variable shifts (which Numba would widen to 64-bit lanes).
_BIT16 = ((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1).astype(np.int32) * 16  # (256, 8)


@njit(inline="always")
def _dot4_q5(w, r0, r1, r2, r3, oh, o, xt, xo):
    """Σ q*x over one 5-bit block: nibbles at w[r, o:o+16], fifth bits in the 4 qh bytes at w[r, oh]."""
    s0 = s1 = s2 = s3 = I32(0)
    for k in range(2):
        # qh byte k holds the fifth bits of elements 8k..8k+7, byte k+2 those of elements 16+8k..
        l0 = _BIT16[w[r0, oh + k]]
        l1 = _BIT16[w[r1, oh + k]]
        l2 = _BIT16[w[r2, oh + k]]
        l3 = _BIT16[w[r3, oh + k]]
        h0 = _BIT16[w[r0, oh + k + 2]]
        h1 = _BIT16[w[r1, oh + k + 2]]
        h2 = _BIT16[w[r2, oh + k + 2]]
        h3 = _BIT16[w[r3, oh + k + 2]]
        for jj in range(8):
            j = 8 * k + jj
            xl = I32(xt[xo + j])
            xh = I32(xt[xo + 16 + j])
            b0 = I32(w[r0, o + j])
            b1 = I32(w[r1, o + j])
            b2 = I32(w[r2, o + j])
            b3 = I32(w[r3, o + j])
            s0 = I32(s0 + I32(((b0 & 15) | l0[jj]) * xl) + I32(((b0 >> 4) | h0[jj]) * xh))
            s1 = I32(s1 + I32(((b1 & 15) | l1[jj]) * xl) + I32(((b1 >> 4) | h1[jj]) * xh))
            s2 = I32(s2 + I32(((b2 & 15) | l2[jj]) * xl) + I32(((b2 >> 4) | h2[jj]) * xh))
            s3 = I32(s3 + I32(((b3 & 15) | l3[jj]) * xl) + I32(((b3 >> 4) | h3[jj]) * xh))
    return s0, s1, s2, s3


@njit(inline="always")
def _d(w, r, o):
    return f16_to_f32(w[r, o], w[r, o + 1])


@njit(cache=True, nogil=True, parallel=True)
def mul_q8_0(w, x, out):
    """Q8_0 block (34 B): d f16, qs int8[32]."""
    xq, xd, _ = quantize_q8_0(x)
    wi = w.view(np.int8)
    n_rows = w.shape[0]
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            xt = xq[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 34 * b
                dx = xd[t, b]
                s0, s1, s2, s3 = _dot4_i8(wi, r0, r1, r2, r3, o + 2, xt, QK * b)
                a0 += _d(w, r0, o) * dx * np.float32(s0)
                a1 += _d(w, r1, o) * dx * np.float32(s1)
                a2 += _d(w, r2, o) * dx * np.float32(s2)
                a3 += _d(w, r3, o) * dx * np.float32(s3)
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


@njit(cache=True, nogil=True, parallel=True)
def mul_q4_0(w, x, out):
    """Q4_0 block (18 B): d f16, qs[16]; y = d*(q - 8)."""
    xq, xd, xsum = quantize_q8_0(x)
    n_rows = w.shape[0]
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            xt = xq[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 18 * b
                dx = xd[t, b]
                off = 8 * xsum[t, b]  # Σ (q - 8)*x = Σ q*x - 8*Σ x
                s0, s1, s2, s3 = _dot4_q4(w, r0, r1, r2, r3, o + 2, xt, QK * b)
                a0 += _d(w, r0, o) * dx * np.float32(s0 - off)
                a1 += _d(w, r1, o) * dx * np.float32(s1 - off)
                a2 += _d(w, r2, o) * dx * np.float32(s2 - off)
                a3 += _d(w, r3, o) * dx * np.float32(s3 - off)
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


@njit(cache=True, nogil=True, parallel=True)
def mul_q4_1(w, x, out):
    """Q4_1 block (20 B): d f16, m f16, qs[16]; y = d*q + m, dotted as d*dx*Σq*x + m*s (Q8_1)."""
    xq, xd, xs = quantize_q8_1(x)
    n_rows = w.shape[0]
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            xt = xq[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 20 * b
                dx = xd[t, b]
                sx = xs[t, b]
                s0, s1, s2, s3 = _dot4_q4(w, r0, r1, r2, r3, o + 4, xt, QK * b)
                a0 += _d(w, r0, o) * dx * np.float32(s0) + _d(w, r0, o + 2) * sx
                a1 += _d(w, r1, o) * dx * np.float32(s1) + _d(w, r1, o + 2) * sx
                a2 += _d(w, r2, o) * dx * np.float32(s2) + _d(w, r2, o + 2) * sx
                a3 += _d(w, r3, o) * dx * np.float32(s3) + _d(w, r3, o + 2) * sx
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


@njit(cache=True, nogil=True, parallel=True)
def mul_q5_0(w, x, out):
    """Q5_0 block (22 B): d f16, qh u32, qs[16]; y = d*(q - 16)."""
    xq, xd, xsum = quantize_q8_0(x)
    n_rows = w.shape[0]
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            xt = xq[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 22 * b
                dx = xd[t, b]
                off = 16 * xsum[t, b]  # Σ (q - 16)*x = Σ q*x - 16*Σ x
                s0, s1, s2, s3 = _dot4_q5(w, r0, r1, r2, r3, o + 2, o + 6, xt, QK * b)
                a0 += _d(w, r0, o) * dx * np.float32(s0 - off)
                a1 += _d(w, r1, o) * dx * np.float32(s1 - off)
                a2 += _d(w, r2, o) * dx * np.float32(s2 - off)
                a3 += _d(w, r3, o) * dx * np.float32(s3 - off)
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


@njit(cache=True, nogil=True, parallel=True)
def mul_q5_1(w, x, out):
    """Q5_1 block (24 B): d f16, m f16, qh u32, qs[16]; y = d*q + m (Q8_1 activations)."""
    xq, xd, xs = quantize_q8_1(x)
    n_rows = w.shape[0]
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            xt = xq[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 24 * b
                dx = xd[t, b]
                sx = xs[t, b]
                s0, s1, s2, s3 = _dot4_q5(w, r0, r1, r2, r3, o + 4, o + 8, xt, QK * b)
                a0 += _d(w, r0, o) * dx * np.float32(s0) + _d(w, r0, o + 2) * sx
                a1 += _d(w, r1, o) * dx * np.float32(s1) + _d(w, r1, o + 2) * sx
                a2 += _d(w, r2, o) * dx * np.float32(s2) + _d(w, r2, o + 2) * sx
                a3 += _d(w, r3, o) * dx * np.float32(s3) + _d(w, r3, o + 2) * sx
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3
