"""Attention-logit soft-capping (gemma2): the per-token kernel against a float64 NumPy reference, the prefill
(BLAS) path against the kernel, and a token's output independent of what else is in the batch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localrt.engine.backends.backend import CPUBackend
from simd_kernels import KernelArgumentError, ops

N, N_HEAD, N_KV, HD, CAP = 24, 4, 2, 16, 32


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = (2 * rng.standard_normal((N, N_HEAD, HD))).astype(np.float32)  # scores of several units: the cap bites
    k = rng.standard_normal((1, N_KV, CAP, HD)).astype(np.float32)
    v = rng.standard_normal((1, N_KV, CAP, HD)).astype(np.float32)
    return q, k, v, np.arange(N, dtype=np.int64), np.zeros(N, np.int64)


def _reference(q, k, v, positions, window, scale, cap):
    out = np.zeros(q.shape, np.float64)
    for t, p in enumerate(positions):
        lo = max(0, p - window + 1) if window else 0
        for h in range(N_HEAD):
            kv = h // (N_HEAD // N_KV)
            s = k[0, kv, lo : p + 1].astype(np.float64) @ q[t, h] * scale
            s = cap * np.tanh(s / cap) if cap else s
            e = np.exp(s - s.max())
            out[t, h] = (e / e.sum()) @ v[0, kv, lo : p + 1]
    return out


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("cap", [0.0, 1.5])
def test_kernel_and_prefill_path_match_the_reference(window, cap):
    q, k, v, pos, slots = _inputs()
    scale = 1 / math.sqrt(HD)
    ref = _reference(q, k, v, pos, window, scale, cap)
    kern = ops.attention(q, k, v, pos, slots, window, scale, np.empty_like(q), cap)
    blas = CPUBackend().attention(q, k, v, pos, slots, window, scale, np.empty_like(q), softcap=cap)  # N >= 16: BLAS
    np.testing.assert_allclose(kern, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(blas, ref, rtol=1e-5, atol=1e-5)
    if cap:  # the cap changes the result at these score sizes
        assert np.abs(_reference(q, k, v, pos, window, scale, 0.0) - ref).max() > 1e-2


def test_a_tokens_output_does_not_depend_on_the_batch():
    q, k, v, pos, slots = _inputs(1)
    whole = ops.attention(q, k, v, pos, slots, 0, 0.25, np.empty_like(q), 1.5)
    for t in (0, 7, N - 1):
        alone = ops.attention(q[t : t + 1], k, v, pos[t : t + 1], slots[t : t + 1], 0, 0.25, np.empty_like(q[:1]), 1.5)
        assert np.array_equal(alone[0], whole[t])


def test_negative_or_nan_cap_is_refused():
    q, k, v, pos, slots = _inputs()
    for bad in (-1.0, float("nan")):
        with pytest.raises(KernelArgumentError, match="softcap"):
            ops.attention(q, k, v, pos, slots, 0, 0.25, np.empty_like(q), bad)
        with pytest.raises(KernelArgumentError, match="softcap"):
            CPUBackend().attention(q, k, v, pos, slots, 0, 0.25, np.empty_like(q), softcap=bad)
