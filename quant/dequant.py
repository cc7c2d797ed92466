"""Reference dequantizers: one slow, obvious NumPy function per block format, vectorised over blocks.

Each takes the blocks as a structured array `b` (n_blocks,) of the format's dtype and returns float32
(n_blocks, block_size). Products are formed in the same order as ggml's `dequantize_row_*`
(e.g. `(d*sc)*q - dmin*m`), so results are bit-identical to it.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np

from quant.formats import FORMATS, KVALUES_IQ4NL, KVALUES_MXFP4, GGMLType, QuantError, get_format, row_bytes

_CHUNK_BLOCKS = 1 << 16  # blocks dequantized per step; bounds temporaries for huge tensors


def _f32(half: np.ndarray) -> np.ndarray:
    """An f16 (or f32) field (n_blocks,) as float32 (n_blocks, 1), ready to broadcast over a block."""
    return half.astype(np.float32)[:, None]


def _nibbles_split(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32): the 16 low nibbles are elements 0..15, the high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _qh_bits(qh: np.ndarray) -> np.ndarray:
    """(n,) uint32 -> (n, 32) uint8: bit i is the 5th bit of element i."""
    return ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _f32_plain(b: np.ndarray) -> np.ndarray:
    return b["x"].astype(np.float32)[:, None]


def _bf16(b: np.ndarray) -> np.ndarray:
    # bf16 is the top half of an f32
    return (b["x"].astype(np.uint32) << 16).view(np.float32)[:, None]


def _q4_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles_split(b["qs"]).astype(np.int8) - np.int8(8)  # (n, 32) in -8..7
    return _f32(b["d"]) * q.astype(np.float32)


def _q4_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles_split(b["qs"]).astype(np.float32)  # (n, 32) in 0..15
    return _f32(b["d"]) * q + _f32(b["m"])


def _q5(b: np.ndarray) -> np.ndarray:
    """5-bit unsigned quants (n, 32) in 0..31 of Q5_0 / Q5_1."""
    return _nibbles_split(b["qs"]) | (_qh_bits(b["qh"]) << 4)


def _q5_0(b: np.ndarray) -> np.ndarray:
    q = _q5(b).astype(np.int8) - np.int8(16)  # (n, 32) in -16..15
    return _f32(b["d"]) * q.astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
    return _f32(b["d"]) * _q5(b).astype(np.float32) + _f32(b["m"])


def _q8(b: np.ndarray) -> np.ndarray:
    """Q8_0, Q8_1 and Q8_K: d * qs (Q8_1's s and Q8_K's bsums only serve dot products)."""
    return _f32(b["d"]) * b["qs"].astype(np.float32)


def _q2_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    # element 128h + 32s + l is bit pair s of qs[32h + l]
    q = (b["qs"].reshape(n, 2, 1, 32) >> shifts) & 3  # (n, 2 halves, 4 shifts, 32)
    q = q.reshape(n, 16, 16).astype(np.float32)  # (n, sub-block, element); sub-block = element // 16
    sc = b["scales"]  # (n, 16): low nibble scale, high nibble min
    dl = b["d"].astype(np.float32)[:, None] * (sc & 0x0F).astype(np.float32)  # (n, 16)
    ml = b["dmin"].astype(np.float32)[:, None] * (sc >> 4).astype(np.float32)  # (n, 16)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(n, 256)


def q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """(n, 12) packed -> (n, 16) signed 6-bit scales (already minus 32)."""
    i = np.arange(16)
    low4 = np.where(i < 8, scales[:, i % 8] & 0x0F, scales[:, i % 8] >> 4)  # (n, 16)
    hi2 = (scales[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 3  # (n, 16)
    return (low4 | (hi2 << 4)).astype(np.int8) - np.int8(32)


def _q3_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    lo = (b["qs"].reshape(n, 2, 1, 32) >> shifts) & 3  # (n, 2 halves, 4 shifts, 32)
    hbit_shift = np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)  # bit 4h + s of hmask[l]
    hbit = (b["hmask"].reshape(n, 1, 1, 32) >> hbit_shift) & 1  # (n, 2, 4, 32)
    # a set high bit means "no offset"; a clear one subtracts 4, so q is in -4..3
    q = lo.astype(np.int8) - ((1 - hbit) * 4).astype(np.int8)
    q = q.reshape(n, 16, 16).astype(np.float32)  # (n, sub-block, element)
    dl = b["d"].astype(np.float32)[:, None] * q3_k_scales(b["scales"]).astype(np.float32)  # (n, 16)
    return (dl[:, :, None] * q).reshape(n, 256)


def k4_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) packed Q4_K/Q5_K scales -> 6-bit scales (n, 8) and mins (n, 8), as uint8."""
    s = scales
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, mn


