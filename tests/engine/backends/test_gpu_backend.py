"""The CUDA device against the CPU reference. Runs only where CuPy sees a GPU; skipped with the reason otherwise.

Per block format: the GPU row dequantizer against `quant.dequantize`, and `linear` (fused kernel for a few
tokens, tiles + cuBLAS for many) against float64 products of the dequantized weight. Layer ops against
`simd_kernels.ops`. Whole models: logits with 0, half and all layers (+ output) on the GPU against all-CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

import quant
from localrt.engine.backends import devices
from localrt.engine.backends.backend import QTensor
from simd_kernels import ops

_REPORT = devices.probe(0)
pytestmark = pytest.mark.skipif(_REPORT.gpu is None, reason=f"no usable GPU for the CUDA device: {_REPORT.reason}")

FORMATS = {
    "f32": 0,
    "f16": 1,
    "bf16": 30,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "q2_k": 10,
    "q3_k": 11,
    "q4_k": 12,
    "q5_k": 13,
    "q6_k": 14,
    "iq4_nl": 20,
    "iq4_xs": 23,
}


@pytest.fixture(scope="module")
def gpu():
    from localrt.engine.backends.backend_cuda import CUDABackend

    return CUDABackend(0)


def _weight(name: str, ggml_type: int, rows: int, cols: int, seed: int) -> tuple[QTensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    if ggml_type == 0:
        raw = x.view(np.uint8).reshape(rows, -1)
    elif ggml_type == 1:
        raw = x.astype(np.float16).view(np.uint8).reshape(rows, -1)
    else:
        raw = quant.quantize(x, ggml_type)
    return QTensor(name, ggml_type, (rows, cols), raw), quant.dequantize(raw, ggml_type, (rows, cols))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_rows_kernel_matches_reference(gpu, name):
    w, dense = _weight(name, FORMATS[name], 48, 512, 1)
    got = gpu.to_host(gpu.embed(gpu.upload(w), np.array([0, 47, 3, 3], np.int64)))
    np.testing.assert_allclose(got, dense[[0, 47, 3, 3]], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n_tok", [1, 3, 8, 40])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_linear_matches_dense_product(gpu, name, n_tok):
    w, dense = _weight(name, FORMATS[name], 300, 768, 2)
    x = np.random.default_rng(3).standard_normal((n_tok, 768)).astype(np.float32)
    got = gpu.to_host(gpu.linear(gpu.upload(w), gpu.put(x)))
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_norms_rope_activations_match_ops(gpu):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    d = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    want_x, want = x.copy(), np.empty_like(x)
    ops.add_rms_norm(want_x, d, w, 1e-6, want)
    gx, gout = gpu.put(x), gpu.zeros((5, 64))
    gpu.ops.add_rms_norm(gx, gpu.put(d), gpu.put(w), 1e-6, gout)
    np.testing.assert_allclose(gpu.to_host(gx), want_x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu.to_host(gout), want, rtol=1e-5, atol=1e-5)
    heads = rng.standard_normal((5, 4, 16)).astype(np.float32)
    pos = np.arange(100, 105, dtype=np.int64)
    ff = np.ones(8, np.float32)
    for mode in (ops.ROPE_NORMAL, ops.ROPE_NEOX):
        want_h = ops.rope(heads.copy(), pos, 16, 10000.0, 1.0, ff, mode)
        got_h = gpu.to_host(gpu.ops.rope(gpu.put(heads), pos, 16, 10000.0, 1.0, ff, mode))
        np.testing.assert_allclose(got_h, want_h, rtol=1e-4, atol=1e-4)
    g, u = rng.standard_normal((2, 3, 200)).astype(np.float32)
    for fn in ("swiglu", "geglu_tanh"):
        want_a = getattr(ops, fn)(g, u, np.empty_like(g))
        got_a = gpu.to_host(getattr(gpu.ops, fn)(gpu.put(g), gpu.put(u), gpu.zeros(g.shape)))
        np.testing.assert_allclose(got_a, want_a, rtol=1e-5, atol=1e-5)
    want_c = ops.softcap(g.copy(), np.float32(30.0))
    np.testing.assert_allclose(gpu.to_host(gpu.ops.softcap(gpu.put(g), 30.0)), want_c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("as_f16", [False, True])
@pytest.mark.parametrize("window", [0, 5])
def test_kv_store_and_attention_match_ops(gpu, window, as_f16):
    rng = np.random.default_rng(5)
    n_slots, n_kv, cap, hd, n_head = 2, 2, 32, 16, 4
    kc, vc = np.zeros((2, n_slots, n_kv, cap, hd), np.float32)
    gk, gv = gpu.zeros(kc.shape), gpu.zeros(vc.shape)
    for start, n, slot in ((0, 12, 0), (0, 3, 1), (12, 1, 0), (3, 1, 1)):
        pos = np.arange(start, start + n, dtype=np.int64)
        slots = np.full(n, slot, np.int64)
        k, v = rng.standard_normal((2, n, n_kv, hd)).astype(np.float32)
        q = rng.standard_normal((n, n_head, hd)).astype(np.float32)
        if as_f16:  # the CPU path rounds before the store (llama.cpp's F16 cache); the GPU kernel rounds inside
            ops.kv_store(
                k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32), kc, vc, pos, slots
            )
        else:
            ops.kv_store(k, v, kc, vc, pos, slots)
        gpu.ops.kv_store(gpu.put(k), gpu.put(v), gk, gv, pos, slots, as_f16)
        want = ops.attention(q, kc, vc, pos, slots, window, 0.25, np.empty((n, n_head, hd), np.float32))
        got = gpu.attention(gpu.put(q), gk, gv, pos, slots, window, 0.25, gpu.zeros((n, n_head, hd)))
        np.testing.assert_allclose(gpu.to_host(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(gpu.to_host(gk), kc)


def _logits_with(path, num_gpu: int, ids) -> np.ndarray:
    from localrt import load_model

    model = load_model(path, num_ctx=256, num_gpu=num_gpu)
    try:
        assert model.placement.n_gpu == num_gpu
        return model.logits(ids)
    finally:
        model.close()


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_whole_model_logits_agree_with_cpu(which, smollm2_path, gemma3_path, llamacpp_reference):
    from localrt import load_model

    path = smollm2_path if which == "smollm2" else gemma3_path
    cpu = load_model(path, num_ctx=256, num_gpu=0)
    ids = cpu.tokenize("The capital of France is Paris. The capital of Italy is")
    want = cpu.logits(ids)
    n_layer = cpu.config.n_layer
    cpu.close()
    for num_gpu in (n_layer // 2, n_layer, n_layer + 1):
        got = _logits_with(path, num_gpu, ids)
        # The CPU's fused kernels round activations to 8 bits (as llama.cpp's CPU backend); the GPU keeps f32.
        assert got.argmax(axis=1)[-1] == want.argmax(axis=1)[-1], num_gpu
        assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.9, num_gpu
        spread = float(want.max() - want.min())
        assert np.abs(got - want).max() < 0.05 * spread, (num_gpu, np.abs(got - want).max(), spread)


def test_decode_on_gpu_matches_cpu_greedy(smollm2_path):
    from localrt import load_model

    def greedy(all_on_gpu: bool):
        m = load_model(smollm2_path, num_ctx=256, num_gpu=0)
        if all_on_gpu:
            m.close()
            m = load_model(smollm2_path, num_ctx=256, num_gpu=m.config.n_layer + 1)
        ids = m.tokenize("Once upon a time")
        toks = [
            e.token for e in m.generate(ids, {"temperature": 0, "num_predict": 16, "seed": 1}) if hasattr(e, "token")
        ]
        m.close()
        return toks

    cpu, gpu_all = greedy(False), greedy(True)
    assert cpu[:8] == gpu_all[:8]
