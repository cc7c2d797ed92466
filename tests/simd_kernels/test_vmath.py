"""simd_kernels.vmath.expf and tanhf against float64 exp and tanh: within 1 ulp on the whole float32 range, and the
edge values."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from simd_kernels import ops
from simd_kernels.vmath import expf, tanhf


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
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.7229, 89.0, 1e30, -104.0, -1e30, 1e-30, -1e-30], np.float32)
    got = np.empty_like(x)
    _exp_all(x, got)
    assert np.isnan(got[0])
    assert list(got[1:]) == [np.inf, 0.0, 1.0, 1.0, np.inf, np.inf, np.inf, 0.0, 0.0, 1.0, 1.0]


def _gated(act, seed: int, spread: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gate, up, act(gate, up)): (3, 1000) f32 gates of the given spread, the first four -200, 200, 0 and -0."""
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal((3, 1000)) * spread).astype(np.float32)
    gate[0, :4] = [-200.0, 200.0, 0.0, -0.0]
    up = rng.standard_normal((3, 1000)).astype(np.float32)
    return gate, up, act(gate, up, np.empty_like(gate))


def test_swiglu_is_silu_times_up() -> None:
    gate, up, out = _gated(ops.swiglu, 1, 8)
    g = gate.astype(np.float64)
    want = g / (1 + np.exp(-g)) * up
    assert np.allclose(out, want, rtol=3e-7, atol=1e-30)
    assert out[0, 0] == 0.0 and out[0, 1] == np.float32(200.0) * up[0, 1]


@njit(cache=False, error_model="numpy")
def _tanh_all(x, out):
    for i in range(x.shape[0]):
        out[i] = tanhf(x[i])


@njit(cache=False)
def _libm_tanh_all(x, out):
    for i in range(x.shape[0]):
        out[i] = np.float32(math.tanh(x[i]))


def _ordered(a: np.ndarray) -> np.ndarray:
    """float32 bits as integers that count ulps across zero."""
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def test_tanhf_is_the_rounded_exact_value_but_for_rare_ties() -> None:
    rng = np.random.default_rng(2)
    x = np.concatenate(
        [rng.standard_normal(400_000).astype(np.float32) * s for s in (1e-6, 1e-2, 0.3, 1, 4)]
        + [np.linspace(-10, 10, 400_001, dtype=np.float32)]
    )
    got, libm = np.empty_like(x), np.empty_like(x)
    _tanh_all(x, got)
    _libm_tanh_all(x, libm)
    # np.tanh in float64, rounded: the float32 value nearest tanh(x) (a double rounding is off only at a near-tie)
    off = np.abs(_ordered(got) - _ordered(np.tanh(x.astype(np.float64)).astype(np.float32)))
    assert off.max() <= 1 and off.mean() < 1e-4, (off.max(), off.mean())
    libm_off = np.abs(_ordered(libm) - _ordered(np.tanh(x.astype(np.float64)).astype(np.float32)))
    print(f"tanhf off the rounded exact value on {off.mean():.1e} of inputs; libm's tanhf on {libm_off.mean():.1e}")


def test_tanhf_edge_values() -> None:
    x = np.array(
        [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.55, -0.55, 9.02, -9.02, 1e30, -1e30, 1e-30, -1e-30, 3e-45], np.float32
    )
    got = np.empty_like(x)
    _tanh_all(x, got)
    assert np.isnan(got[0])
    assert list(got[1:3]) == [1.0, -1.0] and list(got[7:11]) == [1.0, -1.0, 1.0, -1.0]
    assert got[3] == 0.0 and not np.signbit(got[3]) and got[4] == 0.0 and np.signbit(got[4])
    assert got[5] == np.float32(math.tanh(np.float64(x[5]))) and got[6] == -got[5]
    assert list(got[11:]) == list(x[11:])  # tanh(u) = u in float32 for tiny u, subnormals included


def test_geglu_is_gelu_tanh_times_up() -> None:
    gate, up, out = _gated(ops.geglu_tanh, 3, 4)
    # ggml_gelu_f32's float32 steps (1 + tanh cancels for very negative gates, in llama.cpp too), with the tanh
    # rounded from float64: the kernel gives these bits, but where tanhf is 1 ulp off a float32 tie
    f, g = np.float32, gate
    inner = f(np.sqrt(2.0 / np.pi)) * g * (f(1.0) + f(0.044715) * g * g)
    want = f(0.5) * g * (f(1.0) + np.tanh(inner.astype(np.float64)).astype(np.float32)) * up
    assert (out == want).mean() > 0.999
    assert np.allclose(out, want, rtol=1e-6, atol=1e-6)
    assert out[0, 0] == 0.0 and out[0, 1] == np.float32(200.0) * up[0, 1]
    in_place = gate.copy()
    ops.geglu_tanh(in_place, up, in_place)  # as the FFN calls it
    assert np.array_equal(in_place, out)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def test_gelu_f16_is_ggmls_table_gelu() -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((130, 1536)) * 4).astype(np.float32)  # 130 rows: split over the prefill team
    x[0, :6] = [10.0, -10.0, 9.99, -9.99, 0.0, 30.0]
    got = ops.gelu_f16(x, np.empty_like(x))
    # ggml's table: gelu of the float16 input in float32 steps (tanh rounded from float64), stored as float16
    f, h = np.float32, _f16(x)
    inner = (h * h * f(0.044715) + f(1.0)) * h * f(np.sqrt(2.0 / np.pi))
    want = _f16(f(0.5) * (h * (f(1.0) + np.tanh(inner.astype(np.float64)).astype(np.float32))))
    want = np.where(x >= 10, x, np.where(x <= -10, f(0.0), want))
    normal = np.abs(want) >= 6.2e-5  # float16's normal range: below it ggml's float16 keeps fewer bits than ours
    assert (got[normal] == want[normal]).mean() > 0.999 and np.allclose(got, want, rtol=1e-3, atol=1e-7)
    assert list(got[0, :2]) == [10.0, 0.0] and got[0, 5] == 30.0 and got[0, 4] == 0.0
    in_place = x.copy()
    assert np.array_equal(ops.gelu_f16(in_place, in_place), got)  # as bert's FFN calls it


def test_softmax_rows_team_is_softmax() -> None:
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((200, 300)) * 6).astype(np.float32)  # 200 rows: split over the prefill team
    x[0, 5:] = -np.inf  # masked keys, as a sliding window leaves them
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    got = ops.softmax_rows_team(x.copy())
    assert np.allclose(got, want, rtol=2e-6, atol=1e-9) and np.all(got[0, 5:] < 1e-37)
    assert np.allclose(got.sum(axis=1, dtype=np.float64), 1.0, atol=1e-5)
    assert np.array_equal(ops.softmax_rows_team(x[:3].copy()), got[:3])  # on this thread: the same bits


def test_softcap_is_cap_times_tanh_of_x_over_cap() -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4, 3000)) * 40).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, 0.0]
    cap = np.float32(30.0)
    got = ops.softcap(x.copy(), cap)
    want = cap * np.tanh((x / cap).astype(np.float64)).astype(np.float32)  # float32 steps, tanh rounded from float64
    assert (got == want).mean() > 0.999 and np.allclose(got, want, rtol=1e-6, atol=0)
    assert list(got[0, :3]) == [30.0, -30.0, 0.0]
