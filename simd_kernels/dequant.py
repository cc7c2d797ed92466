"""Row dequantizers: raw GGUF blocks of selected rows -> float32, for embedding lookup and for the
tiles that prefill hands to BLAS. Arithmetic follows the reference dequantizers term by term.

Every public kernel: w uint8 (rows, row_bytes), ids int64 (n,) row indices, out float32 (n, cols).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .half import bf16_to_f32, f16_to_f32
from .jit import njit

# The 16 levels of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl): a 4-bit index q stands for KVALUES_IQ4NL[q].
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_KV = np.array(KVALUES_IQ4NL, dtype=np.float32)  # (16,) the levels as the float they multiply
# MXFP4's E2M1 values doubled (ggml's kvalues_mxfp4): code q stands for KVALUES_MXFP4[q] * 2^(e - 128).
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
_KV_MXFP4 = np.array(KVALUES_MXFP4, dtype=np.float32)  # (16,)


@njit(inline="always")
def _d(w, r, o):
    return f16_to_f32(w[r, o], w[r, o + 1])


@njit(inline="always")
def _row_f32(w, r, y):
    y[:] = w[r].view(np.float32)


@njit(inline="always")
def _row_f16(w, r, y):
    for i in range(y.shape[0]):
        y[i] = f16_to_f32(w[r, 2 * i], w[r, 2 * i + 1])


@njit(inline="always")
def _row_bf16(w, r, y):
    for i in range(y.shape[0]):
        y[i] = bf16_to_f32(w[r, 2 * i], w[r, 2 * i + 1])


@njit(inline="always")
def _row_q8_0(w, r, y):
    wi = w.view(np.int8)
    for b in range(y.shape[0] // 32):
        o = 34 * b
        d = _d(w, r, o)
        for i in range(32):
            y[32 * b + i] = d * np.float32(wi[r, o + 2 + i])


@njit(inline="always")
def _row_q4(w, r, y, bb, oq, has_min, five, oh):
    """Shared 32-element nibble layouts: Q4_0 (bb=18), Q4_1 (20), Q5_0 (22), Q5_1 (24)."""
    for b in range(y.shape[0] // 32):
        o = bb * b
        d = _d(w, r, o)
        m = _d(w, r, o + 2) if has_min else np.float32(0.0)
        qh = 0
        if five:
            qh = (
                np.int64(w[r, o + oh])
                | (np.int64(w[r, o + oh + 1]) << 8)
                | (np.int64(w[r, o + oh + 2]) << 16)
                | (np.int64(w[r, o + oh + 3]) << 24)
            )
        offset = 0 if has_min else (16 if five else 8)  # symmetric types centre q on zero
        for j in range(16):
            byte = np.int64(w[r, o + oq + j])
            lo = (byte & 15) | (((qh >> j) & 1) << 4)
            hi = (byte >> 4) | (((qh >> (j + 16)) & 1) << 4)
            if has_min:
                y[32 * b + j] = d * np.float32(lo) + m
                y[32 * b + 16 + j] = d * np.float32(hi) + m
            else:
                y[32 * b + j] = d * np.float32(lo - offset)
                y[32 * b + 16 + j] = d * np.float32(hi - offset)


@njit(inline="always")
def _scale_min_k4(w, r, o, j):
    if j < 4:
        return w[r, o + j] & 63, w[r, o + j + 4] & 63
    return ((w[r, o + j + 4] & 15) | ((w[r, o + j - 4] >> 6) << 4), (w[r, o + j + 4] >> 4) | ((w[r, o + j] >> 6) << 4))


@njit(inline="always")
def _row_q45_k(w, r, y, bb, five):
    """Q4_K (bb=144) and Q5_K (bb=176, fifth bits in qh[32] at 16, qs at 48)."""
    oq = 48 if five else 16
    for b in range(y.shape[0] // 256):
        o = bb * b
        d = _d(w, r, o)
        dmin = _d(w, r, o + 2)
        for c in range(4):
            sc, m = _scale_min_k4(w, r, o + 4, 2 * c)
            d1 = d * np.float32(sc)
            m1 = dmin * np.float32(m)
            sc, m = _scale_min_k4(w, r, o + 4, 2 * c + 1)
            d2 = d * np.float32(sc)
            m2 = dmin * np.float32(m)
            for l in range(32):
                byte = w[r, o + oq + 32 * c + l]
                lo = np.int64(byte & 15)
                hi = np.int64(byte >> 4)
                if five:
                    hb = np.int64(w[r, o + 16 + l])
                    lo += ((hb >> (2 * c)) & 1) << 4
                    hi += ((hb >> (2 * c + 1)) & 1) << 4
                y[256 * b + 64 * c + l] = d1 * np.float32(lo) - m1
                y[256 * b + 64 * c + 32 + l] = d2 * np.float32(hi) - m2


@njit(inline="always")
def _row_q6_k(w, r, y):
    for b in range(y.shape[0] // 256):
        o = 210 * b
        d = _d(w, r, o + 208)
        for n in range(2):
            for l in range(32):
                h = np.int64(w[r, o + 128 + 32 * n + l])
                qa = np.int64(w[r, o + 64 * n + l])
                qb = np.int64(w[r, o + 64 * n + 32 + l])
                q = (
                    (qa & 15) | ((h & 3) << 4),
                    (qb & 15) | (((h >> 2) & 3) << 4),
                    (qa >> 4) | (((h >> 4) & 3) << 4),
                    (qb >> 4) | (((h >> 6) & 3) << 4),
                )
                for k in range(4):
                    sc = np.float32(np.int8(w[r, o + 192 + 8 * n + 2 * k + l // 16]))
                    y[256 * b + 128 * n + 32 * k + l] = d * sc * np.float32(q[k] - 32)


@njit(inline="always")
def _q3k_scale(w, r, o, i):
    low4 = (np.int64(w[r, o + i]) & 15) if i < 8 else (np.int64(w[r, o + i - 8]) >> 4)
    hi2 = (np.int64(w[r, o + 8 + i % 4]) >> (2 * (i // 4))) & 3
    return np.int64(low4 | (hi2 << 4)) - 32


@njit(inline="always")
def _row_q23_k(w, r, y, three):
    """Q2_K (84 B) and Q3_K (110 B): 16 sub-blocks of 16, 2-bit quants (plus a high bit for Q3_K)."""
    bb = 110 if three else 84
    for b in range(y.shape[0] // 256):
        o = bb * b
        d = _d(w, r, o + 108) if three else _d(w, r, o + 80)
        dmin = np.float32(0.0) if three else _d(w, r, o + 82)
        oq = o + 32 if three else o + 16
        for n in range(2):
            for s in range(4):
                for lh in range(2):
                    grp = 8 * n + 2 * s + lh
                    if three:
                        dl = d * np.float32(_q3k_scale(w, r, o + 96, grp))
                        ml = np.float32(0.0)
                    else:
                        dl = d * np.float32(w[r, o + grp] & 15)
                        ml = dmin * np.float32(w[r, o + grp] >> 4)
                    for i in range(16):
                        l = 16 * lh + i
                        q = (np.int64(w[r, oq + 32 * n + l]) >> (2 * s)) & 3
                        if three and not ((w[r, o + l] >> (4 * n + s)) & 1):
                            q -= 4
                        y[256 * b + 128 * n + 32 * s + l] = dl * np.float32(q) - ml


@njit(inline="always")
def _iq4_levels(w, r, oq, dl, y, e):
    """y[e:e+32] = dl * level of the 32 nibbles in w[r, oq:oq+16] (low nibbles first, then high)."""
    for j in range(16):
        byte = w[r, oq + j]
        y[e + j] = dl * _KV[byte & 15]
        y[e + 16 + j] = dl * _KV[byte >> 4]


@njit(inline="always")
def _row_iq4_nl(w, r, y):
    """IQ4_NL block (18 B): d f16, qs[16]; y = d * KVALUES_IQ4NL[q]."""
    for b in range(y.shape[0] // 32):
        _iq4_levels(w, r, 18 * b + 2, _d(w, r, 18 * b), y, 32 * b)


@njit(inline="always")
def _row_iq4_xs(w, r, y):
    """IQ4_XS super-block (136 B): d f16, scales_h u16, scales_l[4], qs[128]; y = d*(ls - 32)*KVALUES_IQ4NL[q]."""
    for b in range(y.shape[0] // 256):
        o = 136 * b
        d = _d(w, r, o)
        sh = np.int64(w[r, o + 2]) | (np.int64(w[r, o + 3]) << 8)
        for j in range(8):
            ls = ((np.int64(w[r, o + 4 + j // 2]) >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)
            _iq4_levels(w, r, o + 8 + 16 * j, d * np.float32(ls - 32), y, 256 * b + 32 * j)


@njit(inline="always")
def e8m0_half(e):
    """An E8M0 exponent byte -> float32 2^(e - 128), half its scale (GGML_E8M0_TO_FP32_HALF): 0 and 1 give the
    subnormals 2^-128 and 2^-127 (mantissa bit 21 or 22), others the normal with biased exponent e - 1."""
    e = np.uint32(e)
    if e < 2:
        return np.uint32(np.uint32(0x00200000) << e).view(np.float32)
    return np.uint32((e - np.uint32(1)) << np.uint32(23)).view(np.float32)


@njit(inline="always")
def _row_mxfp4(w, r, y):
    """MXFP4 block (17 B): e (E8M0), qs[16]; y = KVALUES_MXFP4[q] * 2^(e - 128), the code's nibbles as IQ4_NL's."""
    for b in range(y.shape[0] // 32):
        o = 17 * b
        d = e8m0_half(w[r, o])
        for j in range(16):
            byte = w[r, o + 1 + j]
            y[32 * b + j] = _KV_MXFP4[byte & 15] * d
            y[32 * b + 16 + j] = _KV_MXFP4[byte >> 4] * d


@njit(cache=True, nogil=True, parallel=True)
def rows_f32(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_f32(w, ids[k], out[k])


@njit(cache=True, nogil=True, parallel=True)
def rows_f16(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_f16(w, ids[k], out[k])


@njit(cache=True, nogil=True, parallel=True)
def rows_bf16(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_bf16(w, ids[k], out[k])


@njit(cache=True, nogil=True, parallel=True)
def rows_q8_0(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q8_0(w, ids[k], out[k])


@njit(cache=True, nogil=True, parallel=True)
def rows_q4_0(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q4(w, ids[k], out[k], 18, 2, False, False, 0)


@njit(cache=True, nogil=True, parallel=True)
def rows_q4_1(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q4(w, ids[k], out[k], 20, 4, True, False, 0)


@njit(cache=True, nogil=True, parallel=True)
def rows_q5_0(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q4(w, ids[k], out[k], 22, 6, False, True, 2)


@njit(cache=True, nogil=True, parallel=True)
def rows_q5_1(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q4(w, ids[k], out[k], 24, 8, True, True, 4)


@njit(cache=True, nogil=True, parallel=True)
def rows_q2_k(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q23_k(w, ids[k], out[k], False)


@njit(cache=True, nogil=True, parallel=True)
def rows_q3_k(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q23_k(w, ids[k], out[k], True)


@njit(cache=True, nogil=True, parallel=True)
def rows_q4_k(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q45_k(w, ids[k], out[k], 144, False)


@njit(cache=True, nogil=True, parallel=True)
def rows_q5_k(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q45_k(w, ids[k], out[k], 176, True)


@njit(cache=True, nogil=True, parallel=True)
def rows_q6_k(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_q6_k(w, ids[k], out[k])


@njit(cache=True, nogil=True, parallel=True)
def rows_iq4_nl(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_iq4_nl(w, ids[k], out[k])


@njit(cache=True, nogil=True, parallel=True)
def rows_iq4_xs(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_iq4_xs(w, ids[k], out[k])


@njit(cache=True, nogil=True, parallel=True)
def rows_mxfp4(w, ids, out):
    for k in prange(ids.shape[0]):
        _row_mxfp4(w, ids[k], out[k])
