"""Fused dequantize x dot for the K-quant super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Weights w: uint8 (rows, n_superblocks * block_bytes), raw GGUF blocks read in place.
Activations x: float32 (n_tok, cols), quantized once per call to Q8_K as llama.cpp does (int8 values,
a float32 scale per 256 and int sums per 16); every sub-block dot product is an exact integer sum.
Q4_K, Q5_K and Q6_K run on simd.py's vector intrinsics; Q2_K and Q3_K are plain Numba loops.
Output out: float32 (n_tok, rows).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .actquant import QK_K, quantize_q8_k
from .half import f16_to_f32
from .simd import rowdot1_q4_k, rowdot1_q5_k, rowdot1_q6_k, rowdot4_q4_k, rowdot4_q5_k, rowdot4_q6_k

TOKEN_CHUNK = 64  # tokens per pass over the weights: (64, cols) int8 activations stay in L2

I32 = np.int32  # Numba widens int arithmetic to int64; truncating each step keeps 32-bit SIMD lanes


@njit(inline="always")
def _d(w, r, o):
    return f16_to_f32(w[r, o], w[r, o + 1])


@njit(inline="always")
def _k_final(w, r, o, dx, isum, msum):
    """d*dx*isum - dmin*dx*msum for a super-block with d, dmin f16 at o, o+2."""
    return _d(w, r, o) * dx * np.float32(isum) - _d(w, r, o + 2) * dx * np.float32(msum)


@njit(cache=True, nogil=True, parallel=True)
def mul_q4_k(w, x, out):
    """Q4_K super-block (144 B): d, dmin f16; scales[12]; qs[128]; y = d*sc*q - dmin*m."""
    xq, xd, xs = quantize_q8_k(x)  # xs: bsums int32 (n_tok, cols/16)
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            row = w[r]
            t = t0
            while t + 4 <= t1:
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = rowdot4_q4_k(row, xq, xd, xs, t)
                t += 4
            while t < t1:
                (out[t, r],) = rowdot1_q4_k(row, xq, xd, xs, t)
                t += 1


@njit(cache=True, nogil=True, parallel=True)
def mul_q5_k(w, x, out):
    """Q5_K super-block (176 B): d, dmin f16; scales[12]; qh[32]; qs[128]; y = d*sc*q - dmin*m."""
    xq, xd, xs = quantize_q8_k(x)  # xs: bsums int32 (n_tok, cols/16)
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            row = w[r]
            t = t0
            while t + 4 <= t1:
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = rowdot4_q5_k(row, xq, xd, xs, t)
                t += 4
            while t < t1:
                (out[t, r],) = rowdot1_q5_k(row, xq, xd, xs, t)
                t += 1


@njit(cache=True, nogil=True, parallel=True)
def mul_q6_k(w, x, out):
    """Q6_K super-block (210 B): ql[128]; qh[64]; scales int8[16]; d f16; y = d*scale*(q - 32)."""
    xq, xd, xs = quantize_q8_k(x)  # xs: bsums int32 (n_tok, cols/16)
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            row = w[r]
            t = t0
            while t + 4 <= t1:
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = rowdot4_q6_k(row, xq, xd, xs, t)
                t += 4
            while t < t1:
                (out[t, r],) = rowdot1_q6_k(row, xq, xd, xs, t)
                t += 1


@njit(inline="always")
def _dot_2bit16(w, r, oq, shift, oh, hbit, xt, xo):
    """Σ v*x over 16 elements: v = (w[r, oq+i] >> shift) & 3, plus 4 if bit hbit of w[r, oh+i] (oh >= 0)."""
    s = I32(0)
    for i in range(16):
        v = I32((np.int64(w[r, oq + i]) >> shift) & 3)
        if oh >= 0:
            v += I32(((np.int64(w[r, oh + i]) >> hbit) & 1) << 2)
        s = I32(s + v * I32(xt[xo + i]))
    return s


@njit(inline="always")
def _q2k_row(w, r, o, xt, xo, bs, bo):
    """Row r of one Q2_K super-block: (Σ_g (sc_g & 15) * Σ q*x, Σ_g (sc_g >> 4) * bsum_g)."""
    isum = 0
    msum = 0
    for n in range(2):
        for s in range(4):
            for lh in range(2):
                grp = 8 * n + 2 * s + lh
                sc = I32(w[r, o + grp])
                part = _dot_2bit16(w, r, o + 16 + 32 * n + 16 * lh, 2 * s, -1, 0, xt,
                                   xo + 128 * n + 32 * s + 16 * lh)
                isum += (sc & 15) * part
                msum += (sc >> 4) * bs[bo + grp]
    return isum, msum


@njit(cache=True, nogil=True, parallel=True)
def mul_q2_k(w, x, out):
    """Q2_K super-block (84 B): scales[16] (4-bit scale | 4-bit min); qs[64]; d, dmin f16 at 80, 82."""
    xq, xd, bsums = quantize_q8_k(x)
    n_rows = w.shape[0]
    for r in prange(n_rows):
        for t in range(x.shape[0]):
            acc = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 84 * b
                isum, msum = _q2k_row(w, r, o, xq[t], QK_K * b, bsums[t], 16 * b)
                acc += _k_final(w, r, o + 80, xd[t, b], isum, msum)
            out[t, r] = acc


@njit(inline="always")
def _q3k_scale(w, r, o, i):
    """Q3_K 6-bit scale i (0..15), minus 32, from the 12 bytes at w[r, o:o+12]."""
    low4 = (np.int64(w[r, o + i]) & 15) if i < 8 else (np.int64(w[r, o + i - 8]) >> 4)
    hi2 = (np.int64(w[r, o + 8 + i % 4]) >> (2 * (i // 4))) & 3
    return I32(low4 | (hi2 << 4)) - 32


@njit(cache=True, nogil=True, parallel=True)
def mul_q3_k(w, x, out):
    """Q3_K super-block (110 B): hmask[32]; qs[64]; scales[12]; d f16 at 108; y = d*(sc-32)*q, q in -4..3."""
    xq, xd, bsums = quantize_q8_k(x)
    n_rows = w.shape[0]
    for r in prange(n_rows):
        for t in range(x.shape[0]):
            xt = xq[t]
            acc = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 110 * b
                isum = 0
                for n in range(2):
                    for s in range(4):
                        for lh in range(2):
                            grp = 8 * n + 2 * s + lh
                            # q = lo + 4*hbit - 4, so Σ q*x = Σ (lo + 4*hbit)*x - 4*Σ x
                            part = _dot_2bit16(w, r, o + 32 + 32 * n + 16 * lh, 2 * s, o + 16 * lh, 4 * n + s, xt,
                                               QK_K * b + 128 * n + 32 * s + 16 * lh)
                            isum += _q3k_scale(w, r, o + 96, grp) * (part - 4 * bsums[t, 16 * b + grp])
                acc += _d(w, r, o + 108) * xd[t, b] * np.float32(isum)
            out[t, r] = acc