def _k4_affine(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """y = (d*sc)*q - dmin*m over 8 sub-blocks of 32; q is (n, 8, 32) float32."""
    n = len(b)
    sc, mn = k4_scales_mins(b["scales"])
    dl = b["d"].astype(np.float32)[:, None] * sc.astype(np.float32)  # (n, 8)
    ml = b["dmin"].astype(np.float32)[:, None] * mn.astype(np.float32)  # (n, 8)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(n, 256)


def _k4_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) -> (n, 8, 32): per 64-element chunk c, 32 low nibbles (sub-block 2c) then 32 high (2c+1)."""
    n = len(qs)
    q = qs.reshape(n, 4, 1, 32)
    return np.concatenate([q & 0x0F, q >> 4], axis=2).reshape(n, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    return _k4_affine(b, _k4_nibbles(b["qs"]).astype(np.float32))


def _q5_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    # bit k of qh[l] is the 5th bit of element 32k + l
    hbit = (b["qh"].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # (n, 8, 32)
    q = _k4_nibbles(b["qs"]) | (hbit << 4)
    return _k4_affine(b, q.astype(np.float32))


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    ql = b["ql"].reshape(n, 2, 2, 32)  # (n, half, first/second 32 bytes, l)
    low4 = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # (n, half, 4 groups of 32, l)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    hi2 = (b["qh"].reshape(n, 2, 1, 32) >> shifts) & 3  # (n, half, 4 groups of 32, l)
    q = (low4 | (hi2 << 4)).astype(np.int8) - np.int8(32)  # (n, 2, 4, 32) in -32..31
    q = q.reshape(n, 16, 16).astype(np.float32)  # (n, sub-block, element)
    dl = b["d"].astype(np.float32)[:, None] * b["scales"].astype(np.float32)  # (n, 16)
    return (dl[:, :, None] * q).reshape(n, 256)


_KVALUES = np.array(KVALUES_IQ4NL, dtype=np.int8)  # (16,) index -> level


def _iq4_nl(b: np.ndarray) -> np.ndarray:
    q = _KVALUES[_nibbles_split(b["qs"])]  # (n, 32) levels in -127..113
    return _f32(b["d"]) * q.astype(np.float32)


def iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """(n,) IQ4_XS blocks -> (n, 8) signed sub-block scales ls - 32, in -32..31."""
    j = np.arange(8)
    low4 = (b["scales_l"][:, j // 2] >> (4 * (j % 2)).astype(np.uint8)) & 0x0F  # (n, 8)
    hi2 = (b["scales_h"][:, None] >> (2 * j).astype(np.uint16)) & 3  # (n, 8)
    return (low4 | (hi2.astype(np.uint8) << 4)).astype(np.int8) - np.int8(32)


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    n = len(b)
    q = _KVALUES[_nibbles_split(b["qs"].reshape(n * 8, 16))].reshape(n, 8, 32)  # (n, sub-block, element)
    dl = b["d"].astype(np.float32)[:, None] * iq4_xs_scales(b).astype(np.float32)  # (n, 8)
    return (dl[:, :, None] * q.astype(np.float32)).reshape(n, 256)


_KVALUES_MXFP4 = np.array(KVALUES_MXFP4, dtype=np.int8)  # (16,) code -> doubled E2M1 value


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """E8M0 exponent bytes (n,) -> float32 (n,) 2^(e - 128), half the scale 2^(e - 127) they encode, as ggml's
    GGML_E8M0_TO_FP32_HALF: e = 0 and 1 give the subnormals 2^-128 and 2^-127, 255 gives 2^127 (ggml reads no NaN)."""
    e = e.astype(np.uint32)
    subnormal = np.uint32(0x00200000) << np.minimum(e, np.uint32(1))  # mantissa bit 21 (2^-128) or 22 (2^-127)
    normal = (np.maximum(e, np.uint32(1)) - np.uint32(1)) << np.uint32(23)  # biased exponent e - 1
    return np.where(e < 2, subnormal, normal).astype(np.uint32).view(np.float32)


def _mxfp4(b: np.ndarray) -> np.ndarray:
    q = _KVALUES_MXFP4[_nibbles_split(b["qs"])]  # (n, 32) doubled values in -12..12
    return q.astype(np.float32) * e8m0_half(b["e"])[:, None]


DEQUANTIZERS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.F32: _f32_plain,
    GGMLType.F16: _f32_plain,
    GGMLType.BF16: _bf16,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8,
    GGMLType.Q8_1: _q8,
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
    GGMLType.IQ4_NL: _iq4_nl,
    GGMLType.IQ4_XS: _iq4_xs,
    GGMLType.MXFP4: _mxfp4,
    GGMLType.Q8_K: _q8,
}
assert DEQUANTIZERS.keys() == FORMATS.keys()


def dequantize(data: np.ndarray, ggml_type: int, shape) -> np.ndarray:
    """Raw blocks (uint8, any shape, rows of whole blocks) -> float32 array of `shape` (NumPy order)."""
    fmt = get_format(ggml_type)
    shape = tuple(int(s) for s in np.atleast_1d(np.asarray(shape, dtype=np.int64)))
    if not shape or min(shape) <= 0:
        raise QuantError(f"bad tensor shape {shape} for {fmt.name}")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        raise QuantError(
            f"{fmt.name} data must be a uint8 array of raw blocks, got {type(data).__name__}"
            f"{'' if not isinstance(data, np.ndarray) else ' of ' + str(data.dtype)}"
        )
    want = prod(shape[:-1]) * row_bytes(fmt.ggml_type, shape[-1])
    if data.size != want:
        raise QuantError(f"{fmt.name} tensor of shape {shape} needs {want} bytes, got {data.size}")
    blocks = np.ascontiguousarray(data).reshape(-1).view(fmt.dtype)  # (n_blocks,) structured
    out = np.empty((len(blocks), fmt.block_size), dtype=np.float32)  # (n_blocks, block_size)
    fn = DEQUANTIZERS[fmt.ggml_type]
    with np.errstate(invalid="ignore", over="ignore"):  # inf/nan scales in a file dequantize as ggml does
        for start in range(0, len(blocks), _CHUNK_BLOCKS):
            out[start : start + _CHUNK_BLOCKS] = fn(blocks[start : start + _CHUNK_BLOCKS])
    return out.reshape(shape)
