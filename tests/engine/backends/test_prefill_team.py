"""The prefill team: work split over threads gives the same numbers as one thread would."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import quantize
from _kernel_blocks import random_weights

import simd_kernels
from localrt.engine.backends.backend import CPUBackend, QTensor, _split
from simd_kernels import ops, threads

F16, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 1, 3, 6, 8, 12, 14


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
    raw = quantize(w, F16).view(np.uint8)  # (rows, row_bytes) of a format that takes the BLAS path in a prompt's pieces
    assert F16 not in simd_kernels.PREFILL
    qt = QTensor("t", F16, (rows, 64), raw)
    x = rng.standard_normal((300, 64)).astype(np.float32)  # enough tokens for the BLAS path
    deq = simd_kernels.get_rows(F16, raw, np.arange(rows))
    got = CPUBackend().linear(qt, x)
    np.testing.assert_allclose(got, x @ deq.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("ggml_type", [Q4_K, Q6_K, Q8_0, Q5_0, Q4_1], ids=["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_1"])
@pytest.mark.parametrize("rows", [50, 256])
def test_prefill_linear_in_a_prefill_format_is_each_rows_one_row_call(ggml_type, rows):
    """A prompt's rows in a PREFILL format: the format's prompt kernel, each row as that kernel computes the token
    alone, close to the per-row kernel's."""
    rng = np.random.default_rng(ggml_type)
    raw = random_weights(rng, ggml_type, rows, 256)  # (rows, row_bytes)
    raw.flags.writeable = False  # as the mmap'd weights are
    qt = QTensor("t", ggml_type, (rows, 256), raw)
    x = rng.standard_normal((130, 256)).astype(np.float32)  # (n_tok, cols): one BLAS-sized piece
    be = CPUBackend()
    with be.planned(np.arange(130, dtype=np.int64), np.zeros(130, np.int64)):
        got = be.linear(qt, x)
    for i in (0, 7, 64, 129):
        one = np.empty((1, rows), np.float32)
        simd_kernels.MUL[ggml_type](raw, np.ascontiguousarray(x[i : i + 1]), one)
        if ggml_type in simd_kernels.PREFILL:  # the format's prompt kernel: its own numbers, close to the per-row ones
            quantize, kernel = simd_kernels.PREFILL[ggml_type]
            alone = np.empty((1, rows), np.float32)
            kernel(raw, *quantize(np.ascontiguousarray(x[i : i + 1])), alone)
            assert np.array_equal(got[i], alone[0]), f"row {i}"  # a token's result does not depend on the others
            np.testing.assert_allclose(got[i], one[0], rtol=1e-4, atol=1e-4 * np.abs(one).max())
        else:  # this host keeps the format on BLAS: f32 products, close to the 8-bit ones
            np.testing.assert_allclose(got[i], one[0], rtol=0.05, atol=0.05 * np.abs(one).max())


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
        got = CPUBackend().attention(
            q, k_cache, v_cache, positions, slots, window, 0.25, np.empty((n, n_head, hd), np.float32)
        )
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_ffn_activations_split_rows_like_one_thread():
    rng = np.random.default_rng(2)
    gate = rng.standard_normal((37, 96)).astype(np.float32)
    up = rng.standard_normal((37, 96)).astype(np.float32)
    for act, rows in ((ops.geglu_tanh, ops._geglu_rows), (ops.swiglu, ops._swiglu_rows)):
        assert np.array_equal(act(gate, up, np.empty_like(gate)), rows(gate, up, np.empty_like(gate)))
