"""float32 exp for nopython loops that LLVM can vectorize: no libm call in the loop body.

`math.exp` on a float32 is a scalar call to libm's expf per element, which keeps a loop scalar: SwiGLU over 8192
gates took 37-40 us and the softmax of a decode step's attention about half its time. llama.cpp computes the same
two functions with its own vectorized exp; this one is ours (Cody-Waite range reduction, a degree-7 Taylor
polynomial by explicit FMAs, 2^n from the exponent bits) and is within 1 ulp of the exact value on the whole float32
range, subnormal results included (tests/test_vmath.py measures it against float64 exp).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

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
