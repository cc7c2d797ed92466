"""MXFP4 kernels at their edges (the random-block, both-matmul-path, get_rows and batch-invariance tests run them with
every other format in test_kernels.py and test_batch_engine.py): every exponent byte 0..255 in get_rows, odd block
counts, exact sums, subnormal and huge scales in the fused kernel, its experts and multi siblings, the backend's
linear and embed on an MXFP4 QTensor, and a table lookup that compiles to vector code."""

from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from numba import njit

import quant
import simd_kernels as sk
from localrt.engine.backends.backend import CPUBackend, QTensor
from localrt.engine.backends.pieces import BLAS_MIN_TOKENS
from simd_kernels import dequant, iquants
from _kernel_blocks import random_weights
from test_kernels import check

MXFP4 = 39
DT = quant.FORMATS[MXFP4].dtype


def _readonly(w: np.ndarray) -> np.ndarray:
    w.flags.writeable = False  # as the mmap's weights: the kernel variant the engine compiles
    return w


def _blocks(e: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """uint8 (rows, row_bytes) from exponent bytes e (rows, blocks) and packed codes qs (rows, blocks, 16)."""
    b = np.zeros(e.shape, dtype=DT)
    b["e"], b["qs"] = e, qs
    return _readonly(b.view(np.uint8).reshape(e.shape[0], -1))


def _every_exponent(rng) -> np.ndarray:
    """Rows of 4 blocks: row r has exponent byte 4r..4r+3 (every byte 0..255 once), block codes random."""
    e = np.arange(256, dtype=np.uint8).reshape(64, 4)
    return _blocks(e, rng.integers(0, 256, (64, 4, 16), dtype=np.uint8))


def test_kernel_table_is_quant_table():
    assert dequant.KVALUES_MXFP4 == quant.KVALUES_MXFP4


def test_get_rows_every_exponent_bit_exact():
    w = _every_exponent(np.random.default_rng(1))
    got = sk.get_rows(MXFP4, w, np.arange(64))
    with np.errstate(over="ignore"):
        want = quant.dequantize(w, MXFP4, (64, 128))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # subnormal scales and infinities included
    assert np.isinf(got[63]).any() and np.all(np.abs(got[0, :32]) <= 6 * 2.0**-127)  # e = 255 and e = 0


@pytest.mark.parametrize("cols", [32, 96, 160, 544])
def test_odd_and_even_block_counts(cols: int) -> None:
    rng = np.random.default_rng(cols)
    w = random_weights(rng, MXFP4, 9, cols)
    x = rng.standard_normal((6, cols)).astype(np.float32)  # 4 tokens per pass plus a remainder of 2
    out = np.full((6, 9), np.nan, np.float32)
    sk.MUL[MXFP4](w, x, out)
    check(MXFP4, w, x, out)


def test_exact_sums_with_extreme_codes() -> None:
    """Scale 1 (e = 127: half-scale 2^-1 on the doubled values) and integer activations that Q8_0 holds exactly
    (d = 1): every partial sum is an integer, so the output is exact."""
    q = np.full((3, 4, 16), 0x77, np.uint8)  # row 0: every element 6 (code 7)
    q[1] = 0xFF  # row 1: every element -6 (code 15)
    q[2] = 0xF7  # row 2: 6 then -6
    w = _blocks(np.full((3, 4), 127, np.uint8), q)
    x = np.full(128, -127.0, np.float32)
    out = sk.matvec(MXFP4, w, x)
    assert np.array_equal(out, np.float32([6 * -127 * 128, -6 * -127 * 128, 0]))
    rng = np.random.default_rng(3)
    x = rng.integers(-127, 128, (5, 128)).astype(np.float32)
    x[:, ::32] = 127  # each block's absmax 127: d = 1, q = x
    e = rng.integers(120, 135, (7, 1)).repeat(4, axis=1).astype(np.uint8)  # one scale a row: its sums share a unit
    w = _blocks(e, rng.integers(0, 256, (7, 4, 16), dtype=np.uint8))
    out = np.empty((5, 7), np.float32)
    sk.MUL[MXFP4](w, x, out)
    want = x.astype(np.float64) @ quant.dequantize(w, MXFP4, (7, 128)).astype(np.float64).T
    assert np.array_equal(out, want)  # |sum| <= 128 * 12 * 127 units of 2^(e - 128) < 2^24: exact


def test_subnormal_and_large_scales_in_the_fused_kernel() -> None:
    """Exponent bytes 0..252 (all codes finite) against llama.cpp's dot emulated; 255 overflows as its float does."""
    rng = np.random.default_rng(4)
    w = _every_exponent(rng)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    out = np.empty((3, 64), np.float32)
    sk.MUL[MXFP4](w[:63], x, out[:, :63])
    check(MXFP4, w[:63], x, out[:, :63])
    top = _blocks(np.full((1, 4), 255, np.uint8), np.full((1, 4, 16), 0x77, np.uint8))  # every element 6 * 2^128
    assert np.all(np.isinf(sk.matvec(MXFP4, top, np.ones(128, np.float32))))  # 2^127 * d_x * 4 * 48768


def test_zero_activations_and_zero_codes() -> None:
    rng = np.random.default_rng(5)
    w = random_weights(rng, MXFP4, 5, 512)
    assert np.array_equal(sk.matvec(MXFP4, w, np.zeros(512, np.float32)), np.zeros(5, np.float32))
    zeros = _blocks(rng.integers(0, 253, (5, 16)).astype(np.uint8), np.zeros((5, 16, 16), np.uint8))
    x = rng.standard_normal(512).astype(np.float32)
    assert np.array_equal(sk.matvec(MXFP4, zeros, x), np.zeros(5, np.float32))


def test_experts_and_multi_kernels_are_the_matmul_kernel() -> None:
    """EXPERTS (gpt-oss's experts are MXFP4) and MULTI compute every row as MUL does, bit for bit."""
    rng = np.random.default_rng(6)
    n_expert, rows, cols = 4, 8, 256
    w = random_weights(rng, MXFP4, n_expert * rows, cols)
    x = rng.standard_normal((5, cols)).astype(np.float32)
    experts = np.array([3, 0, 3, 1, 2, 0, 1], np.int64)
    xrow = np.array([0, 0, 1, 4, 2, 3, 4], np.int64)
    out = np.empty((len(experts), rows), np.float32)
    sk.EXPERTS[MXFP4](w, rows, x, experts, xrow, out)
    among = np.empty((5, n_expert * rows), np.float32)
    sk.MUL[MXFP4](w, x, among)
    for p, (e, t) in enumerate(zip(experts, xrow)):
        np.testing.assert_array_equal(out[p], among[t, e * rows : (e + 1) * rows])
    ws = [random_weights(rng, MXFP4, r, cols) for r in (40, 24, 17)]
    outs = [np.empty((5, w_.shape[0]), np.float32) for w_ in ws]
    sk.MULTI[MXFP4](*ws, x, *outs)
    for w_, o in zip(ws, outs):
        one = np.empty_like(o)
        sk.MUL[MXFP4](w_, x, one)
        np.testing.assert_array_equal(o, one)


def test_backend_linear_and_embed_on_an_mxfp4_qtensor() -> None:
    rng = np.random.default_rng(7)
    rows, cols = 70, 256
    w = random_weights(rng, MXFP4, rows, cols)
    qt = QTensor("blk.0.ffn_up_exps.weight", MXFP4, (rows, cols), w)
    be = CPUBackend()
    be.check(qt)  # a format the CPU kernels read: no ModelLoadError
    wd = quant.dequantize(w, MXFP4, (rows, cols))
    ids = np.array([5, 0, 69, 5])
    assert np.array_equal(be.embed(qt, ids).view(np.uint32), wd[ids].view(np.uint32))
    x = rng.standard_normal((3, cols)).astype(np.float32)
    out = be.linear(qt, x)  # few rows: the fused kernel, activations quantized to Q8_0
    check(MXFP4, w, x, out)
    big = rng.standard_normal((BLAS_MIN_TOKENS, cols)).astype(np.float32)
    out = be.linear(qt, big)  # a batch: the prompt kernel (AVX2), else dequantized tiles through BLAS
    if MXFP4 in sk.PREFILL:  # the per-row kernel's row dots: its bits
        per_row = np.empty_like(out)
        sk.MUL[MXFP4](w, big, per_row)
        assert np.array_equal(out, per_row)
        check(MXFP4, w, big, out)
    else:
        exact = big.astype(np.float64) @ wd.astype(np.float64).T
        assert np.all(np.abs(out - exact) <= 1e-5 * (np.abs(big) @ np.abs(wd.astype(np.float64)).T) + 1e-30)


def test_table_lookup_is_vector_code_on_avx2() -> None:
    """The code lookup must compile to pshufb, as IQ4_NL's (the cached kernels' machine code cannot be inspected:
    the row dot is compiled afresh in a small probe)."""
    if not llvm.get_host_cpu_features().get("avx2", False):
        pytest.skip("the host has no AVX2: LLVM may scalarise the lookup there")
    rowdot4 = iquants.ROWDOTS["mxfp4"][3]

    @njit
    def probe(row, xq, xd, xs):
        return rowdot4(row, xq, xd, xs, 0)

    q, d, s = np.zeros((4, 512), np.int8), np.zeros((4, 16), np.float32), np.zeros((4, 32), np.int32)
    assert probe(np.zeros(16 * 17, np.uint8), q, d, s) == (0.0, 0.0, 0.0, 0.0)
    asm = probe.inspect_asm(probe.signatures[0])
    assert re.search(r"\bv?pshufb\b|\bvpermb\b", asm) and not re.search(r"\bv?pinsrb\b", asm)
