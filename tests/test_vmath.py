"""simd_kernels.vmath.expf against float64 exp: within 1 ulp on the whole float32 range, and the edge values."""
from __future__ import annotations

import numpy as np
from numba import njit

from simd_kernels import ops
from simd_kernels.vmath import expf


@njit(cache=False)
def _exp_all(x, out):
    for i in range(x.shape[0]):
        out[i] = expf(x[i])


def _ulps(x: np.ndarray) -> np.ndarray:
    """|expf(x) - e^x| in units of the float32 spacing at e^x, for x whose e^x is a positive finite float32."""
    got = np.empty_like(x)
    _exp_all(x, got)
    exact = np.exp(x.astype(np.float64))
    ok = (exact > np.finfo(np.float32).tiny) & (exact < np.finfo(np.float32).max)
    spacing = np.spacing(exact[ok].astype(np.float32)).astype(np.float64)
    return np.abs(got[ok].astype(np.float64) - exact[ok]) / spacing


def test_within_one_ulp_over_the_float32_range() -> None:
    x = np.linspace(-87.3, 88.72, 2_000_001, dtype=np.float64).astype(np.float32)
    small = np.random.default_rng(0).uniform(-1, 1, 500_000).astype(np.float32)  # softmax and SwiGLU live here
    err = _ulps(np.concatenate([x, small]))
    assert err.max() <= 1.0, err.max()
    assert err.mean() < 0.3


def test_subnormal_results_are_within_one_subnormal_step() -> None:
    x = np.linspace(-103.9, -87.4, 100_001, dtype=np.float64).astype(np.float32)
    got = np.empty_like(x)
    _exp_all(x, got)
    step = np.float64(2.0**-149)
    assert np.abs(got.astype(np.float64) - np.exp(x.astype(np.float64))).max() <= step


def test_edge_values() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.7229, 89.0, 1e30, -104.0, -1e30, 1e-30, -1e-30],
                 np.float32)
    got = np.empty_like(x)
    _exp_all(x, got)
    assert np.isnan(got[0])
    assert list(got[1:]) == [np.inf, 0.0, 1.0, 1.0, np.inf, np.inf, np.inf, 0.0, 0.0, 1.0, 1.0]


def test_swiglu_is_silu_times_up() -> None:
    rng = np.random.default_rng(1)
    gate = (rng.standard_normal((3, 1000)) * 8).astype(np.float32)
    gate[0, :4] = [-200.0, 200.0, 0.0, -0.0]
    up = rng.standard_normal((3, 1000)).astype(np.float32)
    out = np.empty_like(gate)
    ops.swiglu(gate, up, out)
    g = gate.astype(np.float64)
    want = g / (1 + np.exp(-g)) * up
    assert np.allclose(out, want, rtol=3e-7, atol=1e-30)
    assert out[0, 0] == 0.0 and out[0, 1] == np.float32(200.0) * up[0, 1]
