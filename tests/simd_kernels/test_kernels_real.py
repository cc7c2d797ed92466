"""simd_kernels on the real models' tensors, read in place from the mmap (same tolerances as test_kernels)."""

from __future__ import annotations

import numpy as np
import pytest

import gguf_io
import quant
import simd_kernels as sk
from test_kernels import check

# (tensor, row slice): one tensor of every type each model has; big matrices are sliced to an odd count
SMOLLM2 = [
    ("blk.0.ffn_up.weight", None),
    ("blk.3.attn_k.weight", None),
    ("blk.0.ffn_down.weight", None),
    ("token_embd.weight", slice(1000, 1301)),
    ("blk.0.attn_norm.weight", None),
]
GEMMA3 = [
    ("blk.0.ffn_gate.weight", None),
    ("blk.0.ffn_down.weight", None),
    ("blk.0.attn_k.weight", None),
    ("blk.0.attn_output.weight", None),
    ("token_embd.weight", slice(260000, 260301)),
    ("blk.0.ffn_norm.weight", None),
]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with gguf_io.open(smollm2_path) as f:
        yield f


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    with gguf_io.open(gemma3_path) as f:
        yield f


def _tensors(model, names):
    for name, rows in names:
        info = model.tensors[name]
        w = info.data if rows is None else info.data[rows]
        yield info.ggml_type, w, info.shape[-1]


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_real_tensors_in_place(which: str, request) -> None:
    model = request.getfixturevalue(which)
    names = SMOLLM2 if which == "smollm2" else GEMMA3
    types = set()
    rng = np.random.default_rng(11)
    for t, w, cols in _tensors(model, names):
        types.add(t)
        assert not w.flags.writeable  # really the read-only mmap view, not a copy
        x = rng.standard_normal((3, cols)).astype(np.float32)
        check(t, w, x[:1], sk.matvec(t, w, x[0])[None])
        check(t, w, x, sk.matmul(t, w, x))
        ids = np.array([0, w.shape[0] - 1, w.shape[0] // 2])
        want = quant.dequantize(w, t, (w.shape[0], cols))[ids]
        assert np.array_equal(sk.get_rows(t, w, ids).view(np.uint32), want.view(np.uint32))
    assert types == ({0, 3, 8} if which == "smollm2" else {0, 6, 8, 12, 14})


def test_real_prefill_tiles(gemma3) -> None:
    """The BLAS tile path on a real Q4_K matrix with a batch just large enough to take it."""
    info = gemma3.tensors["blk.0.ffn_gate.weight"]
    x = np.random.default_rng(2).standard_normal((sk.api.BLAS_MIN_TOKENS, info.shape[-1])).astype(np.float32)
    wd = quant.dequantize(info.data, info.ggml_type, info.shape).astype(np.float64)
    out = sk.matmul(info.ggml_type, info.data, x)
    assert np.all(np.abs(out - x @ wd.T) <= 1e-5 * (np.abs(x) @ np.abs(wd).T))
