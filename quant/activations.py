"""Activation quantizers exactly as llama.cpp's x86 CPU backend runs them before a quantized dot product.

These are the references the SIMD kernels' own activation quantization is tested against.
- Q8_0 / Q8_1 (AVX/AVX2 path of `quantize_row_q8_0` / `quantize_row_q8_1`): id = 127/amax (not 1/d) and
  round half to even; d = amax/127 stored as f16; Q8_1 adds s = f16(d * sum(q)).
- Q8_K (`quantize_row_q8_K_ref`, used on x86 too): iscale = -127/max with max the signed absmax, so the
  largest element becomes exactly -127 and d = 1/iscale has the sign opposite to max; bsums are sums of
  16 consecutive quants. An all-zero block gets d = 0, qs = 0 and (unlike ggml, which leaves them
  unwritten) bsums = 0.
Each takes float32 blocks (n_blocks, block_size) and returns a structured array (n_blocks,).
"""

from __future__ import annotations

import numpy as np

from quant._numeric import F32, first_absmax, nearest_int
from quant.formats import FORMATS, GGMLType


def _q8_avx(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 32) -> d (n,) float32 and q (n, 32) int8 as the AVX code computes them."""
    amax = np.abs(x).max(axis=1)  # (n,)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)  # (n,)
    return (amax / F32(127)).astype(F32), np.rint(x * inv[:, None]).astype(np.int8)


def quantize_act_q8_0(x: np.ndarray) -> np.ndarray:
    b = np.zeros(len(x), dtype=FORMATS[GGMLType.Q8_0].dtype)
    b["d"], b["qs"] = _q8_avx(x)
    return b


def quantize_act_q8_1(x: np.ndarray) -> np.ndarray:
    b = np.zeros(len(x), dtype=FORMATS[GGMLType.Q8_1].dtype)
    d, q = _q8_avx(x)
    b["d"], b["qs"], b["s"] = d, q, d * q.sum(axis=1, dtype=np.int32).astype(F32)
    return b


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """(n, 256) -> Q8_K blocks, `quantize_row_q8_K_ref`."""
    b = np.zeros(len(x), dtype=FORMATS[GGMLType.Q8_K].dtype)
    mx = first_absmax(x)  # (n,) signed
    live = mx != 0
    with np.errstate(divide="ignore"):
        iscale = np.where(live, F32(-127) / mx, F32(0)).astype(F32)  # (n,)
        b["d"] = np.where(live, F32(1) / iscale, F32(0))
    q = np.minimum(127, nearest_int(iscale[:, None] * x)).astype(np.int8)  # (n, 256)
    b["qs"] = q
    b["bsums"] = q.reshape(len(x), 16, 16).sum(axis=2, dtype=np.int16)
    return b


ACTIVATION_QUANTIZERS = {
    GGMLType.Q8_0: quantize_act_q8_0,
    GGMLType.Q8_1: quantize_act_q8_1,
    GGMLType.Q8_K: quantize_q8_k,
}
