"""Reference quantizer of MXFP4 (OCP microscaling FP4: E2M1 values under one E8M0 scale per 32), as ggml's
`quantize_row_mxfp4_ref`, which `ggml_quantize_chunk` runs for it (there is no scale search).

Per block: the exponent byte e = floor(log2(amax)) - 2 + 127, so the largest E2M1 value (6) times the scale
2^(e - 127) is 1.5 * 2^floor(log2(amax)) and the top quarter of the range is clipped; then each element gets the
code of the nearest doubled value KVALUES_MXFP4[q] * 2^(e - 128), the first code on a tie (so code 0, never 8,
for zero). Byte-exact with ggml (tests/quant/test_quant_mxfp4.py); nothing in `create --quantize` writes it (see
quant.recipe), it serves tests and tools that build MXFP4 tensors.
"""

from __future__ import annotations

import numpy as np

from quant._numeric import F32
from quant.dequant import e8m0_half
from quant.formats import FORMATS, KVALUES_MXFP4, GGMLType
from quant.iquants import pack_levels

_VALUES = np.array(KVALUES_MXFP4, dtype=F32)  # (16,) the doubled values, as the float the C multiplies


def exponent_bytes(amax: np.ndarray) -> np.ndarray:
    """float32 block absmax (n,) -> the E8M0 byte ggml stores: `(uint8)(floorf(log2f(amax)) - 2 + 127)`, 0 for 0.

    log2 is taken in float64 and rounded to float32, as a correctly rounded log2f: just below a power of two it
    rounds up to the integer, and floor follows it (as in the C). Blocks under 2^-125 give a negative exponent,
    which C's conversion to uint8 wraps modulo 256 on x86 (as here); their codes are then all 0, a zero block."""
    with np.errstate(divide="ignore"):
        log2 = np.log2(amax.astype(np.float64)).astype(F32)  # -inf for amax 0, replaced below
    exp = np.floor(np.where(amax > 0, log2, F32(0))).astype(np.int64) - 2 + 127
    return np.where(amax > 0, exp & 0xFF, 0).astype(np.uint8)


def best_codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's `best_index_mxfp4` per element of x (n, 32) with half-scales d (n,): the code whose doubled value
    times d is nearest in float32, the first one on a tie. A value times a large d may overflow to inf: never
    nearest, as in the C."""
    with np.errstate(over="ignore", invalid="ignore"):
        levels = _VALUES[None, :] * d[:, None]  # (n, 16) exact products of a power of two
        err = np.abs(levels[:, None, :] - x[:, :, None])  # (n, 32, 16)
    return np.argmin(err, axis=-1).astype(np.uint8)  # argmin: the first of equal minima


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """(n, 32) finite float32 -> MXFP4 blocks (n,) structured."""
    out = np.zeros(len(x), dtype=FORMATS[GGMLType.MXFP4].dtype)
    e = exponent_bytes(np.abs(x).max(axis=1))  # (n,)
    out["e"] = e
    out["qs"] = pack_levels(best_codes(x, e8m0_half(e)))
    return out
