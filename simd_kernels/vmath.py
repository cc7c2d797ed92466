"""float32 exp and tanh for nopython loops that LLVM can vectorize: no libm call in the loop body.

`math.exp` on a float32 is a scalar call to libm's expf per element, which keeps a loop scalar: SwiGLU and the
softmax of a decode step's attention were slow for it (docs/measurements.md). llama.cpp computes the same
two functions with its own vectorized exp; this one is ours (Cody-Waite range reduction, a degree-7 Taylor
polynomial by explicit FMAs, 2^n from the exponent bits) and is within 1 ulp of the exact value on the whole float32
range, subnormal results included (tests/simd_kernels/test_vmath.py measures it against float64 exp).

`tanhf` is GELU's tanh (Gemma's GeGLU). libm's tanhf kept that loop scalar, a large share of a Gemma 3 prompt's
time; this one runs in a vectorized loop, several times faster, and is closer to the exact value than libm's: it
works in float64 and rounds once, so it gives the correctly rounded float32 on all but ~1e-5 of inputs (1 ulp off
there), where glibc 2.36's tanhf is off by 1-2 ulp on a quarter of them (tests/simd_kernels/test_vmath.py).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit import njit

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693145751953125)  # ln 2 in 16 significant bits: n * _LN2_HI is exact for |n| < 2^8
_LN2_LO = np.float32(1.4286067653e-06)  # ln 2 - _LN2_HI
_X_MAX = np.float32(88.72283935546875)  # above this exp overflows float32
_X_MIN = np.float32(-103.97208404541016)  # below this exp rounds to 0 (half the smallest subnormal)
# 1/k! for k = 7 .. 2: e^r on |r| <= ln2/2 to 5e-9 relative, under the 6e-8 of float32 rounding
_C7 = np.float32(1.0 / 5040.0)
_C6 = np.float32(1.0 / 720.0)
_C5 = np.float32(1.0 / 120.0)
_C4 = np.float32(1.0 / 24.0)
_C3 = np.float32(1.0 / 6.0)
_C2 = np.float32(0.5)
_ONE = np.float32(1.0)


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c for float32, rounded once (llvm.fma: a vfmadd, and LLVM vectorizes a loop of them). Explicit, so
    a kernel's fastmath flags cannot change where the roundings are: the bits are the same in every kernel."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        return builder.call(fn, args)

    return types.float32(a, b, c), codegen


@njit(inline="always")
def expf(x):
    """e^x for a float32 x, as float32: inf above _X_MAX, 0 below _X_MIN, NaN for NaN."""
    x = np.float32(x)
    xc = min(max(x, _X_MIN), _X_MAX)  # NaN: max/min give the bound; restored below
    n = np.float32(np.rint(xc * _LOG2E))
    r = fma32(-n, _LN2_HI, xc)  # exact: n * _LN2_HI needs no rounding
    r = fma32(-n, _LN2_LO, r)  # |r| <= ln2/2 (+ a rounding)
    p = fma32(_C7, r, _C6)
    p = fma32(p, r, _C5)
    p = fma32(p, r, _C4)
    p = fma32(p, r, _C3)
    p = fma32(p, r, _C2)
    p = fma32(p, r, _ONE)
    p = fma32(p, r, _ONE)  # e^r in [0.70, 1.42]: float32 exponent 126 or 127
    ni = np.int32(n)  # -150 .. 128
    half = ni >> np.int32(1)  # -75 .. 64: p * 2^half by adding to p's exponent bits stays a normal number
    scaled = np.uint32(np.float32(p).view(np.uint32) + (half << np.int32(23))).view(np.float32)
    # the rest, 2^(n - half) with n - half in -75 .. 64, from its exponent bits: the one rounding (a subnormal
    # result) is this multiply
    y = scaled * np.uint32((ni - half + np.int32(127)) << np.int32(23)).view(np.float32)
    if x > _X_MAX:
        y = np.float32(np.inf)
    if x < _X_MIN:
        y = np.float32(0.0)
    if x != x:
        y = x
    return y


# tanh(u) = u * sum_k T[k] u^2k, its Taylor series (T[k] = 2^(2k+2) (2^(2k+2) - 1) B(2k+2) / (2k+2)!), 11 terms: on
# |u| < 0.55 the terms shrink by (2u/pi)^2 < 0.123 each, so the first left out is under 1e-10 relative
_TANH_T = (
    1.0,
    -1 / 3,
    2 / 15,
    -17 / 315,
    62 / 2835,
    -1382 / 155925,
    21844 / 6081075,
    -929569 / 638512875,
    6404582 / 10854718875,
    -443861162 / 1856156927625,
    18888466084 / 194896477400625,
)
_TANH_SMALL = 0.55  # below: the series; above: (1 - e^-2u) / (1 + e^-2u), with e^-2u <= 0.333 (no cancellation)
_TANH_ONE = 10.0  # tanh(u) rounds to 1.0f from u = 9.01: e^-2u is taken at min(u, 10)


@njit(inline="always")
def tanhf(x):
    """tanh(x) for a float32 x, as float32, computed in float64 and rounded once; +-1 for +-inf, NaN for NaN.

    Above _TANH_SMALL, e^-2u = (e^(-2u/32))^32 with e^y on y in [-0.625, 0] from its Taylor polynomial of degree 14
    (error under 7e-16), squared five times (x32 relative error): the float64 result is within ~3e-14 of tanh,
    which only a float32 rounding tie that close can notice. No fma, no table, no bit tricks: the same bits on
    every CPU, and every step a plain float64 operation that LLVM widens to vector lanes (the kernel must use
    error_model="numpy", or the division's zero check keeps the loop scalar)."""
    a = abs(np.float64(x))
    s = a * a
    p = _TANH_T[10]
    p = p * s + _TANH_T[9]
    p = p * s + _TANH_T[8]
    p = p * s + _TANH_T[7]
    p = p * s + _TANH_T[6]
    p = p * s + _TANH_T[5]
    p = p * s + _TANH_T[4]
    p = p * s + _TANH_T[3]
    p = p * s + _TANH_T[2]
    p = p * s + _TANH_T[1]
    p = p * s + _TANH_T[0]
    small = a * p
    y = (a if a < _TANH_ONE else _TANH_ONE) * (-2.0 / 32.0)  # in [-0.625, 0]
    q = 1.0 / 87178291200.0  # 1/14!
    q = q * y + 1.0 / 6227020800.0
    q = q * y + 1.0 / 479001600.0
    q = q * y + 1.0 / 39916800.0
    q = q * y + 1.0 / 3628800.0
    q = q * y + 1.0 / 362880.0
    q = q * y + 1.0 / 40320.0
    q = q * y + 1.0 / 5040.0
    q = q * y + 1.0 / 720.0
    q = q * y + 1.0 / 120.0
    q = q * y + 1.0 / 24.0
    q = q * y + 1.0 / 6.0
    q = q * y + 0.5
    q = q * y + 1.0
    q = q * y + 1.0  # e^y
    q = q * q
    q = q * q
    q = q * q
    q = q * q
    q = q * q  # e^(32 y) = e^-2a
    large = (1.0 - q) / (1.0 + q)
    t = small if a < _TANH_SMALL else large
    y32 = np.float32(math.copysign(t, np.float64(x)))
    if x != x:
        y32 = np.float32(x)
    return y32
