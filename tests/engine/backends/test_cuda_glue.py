"""The CUDA device's Python glue on the CPU, against the kernel signatures (no GPU, no CuPy).

A stand-in CuPy module keeps arrays in NumPy and parses the `extern "C" __global__` signatures of
`cuda_source`; every launch `CUDABackend` makes during real forwards (prefill and decode, layers and
output on the "GPU") is checked for argument count, C type (pointer dtype, int, long long, float) and
launch shape. The kernels themselves do not run here, so the values are not checked: that is
tests/engine/backends/test_cuda_source.py (block decoders on the host) and
tests/engine/backends/test_gpu_backend.py (on a GPU).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from localrt import load_model
from localrt.engine.backends.backend_cuda import CUDABackend
from localrt.engine.backends.offload import place_layers

_SIG = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)', re.S)
_POINTEE = {"u8": np.uint8, "float": np.float32, "long long": np.int64}
_SCALAR = {"int": np.int32, "long long": np.int64, "float": np.float32}


def _params(decl: str) -> list[tuple[str, bool]]:
    out = []
    for p in decl.split(","):
        p = " ".join(p.replace("const", "").split())
        ctype, _, _name = p.rpartition(" ")
        pointer = "*" in p
        out.append((ctype.replace("*", "").strip() if pointer else ctype, pointer))
    return out


class _Kernel:
    def __init__(self, name: str, params, calls: list) -> None:
        self.name, self.params, self.calls = name, params, calls

    def __call__(self, grid, block, args) -> None:
        assert len(args) == len(self.params), f"{self.name}: {len(args)} args for {len(self.params)} parameters"
        assert all(isinstance(g, int) and g >= 1 for g in grid) and len(grid) <= 3, (self.name, grid)
        assert all(isinstance(b, int) and b >= 1 for b in block) and np.prod(block) <= 1024, (self.name, block)
        assert grid[0] < 2**31 and (len(grid) < 2 or grid[1] <= 65535), (self.name, grid)
        for i, ((ctype, pointer), a) in enumerate(zip(self.params, args)):
            where = f"{self.name} arg {i} ({ctype}{'*' if pointer else ''})"
            if pointer:
                if isinstance(a, np.uint64):
                    assert a == 0, where  # only NULL travels as a bare integer
                    continue
                assert isinstance(a, np.ndarray), f"{where}: got {type(a).__name__}"
                assert a.dtype == _POINTEE[ctype], f"{where}: dtype {a.dtype}"
                assert a.flags.c_contiguous, f"{where}: not contiguous"
            else:
                assert type(a) is _SCALAR[ctype], f"{where}: got {type(a).__name__}"
        self.calls.append(self.name)


class _Module:
    def __init__(self, code: str, options=(), calls=None) -> None:
        self.sigs = {name: _params(decl) for name, decl in _SIG.findall(code)}
        self.calls = calls

    def get_function(self, name: str) -> _Kernel:
        return _Kernel(name, self.sigs[name], self.calls)


def _fake_cupy(calls: list):
    def asarray(a, dtype=None):
        return np.array(a, dtype=dtype, copy=True) if dtype is not None or isinstance(a, np.ndarray) else np.asarray(a)

    return SimpleNamespace(
        float32=np.float32,
        int64=np.int64,
        asarray=asarray,
        ascontiguousarray=np.ascontiguousarray,
        asnumpy=lambda a: np.array(a, copy=True),
        empty=np.zeros,
        empty_like=np.zeros_like,
        zeros=np.zeros,
        arange=np.arange,
        matmul=np.matmul,
        cuda=SimpleNamespace(Device=lambda i: SimpleNamespace(use=lambda: None)),
        RawModule=lambda code, options=(): _Module(code, options, calls),
    )


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model_path(request, smollm2_path, gemma3_path):
    return smollm2_path if request.param == "smollm2" else gemma3_path


def test_every_launch_matches_its_kernel_signature(model_path):
    calls: list[str] = []
    m = load_model(model_path, num_ctx=64, num_gpu=0)
    gpu = CUDABackend(0, cupy=_fake_cupy(calls))
    n = m.config.n_layer
    place_layers(m, gpu, range(n // 2, n), output=True)
    ids = m.tokenize("Hello there, how are you today? I am fine, thanks.")
    logits = m.logits(ids)  # prefill: dequantized tiles, multi-token attention
    assert logits.shape == (len(ids), m.config.n_vocab)
    m.forward(m.batch([ids[-1]], len(ids)), m.cache)  # decode: the fused kernels
    used = set(calls)
    assert {"add_rms_norm", "rope", "kv_store", "attention", "gated"} <= used
    types = {t.ggml_type for L in m.weights.layers[n // 2 :] for t in vars(L).values() if hasattr(t, "ggml_type")}
    names = {k.split("_", 1)[1] for k in used if k.startswith(("mul_", "rows_"))}
    assert len(names) >= len(types)  # each weight format of those layers went through its own kernels
    assert any(k.startswith("mul_") for k in used) and any(k.startswith("rows_") for k in used)
    m.close()


def test_embed_and_vector_shapes():
    calls: list[str] = []
    gpu = CUDABackend(0, cupy=_fake_cupy(calls))
    from localrt.engine.backends.backend import QTensor

    w = QTensor("t", 8, (4, 64), np.zeros((4, 68), np.uint8))  # Q8_0: 2 blocks of 34 bytes per row
    assert gpu.embed(gpu.upload(w), [1, 3]).shape == (2, 64)
    assert calls == ["rows_q8_0"]
    out = gpu.linear(gpu.upload(w), gpu.put(np.ones((3, 64), np.float32)))
    assert out.shape == (3, 4) and calls[-1] == "mul_q8_0"
    with pytest.raises(Exception, match="cannot compute"):
        gpu.upload(QTensor("iq", 16, (4, 256), np.zeros((4, 66), np.uint8)))
