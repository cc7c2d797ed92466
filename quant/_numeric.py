"""The C float idioms ggml's quantizers rely on, reproduced exactly in float32 NumPy."""

from __future__ import annotations

import numpy as np

from quant.formats import QuantError

F32 = np.float32
_MAGIC = F32(12582912.0)  # 1.5 * 2**23: adding it leaves round(v) in the low mantissa bits


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's `nearest_int`: the magic-number trick (round half to even for |v| < 2**22), as int32."""
    bits = (np.asarray(v, dtype=F32) + _MAGIC).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def roundf(v: np.ndarray) -> np.ndarray:
    """C `roundf`: round half away from zero, exactly (v - trunc(v) is exact in binary floating point)."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= F32(0.5), np.sign(v), F32(0.0)).astype(v.dtype)


def seqsum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis strictly left to right in float32, as a C `for` loop accumulates."""
    return np.add.accumulate(a, axis=-1, dtype=F32)[..., -1]


def via_f16(v: np.ndarray) -> np.ndarray:
    """The float32 a value becomes after being stored as ggml_half and read back."""
    return np.asarray(v, dtype=F32).astype(np.float16).astype(F32)


def first_absmax(x: np.ndarray) -> np.ndarray:
    """Per row of x (..., n): the signed element of largest |x|, the first one on ties.

    As C's `max = 0; if (ax > amax) {amax = ax; max = x;}`: a row of zeros gives +0.0 even if they are -0.0.
    """
    idx = np.argmax(np.abs(x), axis=-1)[..., None]
    mx = np.take_along_axis(x, idx, axis=-1)[..., 0]
    return np.where(mx == 0, np.zeros_like(mx), mx)


def require_finite(x: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(x)):
        bad = np.flatnonzero(~np.isfinite(x.reshape(-1)))[0]
        raise QuantError(f"cannot quantize to {what}: element {bad} is {x.reshape(-1)[bad]}")
