"""simd_kernels.attend_simd, the attention kernel's vector loops: a key's dot is the same bits taken with 15 others or alone,
a value row sum the same however its keys are split into calls, and both agree with float64 sums (F16 and F32 caches).
The whole kernel against a reference is tests/engine/test_kv_pool.py's and the engine tests'."""

from __future__ import annotations

import numpy as np
import pytest

from simd_kernels.jit import njit
from simd_kernels.attend_simd import key_dot1, key_dots16, mix_values


@njit
def _dots(q, k, scores, t, h, b, kvh, r0, n16, n1, scale):
    """n16 groups of 16 keys from row r0 with key_dots16, then n1 keys one at a time with key_dot1."""
    j = 0
    for _ in range(n16):
        key_dots16(q, k, scores, t, h, b, kvh, r0 + j, j, scale)
        j += 16
    for _ in range(n1):
        scores[j] = key_dot1(q, k, t, h, b, kvh, r0 + j) * scale
        j += 1


@njit
def _mix(v, w, out, t, h, b, kvh, cuts):
    """The value rows 0..len(w)-1 mixed into out[t, h], a call per piece between consecutive cuts."""
    for i in range(len(cuts) - 1):
        mix_values(v, w, out, t, h, b, kvh, cuts[i], cuts[i], cuts[i + 1] - cuts[i])


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("hd", [64, 256])
def test_key_dots_are_one_sum_however_grouped(dtype, hd):
    rng = np.random.default_rng(hd)
    q = rng.standard_normal((2, 3, hd)).astype(np.float32)  # (n_tok, n_head, hd)
    k = rng.standard_normal((2, 1, 48, hd)).astype(dtype)  # (n_blocks, n_kv, B, hd)
    kc = k.view(np.uint16) if dtype == np.float16 else k
    grouped, alone = np.empty(48, np.float32), np.empty(48, np.float32)
    _dots(q, kc, grouped, 1, 2, 1, 0, 0, 3, 0, np.float32(0.125))
    _dots(q, kc, alone, 1, 2, 1, 0, 0, 0, 48, np.float32(0.125))
    assert grouped.tobytes() == alone.tobytes()
    want = k[1, 0].astype(np.float64) @ q[1, 2].astype(np.float64) * 0.125
    np.testing.assert_allclose(grouped, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("hd_v", [64, 128])
def test_value_sums_do_not_depend_on_the_calls(dtype, hd_v):
    rng = np.random.default_rng(hd_v)
    v = rng.standard_normal((1, 2, 37, hd_v)).astype(dtype)
    vc = v.view(np.uint16) if dtype == np.float16 else v
    w = rng.random(37).astype(np.float32)
    outs = []
    for cuts in ([0, 37], [0, 1, 16, 17, 37], list(range(38))):
        out = np.zeros((1, 2, hd_v), np.float32)
        _mix(vc, w, out, 0, 1, 0, 1, np.array(cuts, np.int64))
        outs.append(out[0, 1].tobytes())
        np.testing.assert_allclose(out[0, 1], w.astype(np.float64) @ v[0, 1].astype(np.float64), rtol=1e-5, atol=1e-5)
    assert outs[0] == outs[1] == outs[2]
