"""Random weight blocks for the simd_kernels tests (and the engine's, which run the same kernels): the formats' ids,
the ones whose kernel tests run with the slow tests, and `random_weights`, blocks with finite scales."""

from __future__ import annotations

import numpy as np
import pytest

import quant

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16, MXFP4 = 10, 11, 12, 13, 14, 20, 23, 30, 39
ALL = [Q8_0, Q4_1, Q4_K, Q5_0, Q6_K, F32, Q4_0, Q5_1, Q2_K, Q3_K, Q5_K, F16, BF16, IQ4_NL, IQ4_XS, MXFP4]
# No built-in model, and no model a test of the README's run loads, holds Q2_K, Q3_K, Q4_0 or Q5_K: their kernel tests
# run with the slow ones, each format's on one worker. What they cost the README's run was each kernel's cold compile
# (5-9 s of CPU; docs/measurements.md), 40 s of the cold run's 350 s of compiles (tests/_compile_log.py).
SLOW_COMPILE = (Q2_K, Q3_K, Q4_0, Q5_K)
NAMES = {Q2_K: "q2_k", Q3_K: "q3_k", Q4_0: "q4_0", Q5_K: "q5_k"}


def formats(types, ids=None):
    """types as pytest params, those of SLOW_COMPILE marked slow (each on one xdist worker)."""
    return [
        pytest.param(t, marks=[pytest.mark.slow, pytest.mark.xdist_group(f"compile-{t}")], id=i)
        if t in SLOW_COMPILE
        else pytest.param(t, id=i)
        for t, i in zip(types, ids or [None] * len(types))
    ]


ALL_KERNELS = formats(ALL)
# byte offsets of the f16 scales inside each block: random bytes there could be inf/NaN
SCALE_OFFSETS = {
    Q4_0: [0],
    Q4_1: [0, 2],
    Q5_0: [0],
    Q5_1: [0, 2],
    Q8_0: [0],
    Q2_K: [80, 82],
    Q3_K: [108],
    Q4_K: [0, 2],
    Q5_K: [0, 2],
    Q6_K: [208],
    IQ4_NL: [0],
    IQ4_XS: [0],
}
# byte offsets of the E8M0 exponent bytes: random ones could scale a block to 2^127 (inf, or NaN against a zero sum)
E8M0_OFFSETS = {MXFP4: [0]}


def random_weights(rng, t: int, rows: int, cols: int, *, writeable: bool = False) -> np.ndarray:
    """uint8 (rows, row_bytes): random blocks with finite f16 scales; read-only unless asked, as the mmap'd weights
    are, so the raw kernels compile the one variant the engine uses (a writable array is a second Numba type)."""
    w = _random_weights(rng, t, rows, cols)
    w.flags.writeable = writeable
    return w


def _random_weights(rng, t: int, rows: int, cols: int) -> np.ndarray:
    if t == F32:
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    if t == F16:
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if t == BF16:
        return (
            (rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16)
            .astype(np.uint16)
            .view(np.uint8)
        )
    per, size = quant.FORMATS[t].block_size, quant.FORMATS[t].type_size
    w = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)  # (rows, blocks, block bytes)
    for o in SCALE_OFFSETS.get(t, ()):
        half = (rng.standard_normal((rows, cols // per)) * 0.01).astype(np.float16)
        w[:, :, o : o + 2] = half.view(np.uint8).reshape(rows, cols // per, 2)
    for o in E8M0_OFFSETS.get(t, ()):
        w[:, :, o] = rng.integers(118, 124, (rows, cols // per))  # half-scales 2^-10 .. 2^-5, as the f16 ones above
    return w.reshape(rows, -1)
