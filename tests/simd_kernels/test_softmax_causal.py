"""simd_kernels.attend.softmax_causal, the prompt path's masked softmax, against a float64 NumPy reference: windows,
softcaps, a piece starting past key 0, rows whose keys span more than e^87 (where e^x is taken at its floor), and the
arguments it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from simd_kernels import KernelArgumentError
from simd_kernels.attend import softmax_causal


def _reference(sc, scale, cap, positions, k0, window):
    s = sc.astype(np.float64) * scale
    if cap:
        s = cap * np.tanh(s / cap)
    keys = np.arange(k0, k0 + sc.shape[2])
    hidden = keys[None, :] > positions[:, None]
    if window:
        hidden |= keys[None, :] <= positions[:, None] - window
    s = np.where(hidden, -np.inf, s)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("first, last, k0", [(64, 127, 0), (3, 39, 0), (100, 116, 90), (0, 0, 0)])
@pytest.mark.parametrize("cap, window", [(0.0, 0), (0.0, 17), (30.0, 0), (2.0, 16), (0.0, 1)])
def test_against_the_reference(first, last, k0, cap, window):
    positions = np.arange(first, last + 1, dtype=np.int32)
    sc = 4 * np.random.default_rng(first).standard_normal((3, len(positions), last - k0 + 1)).astype(np.float32)
    want = _reference(sc, 0.125, cap, positions, k0, window)
    softmax_causal(sc, 0.125, cap, positions, k0, window)
    np.testing.assert_allclose(sc, want, rtol=2e-6, atol=1e-7)
    assert not sc[want == 0].any()  # hidden keys are exact zeros


def test_keys_far_below_the_maximum_weigh_nothing():
    sc = np.zeros((1, 1, 70), np.float32)
    sc[0, 0, 5] = 500.0  # e^(0 - 500) is far below float32: the other 69 keys sit at the floor
    softmax_causal(sc, 1.0, 0.0, np.array([69], np.int32), 0, 0)
    assert sc[0, 0, 5] == 1.0 and sc[0, 0].sum() == 1.0
    assert (sc[0, 0] < 1e-37).sum() == 69


def test_bad_arguments_are_refused():
    sc = np.zeros((1, 2, 8), np.float32)
    with pytest.raises(KernelArgumentError, match="softcap"):
        softmax_causal(sc, 1.0, -1.0, np.array([6, 7], np.int32), 0, 0)
    # a row too few; past the last key; before the first; past the last key in the middle row
    for positions, k0 in (([7], 0), ([7, 8], 0), ([0, 1], 1), ([6, 9, 7], 0)):
        rows = np.zeros((1, max(2, len(positions)), 8), np.float32)
        with pytest.raises(KernelArgumentError, match="positions"):
            softmax_causal(rows, 1.0, 0.0, np.array(positions, np.int32), k0, 0)
