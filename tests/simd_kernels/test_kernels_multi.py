"""simd_kernels.MULTI: the weights that share an input (q, k, v; gate, up) in one kernel call.

Each row must come out bit for bit as the format's MUL kernel computes it, whatever the token count (the 1-4 and
8-token row dots), so a decode step's numbers do not depend on which call shape the backend chose; and the backend's
`linears` must give `linear`'s outputs in the order asked, grouping only weights of one format.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import quant
import simd_kernels as sk
from localrt.engine.backends.backend import CPUBackend, QTensor

Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, IQ4_XS = 3, 6, 8, 12, 14, 23
# the formats of the real models and of the 1B bench files: their MUL kernels compile for other tests anyway
TYPES = [Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, IQ4_XS]


def _weights(rng, t: int, rows: int, cols: int) -> np.ndarray:
    w = quant.quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), t)  # uint8 (rows, row bytes)
    w.flags.writeable = False  # as the mmap's weights
    return w


def _mul(t: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty((x.shape[0], w.shape[0]), np.float32)  # (n_tok, rows)
    sk.MUL[t](w, x, out)
    return out


def test_a_multi_kernel_is_generated_beside_each_format() -> None:
    generated = {t: k for t, k in sk.MUL.items() if k.py_func.__code__.co_filename.endswith("simd.py")}
    assert sorted(sk.MULTI) == sorted(generated)
    assert all(k.__name__ == generated[t].__name__.replace("mul_", "multi_") for t, k in sk.MULTI.items())


@pytest.mark.parametrize("t", TYPES)
def test_multi_equals_mul_on_each_weight_bit_for_bit(t: int) -> None:
    rng = np.random.default_rng(t)
    cols = 512
    ws = [_weights(rng, t, rows, cols) for rows in (40, 24, 17)]
    for n_tok in (1, 2, 3, 5, 8, 13):
        x = rng.standard_normal((n_tok, cols)).astype(np.float32)  # (n_tok, cols)
        outs = [np.full((n_tok, w.shape[0]), np.nan, np.float32) for w in ws]
        sk.MULTI[t](*ws, x, *outs)
        for w, out in zip(ws, outs):
            np.testing.assert_array_equal(out, _mul(t, w, x))
        # two weights: a 0-row third, as the backend passes for gate and up
        two = [np.full((n_tok, w.shape[0]), np.nan, np.float32) for w in ws[:2]]
        sk.MULTI[t](ws[0], ws[1], ws[0][:0], x, *two, np.empty((n_tok, 0), np.float32))
        for w, out in zip(ws, two):
            np.testing.assert_array_equal(out, _mul(t, w, x))


def test_linears_give_linear_outputs_in_order_grouping_one_format() -> None:
    rng = np.random.default_rng(7)
    cols = 512
    spec = [("q", Q4_K, 64), ("k", Q4_K, 16), ("v", Q6_K, 16), ("x", Q4_K, 8), ("y", Q4_K, 8)]
    ws = tuple(QTensor(name, t, (rows, cols), _weights(rng, t, rows, cols)) for name, t, rows in spec)
    be = CPUBackend()
    for n_tok in (1, 4, 9, 70):  # 70: a batch with a BLAS piece, where each weight takes linear
        x = rng.standard_normal((n_tok, cols)).astype(np.float32)  # (n_tok, cols)
        got = be.linears(ws, x)
        assert [g.shape for g in got] == [(n_tok, w.shape[0]) for w in ws]
        for w, g in zip(ws, got):
            np.testing.assert_array_equal(g, be.linear(w, x))
    with pytest.raises(sk.KernelArgumentError):
        be.linears(ws, np.zeros((1, cols + 256), np.float32))


_PROBE = """
import json, numpy as np, simd_kernels as sk
per, size = sk.BLOCKS[12]
w = np.zeros((4, 256 // per * size), np.uint8)  # (4 rows, 256 elements)
w.flags.writeable = False
outs = [np.empty((1, 4), np.float32), np.empty((1, 4), np.float32), np.empty((1, 0), np.float32)]
sk.MULTI[12](w, w, w[:0], np.zeros((1, 256), np.float32), *outs)
print(json.dumps(len(sk.MULTI[12].stats.cache_misses)))
"""


def test_multi_kernels_load_from_cache_in_a_new_process() -> None:
    root = Path(sk.__file__).resolve().parents[1]
    if not os.access(Path(sk.__file__).parent, os.W_OK):
        pytest.skip("the package directory is read-only: Numba cannot cache here")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    for _ in range(2):  # the first run fills the cache (a no-op when earlier tests or runs did)
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == 0, "the multi kernel recompiled in a fresh process"
