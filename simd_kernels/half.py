"""Scalar half-precision helpers for nopython code (Numba has no float16 type there)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .jit import njit

_F16_SUBNORMAL_UNIT = np.float32(2.0**-24)  # value of the lowest mantissa bit of an f16 subnormal
_F16_MIN_NORMAL_BITS = np.uint32(0x38800000)  # float32 bits of 2**-14, the smallest normal f16
_F16_OVERFLOW_BITS = np.uint32(0x477FF000)  # float32 bits of 65520: this and above round to f16 inf


@njit(inline="always")
def f16_to_f32(lo, hi):
    """Decode the IEEE binary16 stored little-endian in bytes (lo, hi) to float32, exactly."""
    h = np.uint32(lo) | (np.uint32(hi) << np.uint32(8))
    exponent = h & np.uint32(0x7C00)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    if exponent == 0:
        magnitude = np.float32(h & np.uint32(0x3FF)) * _F16_SUBNORMAL_UNIT
        return -magnitude if sign else magnitude
    if exponent == 0x7C00:
        bits = sign | np.uint32(0x7F800000) | ((h & np.uint32(0x3FF)) << np.uint32(13))
    else:
        # Rebias the exponent from 15 to 127 ((127 - 15) << 23 == 0x38000000).
        bits = sign | (((h & np.uint32(0x7FFF)) << np.uint32(13)) + np.uint32(0x38000000))
    return np.uint32(bits).view(np.float32)


@njit(inline="always")
def bf16_to_f32(lo, hi):
    """Decode the bfloat16 stored little-endian in bytes (lo, hi): the upper half of a float32."""
    bits = (np.uint32(lo) << np.uint32(16)) | (np.uint32(hi) << np.uint32(24))
    return np.uint32(bits).view(np.float32)


@njit(inline="always")
def round_f16(v):
    """float32 -> nearest f16 value (ties to even, as ggml's FP32_TO_FP16), returned as float32."""
    v = np.float32(v)
    u = v.view(np.uint32)
    sign = u & np.uint32(0x80000000)
    a = u & np.uint32(0x7FFFFFFF)
    if a >= np.uint32(0x7F800000):
        return v
    if a >= _F16_OVERFLOW_BITS:
        return np.uint32(sign | np.uint32(0x7F800000)).view(np.float32)
    if a < _F16_MIN_NORMAL_BITS:
        # f16 subnormals are multiples of 2**-24; the scaling is exact, rint ties to even.
        magnitude = np.float32(np.rint(abs(v) * np.float32(2.0**24))) * _F16_SUBNORMAL_UNIT
        return -magnitude if sign else magnitude
    # Keep 10 of float32's 23 mantissa bits, rounding to nearest even on the 13 dropped ones.
    a = (a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return np.uint32(sign | a).view(np.float32)


@njit(inline="always")
def round_bf16(v):
    """float32 -> nearest bfloat16 value (NaN quieted, ties to even, as ggml), returned as float32."""
    v = np.float32(v)
    u = v.view(np.uint32)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint32(u | np.uint32(0x00400000)).view(np.float32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.uint32(u).view(np.float32)


@intrinsic
def kv_f32(typingctx, x):
    """A KV cache element as float32: a float32 as it is, a uint16 as the IEEE binary16 whose bits it holds
    (exact; one vcvtph2ps with F16C, and LLVM vectorizes a loop of them). The F16 cache stores uint16 bits."""
    if x == types.float32:
        return types.float32(x), lambda context, builder, sig, args: args[0]
    if x == types.uint16:

        def codegen(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return types.float32(x), codegen
    return None
