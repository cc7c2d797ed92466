"""IQ4_NL / IQ4_XS kernels at their edges (the random-block, both-matmul-path, get_rows and batch-invariance tests
run them with every other format in test_kernels.py and test_batch_engine.py): odd block counts, extreme levels,
scales and activations, zero blocks, and a table lookup that compiles to vector code."""

from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from numba import njit

import quant
import simd_kernels as sk
from simd_kernels import dequant, iquants
from _kernel_blocks import random_weights
from test_kernels import check

IQ4_NL, IQ4_XS = 20, 23


def test_kernel_table_is_quant_table():
    assert dequant.KVALUES_IQ4NL == quant.KVALUES_IQ4NL


@pytest.mark.parametrize("cols", [32, 96, 160, 544])
def test_iq4_nl_odd_and_even_block_counts(cols: int) -> None:
    rng = np.random.default_rng(cols)
    w = random_weights(rng, IQ4_NL, 9, cols)
    x = rng.standard_normal((6, cols)).astype(np.float32)  # 4 tokens per pass plus a remainder of 2
    out = np.full((6, 9), np.nan, np.float32)
    sk.MUL[IQ4_NL](w, x, out)
    check(IQ4_NL, w, x, out)


def _extreme_xs(rows: int, supers: int) -> np.ndarray:
    """IQ4_XS rows whose every sub-block has the extreme scale -32 or +31 and the extreme levels -127 / 113."""
    b = np.zeros((rows, supers), dtype=quant.FORMATS[IQ4_XS].dtype)
    b["d"] = np.float16(0.01)
    ls = np.where(np.arange(8) % 2, 63, 0)  # (8,) ls - 32 in {-32, 31}
    b["scales_l"] = (ls[0::2] & 15) | ((ls[1::2] & 15) << 4)
    b["scales_h"] = ((ls >> 4) << (2 * np.arange(8))).sum()
    b["qs"][..., ::2] = 0x00  # level -127 twice
    b["qs"][..., 1::2] = 0xFF  # level 113 twice
    return b.view(np.uint8).reshape(rows, -1)


def test_iq4_xs_extreme_scales_levels_and_activations() -> None:
    w = _extreme_xs(5, 3)  # 768 columns
    rng = np.random.default_rng(4)
    x = np.where(rng.random((5, 768)) < 0.5, -1.0, 1.0).astype(np.float32) * 1e3  # every quant at +-127
    out = np.empty((5, 5), np.float32)
    sk.MUL[IQ4_XS](w, x, out)
    check(IQ4_XS, w, x, out)
    assert np.all(np.abs(out) > 0)


def test_iq4_nl_extreme_levels() -> None:
    b = np.zeros((3, 4), dtype=quant.FORMATS[IQ4_NL].dtype)
    b["d"] = np.float16(-2.5)
    b["qs"][0] = 0x00  # every element -127
    b["qs"][1] = 0xFF  # every element 113
    b["qs"][2] = 0xF0  # -127 then 113
    w = b.view(np.uint8).reshape(3, -1)
    x = np.full((1, 128), -127.0, np.float32)  # Q8_0 exactly: d = 1, q = -127
    out = sk.matvec(IQ4_NL, w, x[0])
    check(IQ4_NL, w, x, out[None])
    # every partial sum is a small multiple of 2.5: exact in float32
    want = np.float32([2.5 * -127 * 127 * 128, 2.5 * 113 * 127 * 128, 2.5 * 127 * (113 - 127) * 64])
    assert np.array_equal(out, want)


@pytest.mark.parametrize("t", [IQ4_NL, IQ4_XS])
def test_zero_activations_and_zero_scales(t: int) -> None:
    rng = np.random.default_rng(t)
    w = random_weights(rng, t, 5, 512, writeable=True)
    assert np.array_equal(sk.matvec(t, w, np.zeros(512, np.float32)), np.zeros(5, np.float32))
    w[:, 0:2] = 0  # d = 0 in the first block of every row
    w = w.reshape(5, -1, quant.FORMATS[t].type_size)
    w[:, :, 0:2] = 0  # ... and in every block
    x = rng.standard_normal(512).astype(np.float32)
    assert np.array_equal(sk.matvec(t, np.ascontiguousarray(w.reshape(5, -1)), x), np.zeros(5, np.float32))


@pytest.mark.parametrize("name", ["iq4_nl", "iq4_xs"])
def test_table_lookup_is_vector_code_on_avx2(name: str) -> None:
    """The level lookup must compile to pshufb (else each element is extracted and inserted one by one).

    The row dot is compiled afresh in a small probe: the cached kernels' machine code cannot be inspected."""
    if not llvm.get_host_cpu_features().get("avx2", False):
        pytest.skip("the host has no AVX2: LLVM may scalarise the lookup there")
    rowdot4 = iquants.ROWDOTS[name][3]

    @njit
    def probe(row, xq, xd, xs):
        return rowdot4(row, xq, xd, xs, 0)

    t = IQ4_NL if name == "iq4_nl" else IQ4_XS
    per, size = sk.BLOCKS[t]
    n_blocks = 512 // per
    q, d, s = np.zeros((4, 512), np.int8), np.zeros((4, n_blocks), np.float32), np.zeros((4, 512 // 16), np.int32)
    assert probe(np.zeros(n_blocks * size, np.uint8), q, d, s) == (0.0, 0.0, 0.0, 0.0)
    asm = probe.inspect_asm(probe.signatures[0])
    assert re.search(r"\bv?pshufb\b|\bvpermb\b", asm) and not re.search(r"\bv?pinsrb\b", asm)
