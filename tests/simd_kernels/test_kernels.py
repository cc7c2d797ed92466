"""simd_kernels on random blocks: matvec / matmul against float64 references, get_rows bit-exact.

Tolerances:
- against the exact emulation of llama.cpp's activation quantization (tests/_kernel_oracle.py):
  |out - ref| <= 1e-5 * Σ|w*x| (float32 accumulation only);
- against the float64 product with unquantized activations: |out - ref| <= Σ|w| * err(x) + 1e-5 * Σ|w*x|,
  err(x) the per-element bound of the Q8_0/Q8_1/Q8_K (or f16/bf16) activation error.
"""

from __future__ import annotations

import numpy as np
import pytest

import quant
import simd_kernels as sk
from _kernel_blocks import ALL, ALL_KERNELS, IQ4_NL, MXFP4, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, random_weights
from _kernel_oracle import activation_error, emulated_dot, weights


def check(t: int, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out (n_tok, rows) against both references, with the tolerances in the module docstring."""
    ref, scale = emulated_dot(t, w, x)
    assert np.all(np.abs(out - ref) <= 1e-5 * scale + 1e-30), f"type {t}: off the exact emulation"
    wd = weights(t, w)
    exact = x.astype(np.float64) @ wd.T
    bound = activation_error(t, x) @ np.abs(wd).T + 1e-5 * (np.abs(x) @ np.abs(wd).T)
    assert np.all(np.abs(out - exact) <= bound), f"type {t}: beyond the activation quantization bound"


@pytest.mark.parametrize("t", ALL_KERNELS)
@pytest.mark.parametrize("rows", [1, 6, 67])
def test_matvec_random_blocks(t: int, rows: int) -> None:
    rng = np.random.default_rng(1000 * t + rows)
    cols = 512
    w = random_weights(rng, t, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    out = np.full(rows, np.nan, np.float32)
    assert sk.matvec(t, w, x, out) is out
    check(t, w, x[None], out[None])


@pytest.mark.parametrize("t", ALL_KERNELS)
def test_matmul_fused_and_tiled_paths(t: int) -> None:
    """Both matmul paths: the fused kernel (raw sk.MUL, any n_tok) and sk.matmul's choice for a batch."""
    rng = np.random.default_rng(7 + t)
    rows, cols = 131, 768 if t in (Q8_0, Q4_1, Q5_0, IQ4_NL, MXFP4) else 512
    w = random_weights(rng, t, rows, cols)
    for n_tok in (6, 70, sk.api.BLAS_MIN_TOKENS + 1):
        x = rng.standard_normal((n_tok, cols)).astype(np.float32)
        if n_tok < sk.api.BLAS_MIN_TOKENS or n_tok == 70:
            # fused kernel: 4 tokens per pass plus a remainder, over more than one token chunk for 70
            out = np.full((n_tok, rows), np.nan, np.float32)
            sk.MUL[t](w, x, out)
            check(t, w, x, out)
        else:
            out = sk.matmul(t, w, x)
            # tiles of dequantized rows through BLAS: float32 activations, no quantization
            wd = weights(t, w)
            ref = x.astype(np.float64) @ wd.T
            assert np.all(np.abs(out - ref) <= 1e-5 * (np.abs(x) @ np.abs(wd).T) + 1e-30)


@pytest.mark.parametrize("t", ALL_KERNELS)
def test_get_rows_bit_exact(t: int) -> None:
    rng = np.random.default_rng(99 + t)
    w = random_weights(rng, t, 9, 512)
    ids = np.array([8, 0, 3, 3])
    got = sk.get_rows(t, w, ids)
    want = quant.dequantize(w, t, (9, 512))[ids]
    assert got.dtype == np.float32 and got.shape == (4, 512)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_matvec_zero_activations_and_zero_blocks() -> None:
    rng = np.random.default_rng(5)
    for t in (Q8_0, Q4_1, Q4_K, Q6_K):
        w = random_weights(rng, t, 5, 256)
        assert np.array_equal(sk.matvec(t, w, np.zeros(256, np.float32)), np.zeros(5, np.float32))
    w = random_weights(rng, Q4_K, 5, 256, writeable=True)
    w[:, 0:4] = 0  # d = dmin = 0: the whole super-block is zero
    x = rng.standard_normal(256).astype(np.float32)
    assert np.array_equal(sk.matvec(Q4_K, w, x), np.zeros(5, np.float32))


def test_bad_arguments_raise_typed_errors() -> None:
    rng = np.random.default_rng(3)
    w = random_weights(rng, Q8_0, 4, 64)
    x = np.ones(64, np.float32)
    with pytest.raises(sk.KernelArgumentError, match="ggml type 99"):
        sk.matvec(99, w, x)
    with pytest.raises(sk.KernelArgumentError, match="float32"):
        sk.matvec(Q8_0, w, np.ones(32, np.float32))
    with pytest.raises(sk.KernelArgumentError, match="float32"):
        sk.matvec(Q8_0, w, x.astype(np.float64))
    with pytest.raises(sk.KernelArgumentError, match="out"):
        sk.matvec(Q8_0, w, x, np.empty(5, np.float32))
    with pytest.raises(sk.KernelArgumentError, match="whole 34-byte blocks"):
        sk.matvec(Q8_0, np.ascontiguousarray(w[:, :40]), np.ones(32, np.float32))
    with pytest.raises(sk.KernelArgumentError, match="uint8"):
        sk.matvec(Q8_0, w.view(np.int8), x)
    with pytest.raises(sk.KernelArgumentError, match="not contiguous"):
        sk.matvec(Q8_0, np.concatenate([w, w], axis=1)[:, ::2], x)
    with pytest.raises(sk.KernelArgumentError, match="row ids"):
        sk.get_rows(Q8_0, w, [0, 4])
    with pytest.raises(sk.KernelArgumentError, match="row ids"):
        sk.get_rows(Q8_0, w, [-1])
    with pytest.raises(sk.KernelArgumentError, match="n_tok"):
        sk.matmul(Q8_0, w, x)
