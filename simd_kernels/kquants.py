"""Fused dequantize x dot for the K-quant super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Weights w: uint8 (rows, n_superblocks * block_bytes), raw GGUF blocks read in place.
Activations x: float32 (n_tok, cols), quantized once per call to Q8_K as llama.cpp does (int8 values,
a float32 scale per 256 and int sums per 16); every sub-block dot product is an exact integer sum.
Output out: float32 (n_tok, rows).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .actquant import QK_K, quantize_q8_k
from .half import f16_to_f32
from .rows import group_rows, n_groups

I32 = np.int32  # Numba widens int arithmetic to int64; truncating each step keeps 32-bit SIMD lanes


@njit(inline="always")
def _d(w, r, o):
    return f16_to_f32(w[r, o], w[r, o + 1])


@njit(inline="always")
def _scale_min_k4(w, r, o, j):
    """Q4_K/Q5_K 6-bit scale and min j (0..7) from the 12 packed bytes at w[r, o:o+12]."""
    if j < 4:
        return I32(w[r, o + j] & 63), I32(w[r, o + j + 4] & 63)
    sc = (w[r, o + j + 4] & 15) | ((w[r, o + j - 4] >> 6) << 4)
    m = (w[r, o + j + 4] >> 4) | ((w[r, o + j] >> 6) << 4)
    return I32(sc), I32(m)


@njit(inline="always")
def _nib_step(b, xl, xh, slo, shi):
    return I32(slo + I32(b & 15) * xl), I32(shi + I32(b >> 4) * xh)


@njit(inline="always")
def _dot4_nib32(w, r0, r1, r2, r3, o, xt, xo):
    """Low nibbles of w[r, o:o+32] . xt[xo:xo+32] and high nibbles . xt[xo+32:xo+64], four rows."""
    l0 = h0 = l1 = h1 = l2 = h2 = l3 = h3 = I32(0)
    for i in range(32):
        xl = I32(xt[xo + i])
        xh = I32(xt[xo + 32 + i])
        l0, h0 = _nib_step(I32(w[r0, o + i]), xl, xh, l0, h0)
        l1, h1 = _nib_step(I32(w[r1, o + i]), xl, xh, l1, h1)
        l2, h2 = _nib_step(I32(w[r2, o + i]), xl, xh, l2, h2)
        l3, h3 = _nib_step(I32(w[r3, o + i]), xl, xh, l3, h3)
    return l0, h0, l1, h1, l2, h2, l3, h3


@njit(inline="always")
def _q4k_row(w, r, o, c, lo, hi, isum):
    """Add chunk c's scaled low/high sub-block sums of row r (Q4_K/Q5_K scales at o+4) to isum."""
    sc_lo, _ = _scale_min_k4(w, r, o + 4, 2 * c)
    sc_hi, _ = _scale_min_k4(w, r, o + 4, 2 * c + 1)
    return isum + sc_lo * lo + sc_hi * hi


@njit(inline="always")
def _kmins(w, r, o, bs, bo):
    """Σ_j m_j * (activation sum of sub-block j) for a Q4_K/Q5_K super-block; bs: int32 sums of 16."""
    msum = 0
    for j in range(8):
        _, m = _scale_min_k4(w, r, o + 4, j)
        msum += m * (bs[bo + 2 * j] + bs[bo + 2 * j + 1])
    return msum


@njit(inline="always")
def _k_final(w, r, o, dx, isum, msum):
    """d*dx*isum - dmin*dx*msum for a Q4_K/Q5_K/Q2_K-style super-block (d, dmin f16 at o, o+2)."""
    return _d(w, r, o) * dx * np.float32(isum) - _d(w, r, o + 2) * dx * np.float32(msum)


