"""Continuous batching (localrt.engine.batch): a request's tokens are the same alone or beside others.

Kernel level: the fused kernel over n rows and the attention kernel over n decode rows give bit-identical
rows to n one-row calls. Engine level, on both real models: 8 prompts joining at different steps (different
num_predict, a stop string, a seeded sampled one, one cancelled midway, a long prompt prefilled in chunks
while the others decode) give token for token what each gives alone. Prefix reuse is not bit-exact (cached
keys come from other chunks or decode steps); the test holds it to what is true: exact when the cached
prefix ends where the prompt's own chunks would, and otherwise diverging only at a near-tie.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import simd_kernels as sk
from localrt import load_model
from localrt.engine.backends.backend import BLAS_MIN_TOKENS, CPUBackend
from localrt.engine.batch import Batcher
from localrt.engine.events import Done, Token
from test_kernels import ALL, random_weights

NEAR_TIE = 0.5


# -- kernels -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", ALL)
def test_fused_kernel_rows_equal_one_row_calls(t: int) -> None:
    rng = np.random.default_rng(7 + t)
    w = random_weights(rng, t, 67, 512)
    w.flags.writeable = False  # as the mmap'd weights are (the variant the engine compiles)
    for n in (2, 3, 4, 5, 8, 17, 64, 65, 130, BLAS_MIN_TOKENS - 1):
        x = rng.standard_normal((n, 512)).astype(np.float32)
        out = np.empty((n, 67), np.float32)
        sk.MUL[t](w, x, out)
        for i in range(n):
            one = np.empty((1, 67), np.float32)
            sk.MUL[t](w, np.ascontiguousarray(x[i : i + 1]), one)
            assert np.array_equal(one[0], out[i]), f"type {t}: row {i} of {n} differs from its one-row call"


@pytest.mark.parametrize("window", [0, 24])
def test_decode_attention_rows_equal_one_row_calls(window: int) -> None:
    rng = np.random.default_rng(window)
    be = CPUBackend()
    n_slots, n_head, n_kv, hd, cap = 8, 6, 2, 32, 600
    k = rng.standard_normal((n_slots, n_kv, cap, hd)).astype(np.float32)  # (n_slots, n_kv, cap, hd)
    v = rng.standard_normal((n_slots, n_kv, cap, hd)).astype(np.float32)
    # Positions from a few keys (the serial kernel alone) to hundreds (the threaded one).
    positions = np.array([0, 3, 20, 40, 90, 200, 450, 599], np.int64)
    slots = rng.permutation(n_slots).astype(np.int64)
    q = rng.standard_normal((n_slots, n_head, hd)).astype(np.float32)
    out = np.empty((n_slots, n_head, hd), np.float32)
    be.attention(q, k, v, positions, slots, window, 0.17, out)
    for i in range(n_slots):
        one = np.empty((1, n_head, hd), np.float32)
        be.attention(np.ascontiguousarray(q[i : i + 1]), k, v, positions[i : i + 1], slots[i : i + 1], window, 0.17, one)
        assert np.array_equal(one[0], out[i]), f"row {i} (position {positions[i]}) differs from its one-row call"
