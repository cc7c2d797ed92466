"""Fused dequantize x dot for the K-quant super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Weights w: uint8 (rows, n_superblocks * block_bytes), raw GGUF blocks read in place.
Activations x: float32 (n_tok, cols), quantized once per call to Q8_K as llama.cpp does (int8 values,
a float32 scale per 256 and int sums per 16); every sub-block dot product is an exact integer sum.
Q4_K, Q5_K and Q6_K run on kquants_rowdots.py's vector intrinsics (layouts and decoders in kquants_rowdots._K_LAYOUTS);
Q2_K and Q3_K are plain Numba row dots below. All share simd.fused_kernel's loop over tokens and rows.
Output out: float32 (n_tok, rows).
"""

from __future__ import annotations

import numpy as np

from .actquant import QK_K, quantize_q8_k
from .half import f16_to_f32
from .jit import njit
from .kquants_rowdots import K_ROWDOTS
from .simd import fused_kernel, scalar_rowdots

I32 = np.int32  # Numba widens int arithmetic to int64; truncating each step keeps 32-bit SIMD lanes


@njit(inline="always")
def _d(row, o):
    return f16_to_f32(row[o], row[o + 1])


@njit(inline="always")
def _dot_2bit16(row, oq, shift, oh, hbit, xt, xo):
    """Σ v*x over 16 elements: v = (row[oq+i] >> shift) & 3, plus 4 if bit hbit of row[oh+i] (oh >= 0)."""
    s = I32(0)
    for i in range(16):
        v = I32((np.int64(row[oq + i]) >> shift) & 3)
        if oh >= 0:
            v += I32(((np.int64(row[oh + i]) >> hbit) & 1) << 2)
        s = I32(s + v * I32(xt[xo + i]))
    return s


@njit(inline="always")
def _q2k_sums(row, o, xt, xo, bs, bo):
    """One Q2_K super-block of a row: (Σ_g (sc_g & 15) * Σ q*x, Σ_g (sc_g >> 4) * bsum_g)."""
    isum = 0
    msum = 0
    for n in range(2):
        for s in range(4):
            for lh in range(2):
                grp = 8 * n + 2 * s + lh
                sc = I32(row[o + grp])
                part = _dot_2bit16(row, o + 16 + 32 * n + 16 * lh, 2 * s, -1, 0, xt, xo + 128 * n + 32 * s + 16 * lh)
                isum += (sc & 15) * part
                msum += (sc >> 4) * bs[bo + grp]
    return isum, msum


@njit(inline="always")
def _dot_q2_k(row, xq, xd, bsums, t):
    """Q2_K super-block (84 B): scales[16] (4-bit scale | 4-bit min); qs[64]; d, dmin f16 at 80, 82."""
    acc = np.float32(0.0)
    for b in range(xd.shape[1]):
        o = 84 * b
        isum, msum = _q2k_sums(row, o, xq[t], QK_K * b, bsums[t], 16 * b)
        dx = xd[t, b]
        # d*dx*isum - dmin*dx*msum
        acc += _d(row, o + 80) * dx * np.float32(isum) - _d(row, o + 82) * dx * np.float32(msum)
    return acc


@njit(inline="always")
def _q3k_scale(row, o, i):
    """Q3_K 6-bit scale i (0..15), minus 32, from the 12 bytes at row[o:o+12]."""
    low4 = (np.int64(row[o + i]) & 15) if i < 8 else (np.int64(row[o + i - 8]) >> 4)
    hi2 = (np.int64(row[o + 8 + i % 4]) >> (2 * (i // 4))) & 3
    return I32(low4 | (hi2 << 4)) - 32


@njit(inline="always")
def _dot_q3_k(row, xq, xd, bsums, t):
    """Q3_K super-block (110 B): hmask[32]; qs[64]; scales[12]; d f16 at 108; y = d*(sc-32)*q, q in -4..3."""
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
                    part = _dot_2bit16(
                        row,
                        o + 32 + 32 * n + 16 * lh,
                        2 * s,
                        o + 16 * lh,
                        4 * n + s,
                        xt,
                        QK_K * b + 128 * n + 32 * s + 16 * lh,
                    )
                    isum += _q3k_scale(row, o + 96, grp) * (part - 4 * bsums[t, 16 * b + grp])
        acc += _d(row, o + 108) * xd[t, b] * np.float32(isum)
    return acc


def _kernel(name, doc, rowdots, quantize=quantize_q8_k):
    return fused_kernel(f"mul_{name}", doc, quantize, rowdots, __name__)


mul_q2_k = _kernel("q2_k", _dot_q2_k.__doc__, scalar_rowdots(_dot_q2_k))
mul_q3_k = _kernel("q3_k", _dot_q3_k.__doc__, scalar_rowdots(_dot_q3_k))
mul_q4_k = _kernel(
    "q4_k", "Q4_K super-block (144 B): d, dmin f16; scales[12]; qs[128]; y = d*sc*q - dmin*m.", K_ROWDOTS["q4_k"]
)
mul_q5_k = _kernel(
    "q5_k",
    "Q5_K super-block (176 B): d, dmin f16; scales[12]; qh[32]; qs[128]; y = d*sc*q - dmin*m.",
    K_ROWDOTS["q5_k"],
)
mul_q6_k = _kernel(
    "q6_k",
    "Q6_K super-block (210 B): ql[128]; qh[64]; scales int8[16]; d f16; y = d*scale*(q - 32).",
    K_ROWDOTS["q6_k"],
)
