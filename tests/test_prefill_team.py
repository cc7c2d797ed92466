"""The prefill team: work split over threads gives the same numbers as one thread would."""
from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import quantize

import simd_kernels
from localrt.engine.backends.backend import CPUBackend, QTensor, _split
from simd_kernels import ops, threads

Q8_0 = 8


def test_split_covers_range_in_aligned_pieces():
    for n, parts, align in [(50, 2, 16), (7, 3, 1), (1, 2, 16), (2048, 2, 16)]:
        b = _split(n, parts, align)
        assert b[0] == 0 and b[-1] == n and len(b) == parts + 1
        assert all(x <= y for x, y in zip(b, b[1:]))
        assert all(x % align == 0 or x == n for x in b[:-1])


def test_team_runs_every_part_and_reraises():
    team = threads.Team(3)
    seen = []
    team.run(seen.append)
    assert sorted(seen) == [0, 1, 2]

    def fail(i):
        if i == 2:
            raise ValueError("member 2")

    with pytest.raises(ValueError, match="member 2"):
        team.run(fail)


@pytest.mark.parametrize("rows", [50, 256])
def test_prefill_linear_matches_dequantized_product(rows):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((rows, 64)).astype(np.float32)
    raw = quantize(w, 8)  # Q8_0 blocks (rows, row_bytes)
    qt = QTensor("t", Q8_0, (rows, 64), raw)
    x = rng.standard_normal((300, 64)).astype(np.float32)  # enough tokens for the BLAS path
    deq = simd_kernels.get_rows(Q8_0, raw, np.arange(rows))
    got = CPUBackend().linear(qt, x)
    np.testing.assert_allclose(got, x @ deq.T, rtol=1e-5, atol=1e-4)


def test_prefill_attention_matches_per_token_kernel():
    rng = np.random.default_rng(1)
    n, n_head, n_kv, hd, cap = 40, 4, 2, 16, 64
    q = rng.standard_normal((n, n_head, hd)).astype(np.float32)
    k_cache = rng.standard_normal((1, n_kv, cap, hd)).astype(np.float32)
    v_cache = rng.standard_normal((1, n_kv, cap, hd)).astype(np.float32)
    positions = np.arange(3, 3 + n, dtype=np.int64)
    slots = np.zeros(n, np.int64)
    for window in (0, 8):
        ref = ops.attention(q, k_cache, v_cache, positions, slots, window, 0.25, np.empty((n, n_head, hd), np.float32))
        got = CPUBackend().attention(q, k_cache, v_cache, positions, slots, window, 0.25, np.empty((n, n_head, hd), np.float32))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_ffn_activations_split_rows_like_one_thread():
    rng = np.random.default_rng(2)
    gate = rng.standard_normal((37, 96)).astype(np.float32)
    up = rng.standard_normal((37, 96)).astype(np.float32)
    for act, rows in ((ops.geglu_tanh, ops._geglu_rows), (ops.swiglu, ops._swiglu_rows)):
        assert np.array_equal(act(gate, up, np.empty_like(gate)), rows(gate, up, np.empty_like(gate)))