@njit(cache=True, nogil=True, parallel=True)
def mul_q4_k(w, x, out):
    """Q4_K super-block (144 B): d, dmin f16; scales[12]; qs[128]; y = d*sc*q - dmin*m."""
    xq, xd, bsums = quantize_q8_k(x)
    n_rows = w.shape[0]
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            xt = xq[t]
            bs = bsums[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 144 * b
                i0 = i1 = i2 = i3 = 0
                for c in range(4):
                    l0, h0, l1, h1, l2, h2, l3, h3 = _dot4_nib32(w, r0, r1, r2, r3, o + 16 + 32 * c, xt,
                                                                 QK_K * b + 64 * c)
                    i0 = _q4k_row(w, r0, o, c, l0, h0, i0)
                    i1 = _q4k_row(w, r1, o, c, l1, h1, i1)
                    i2 = _q4k_row(w, r2, o, c, l2, h2, i2)
                    i3 = _q4k_row(w, r3, o, c, l3, h3, i3)
                dx = xd[t, b]
                a0 += _k_final(w, r0, o, dx, i0, _kmins(w, r0, o, bs, 16 * b))
                a1 += _k_final(w, r1, o, dx, i1, _kmins(w, r1, o, bs, 16 * b))
                a2 += _k_final(w, r2, o, dx, i2, _kmins(w, r2, o, bs, 16 * b))
                a3 += _k_final(w, r3, o, dx, i3, _kmins(w, r3, o, bs, 16 * b))
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


# _BIT16[byte, k] = 16 * bit k of byte, by table lookup rather than per-element variable shifts.
_BIT16 = ((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1).astype(np.int32) * 16  # (256, 8)


@njit(inline="always")
def _q5_step(b, hb, k, xl, xh, slo, shi):
    """One qs byte b with its qh byte hb; bits k and k+1 of hb are the fifth bits of lo / hi."""
    lo = I32(b & 15) + I32(((hb >> k) & 1) << 4)
    hi = I32(b >> 4) + I32(((hb >> (k + 1)) & 1) << 4)
    return I32(slo + lo * xl), I32(shi + hi * xh)


@njit(inline="always")
def _dot4_q5k(w, r0, r1, r2, r3, oh, o, c, xt, xo):
    """Q5_K chunk c: 5-bit low/high halves of w[r, o:o+32] (fifth bits in w[r, oh:oh+32]) . x."""
    l0 = h0 = l1 = h1 = l2 = h2 = l3 = h3 = I32(0)
    k = 2 * c
    for i in range(32):
        xl = I32(xt[xo + i])
        xh = I32(xt[xo + 32 + i])
        l0, h0 = _q5_step(I32(w[r0, o + i]), I32(w[r0, oh + i]), k, xl, xh, l0, h0)
        l1, h1 = _q5_step(I32(w[r1, o + i]), I32(w[r1, oh + i]), k, xl, xh, l1, h1)
        l2, h2 = _q5_step(I32(w[r2, o + i]), I32(w[r2, oh + i]), k, xl, xh, l2, h2)
        l3, h3 = _q5_step(I32(w[r3, o + i]), I32(w[r3, oh + i]), k, xl, xh, l3, h3)
    return l0, h0, l1, h1, l2, h2, l3, h3


@njit(cache=True, nogil=True, parallel=True)
def mul_q5_k(w, x, out):
    """Q5_K super-block (176 B): d, dmin f16; scales[12]; qh[32]; qs[128]; y = d*sc*q - dmin*m."""
    xq, xd, bsums = quantize_q8_k(x)
    n_rows = w.shape[0]
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            xt = xq[t]
            bs = bsums[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 176 * b
                i0 = i1 = i2 = i3 = 0
                for c in range(4):
                    l0, h0, l1, h1, l2, h2, l3, h3 = _dot4_q5k(w, r0, r1, r2, r3, o + 16, o + 48 + 32 * c, c,
                                                               xt, QK_K * b + 64 * c)
                    i0 = _q4k_row(w, r0, o, c, l0, h0, i0)
                    i1 = _q4k_row(w, r1, o, c, l1, h1, i1)
                    i2 = _q4k_row(w, r2, o, c, l2, h2, i2)
                    i3 = _q4k_row(w, r3, o, c, l3, h3, i3)
                dx = xd[t, b]
                a0 += _k_final(w, r0, o, dx, i0, _kmins(w, r0, o, bs, 16 * b))
                a1 += _k_final(w, r1, o, dx, i1, _kmins(w, r1, o, bs, 16 * b))
                a2 += _k_final(w, r2, o, dx, i2, _kmins(w, r2, o, bs, 16 * b))
                a3 += _k_final(w, r3, o, dx, i3, _kmins(w, r3, o, bs, 16 * b))
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


@njit(inline="always")
def _q6_step(ql_a, ql_b, h, x0, x1, x2, x3, s0, s1, s2, s3):
    """Unsigned 6-bit values (0..63) of one l position: four elements 32 apart."""
    s0 = I32(s0 + I32((ql_a & 15) | ((h & 3) << 4)) * x0)
    s1 = I32(s1 + I32((ql_b & 15) | (((h >> 2) & 3) << 4)) * x1)
    s2 = I32(s2 + I32((ql_a >> 4) | (((h >> 4) & 3) << 4)) * x2)
    s3 = I32(s3 + I32((ql_b >> 4) | (((h >> 6) & 3) << 4)) * x3)
    return s0, s1, s2, s3


@njit(inline="always")
def _dot4_q6(w, r, oql, oqh, xt, xo, l0):
    """Row r, one half of a Q6_K super-block, positions l0..l0+15: the four unsigned group sums."""
    s0 = s1 = s2 = s3 = I32(0)
    for i in range(16):
        l = l0 + i
        s0, s1, s2, s3 = _q6_step(I32(w[r, oql + l]), I32(w[r, oql + 32 + l]), I32(w[r, oqh + l]),
                                  I32(xt[xo + l]), I32(xt[xo + 32 + l]), I32(xt[xo + 64 + l]),
                                  I32(xt[xo + 96 + l]), s0, s1, s2, s3)
    return s0, s1, s2, s3


@njit(inline="always")
def _q6_row(w, r, o, n, lh, bs, bo, sums):
    """Σ scale_g * (Σ q*x - 32*Σx) over the four 16-groups (k = 0..3) of half n, l-half lh."""
    s0, s1, s2, s3 = sums
    osc = o + 192 + 8 * n + lh
    g = bo + 8 * n + lh  # bsums index of group (n, k=0, lh); k steps by 2
    total = np.int32(np.int8(w[r, osc])) * (s0 - 32 * bs[g])
    total += np.int32(np.int8(w[r, osc + 2])) * (s1 - 32 * bs[g + 2])
    total += np.int32(np.int8(w[r, osc + 4])) * (s2 - 32 * bs[g + 4])
    total += np.int32(np.int8(w[r, osc + 6])) * (s3 - 32 * bs[g + 6])
    return total


@njit(cache=True, nogil=True, parallel=True)
def mul_q6_k(w, x, out):
    """Q6_K super-block (210 B): ql[128]; qh[64]; scales int8[16]; d f16; y = d*scale*(q - 32)."""
    xq, xd, bsums = quantize_q8_k(x)
    n_rows = w.shape[0]
    for g in prange(n_groups(n_rows)):
        r0, r1, r2, r3 = group_rows(g, n_rows)
        for t in range(x.shape[0]):
            xt = xq[t]
            bs = bsums[t]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for b in range(xd.shape[1]):
                o = 210 * b
                i0 = i1 = i2 = i3 = 0
                for n in range(2):
                    for lh in range(2):
                        oql = o + 64 * n
                        oqh = o + 128 + 32 * n
                        xo = QK_K * b + 128 * n
                        i0 += _q6_row(w, r0, o, n, lh, bs, 16 * b, _dot4_q6(w, r0, oql, oqh, xt, xo, 16 * lh))
                        i1 += _q6_row(w, r1, o, n, lh, bs, 16 * b, _dot4_q6(w, r1, oql, oqh, xt, xo, 16 * lh))
                        i2 += _q6_row(w, r2, o, n, lh, bs, 16 * b, _dot4_q6(w, r2, oql, oqh, xt, xo, 16 * lh))
                        i3 += _q6_row(w, r3, o, n, lh, bs, 16 * b, _dot4_q6(w, r3, oql, oqh, xt, xo, 16 * lh))
                dx = xd[t, b]
                a0 += _d(w, r0, o + 208) * dx * np.float32(i0)
                a1 += _d(w, r1, o + 208) * dx * np.float32(i1)
                a2 += _d(w, r2, o + 208) * dx * np.float32(i2)
                a3 += _d(w, r3, o + 208) * dx * np.float32(i3)
            out[t, r0] = a0
            out[t, r1] = a1
            out[t, r2] = a2
            out[t, r3] = a3


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
