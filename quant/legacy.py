"""Reference quantizers of the 32-element types, as ggml's `quantize_row_*_ref` (byte-exact with it).

Each takes float32 blocks (n_blocks, 32) and returns a structured array (n_blocks,) of the format's dtype.
All arithmetic is float32; the scale is rounded to f16 only when stored, quantization uses the f32 one.
"""

from __future__ import annotations

import numpy as np

from quant._numeric import F32, first_absmax, roundf
from quant.formats import FORMATS, GGMLType


def _blocks(ggml_type: int, n: int) -> np.ndarray:
    return np.zeros(n, dtype=FORMATS[ggml_type].dtype)


def _inverse(d: np.ndarray) -> np.ndarray:
    """`d ? 1/d : 0` per block, as (n, 1) float32."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, F32(0.0), F32(1.0) / d).astype(F32)[:, None]


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 (low 4 bits used) -> (n, 16) bytes: element j low nibble, j+16 high nibble."""
    q = q.astype(np.uint8)
    return (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)


def pack_qh(q: np.ndarray) -> np.ndarray:
    """(n, 32) 5-bit values -> (n,) uint32 whose bit i is bit 4 of element i."""
    bits = (q.astype(np.uint32) >> 4) & 1
    return (bits << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)


def _symmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 / Q5_0: d = max / -(levels/2) with max the signed absmax; q = min(levels-1, trunc(x/d + half+0.5))."""
    half = levels // 2
    d = (first_absmax(x) / F32(-half)).astype(F32)  # (n,)
    q = np.trunc(x * _inverse(d) + F32(half + 0.5))  # (n, 32); a C (int8_t) cast truncates
    return d, np.minimum(q, levels - 1).astype(np.uint8)


def _affine(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 / Q5_1: d = (max-min)/(levels-1), q = trunc((x-min)/d + 0.5), m = min."""
    lo, hi = x.min(axis=1), x.max(axis=1)  # (n,)
    d = ((hi - lo) / F32(levels - 1)).astype(F32)
    q = np.trunc((x - lo[:, None]) * _inverse(d) + F32(0.5))  # (n, 32)
    return d, lo, np.minimum(q, levels - 1).astype(np.uint8)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    b = _blocks(GGMLType.Q4_0, len(x))
    d, q = _symmetric(x, 16)
    b["d"], b["qs"] = d, pack_nibbles(q)
    return b


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    b = _blocks(GGMLType.Q5_0, len(x))
    d, q = _symmetric(x, 32)
    b["d"], b["qh"], b["qs"] = d, pack_qh(q), pack_nibbles(q)
    return b


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    b = _blocks(GGMLType.Q4_1, len(x))
    d, m, q = _affine(x, 16)
    b["d"], b["m"], b["qs"] = d, m, pack_nibbles(q)
    return b


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    b = _blocks(GGMLType.Q5_1, len(x))
    d, m, q = _affine(x, 32)
    b["d"], b["m"], b["qh"], b["qs"] = d, m, pack_qh(q), pack_nibbles(q)
    return b


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """`quantize_row_q8_0_ref`: d = amax/127, q = roundf(x * (1/d)) (half away from zero)."""
    b = _blocks(GGMLType.Q8_0, len(x))
    d = (np.abs(x).max(axis=1) / F32(127)).astype(F32)  # (n,)
    b["d"], b["qs"] = d, roundf(x * _inverse(d))
    return b


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """`quantize_row_q8_1_ref`: Q8_0's quants plus s = f16(d * sum(q))."""
    b = _blocks(GGMLType.Q8_1, len(x))
    d = (np.abs(x).max(axis=1) / F32(127)).astype(F32)  # (n,)
    q = roundf(x * _inverse(d)).astype(np.int8)  # (n, 32)
    b["d"], b["qs"], b["s"] = d, q, q.sum(axis=1, dtype=np.int32).astype(F32) * d
    return b
