"""CPU checks of the CUDA device's source (no GPU needed).

The per-format block decoders (`cuda_source.DEVICE_FUNCS`) are plain C: compiled here with the host C
compiler, each must reproduce `quant.dequantize` bit for bit on random blocks. Where `nvcc` is installed,
the whole kernel module must also compile for sm_90, so a syntax slip cannot wait for a GPU session.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

import quant
from localrt.engine.backends import cuda_source

_HARNESS = r"""
#include <math.h>
#define DEV static inline
%s
typedef float (*deq_fn)(const u8*, int);
static deq_fn table(int t) {
    switch (t) {
%s
    }
    return 0;
}
int deq_rows(int ggml_type, const u8* w, long long row_bytes, int rows, int cols, int qk, int bb, float* out) {
    deq_fn f = table(ggml_type);
    if (!f) return -1;
    for (int r = 0; r < rows; ++r)
        for (int e = 0; e < cols; ++e)
            out[(long long)r * cols + e] = f(w + r * row_bytes + (long long)(e / qk) * bb, e %% qk);
    return 0;
}
void round_f16_n(const float* x, int n, float* out) { for (int i = 0; i < n; ++i) out[i] = round_f16(x[i]); }
"""


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no host C compiler (cc/gcc) to compile the CUDA block decoders with")
    d = tmp_path_factory.mktemp("cuda_host")
    cases = "\n".join(f"        case {t}: return deq_{name};" for name, (t, _, _) in cuda_source.FORMATS.items())
    src = d / "deq.c"
    src.write_text(_HARNESS % (cuda_source.DEVICE_FUNCS, cases))
    so = d / "deq.so"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(so), str(src), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    lib.deq_rows.restype = ctypes.c_int
    return lib


def _host_dequant(lib, ggml_type: int, raw: np.ndarray, cols: int) -> np.ndarray:
    name = next(n for n, (t, _, _) in cuda_source.FORMATS.items() if t == ggml_type)
    _, qk, bb = cuda_source.FORMATS[name]
    raw = np.ascontiguousarray(raw)
    out = np.empty((raw.shape[0], cols), np.float32)  # (rows, cols)
    rc = lib.deq_rows(
        ggml_type,
        raw.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_longlong(raw.shape[1]),
        raw.shape[0],
        cols,
        qk,
        bb,
        out.ctypes.data_as(ctypes.c_void_p),
    )
    assert rc == 0
    return out


@pytest.mark.parametrize("name", sorted(cuda_source.FORMATS))
def test_block_decoder_matches_reference(host_lib, name):
    ggml_type, qk, _ = cuda_source.FORMATS[name]
    rng = np.random.default_rng(ggml_type)
    rows, cols = 5, 2 * max(qk, 32) * (2 if qk == 256 else 4)
    x = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 4, (rows, 1)).astype(np.float32)
    if name == "f16":
        raw = x.astype(np.float16).view(np.uint8).reshape(rows, -1)
    elif name == "f32":
        raw = x.view(np.uint8).reshape(rows, -1)
    else:
        raw = quant.quantize(x, ggml_type)
    want = quant.dequantize(raw, ggml_type, (rows, cols))
    got = _host_dequant(host_lib, ggml_type, raw, cols)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_f16_decoder_special_values(host_lib):
    halves = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6.1e-5, 5.96e-8, 3.0e-6, np.inf, -np.inf], np.float16)
    got = _host_dequant(host_lib, 1, halves.view(np.uint8).reshape(1, -1), len(halves))[0]
    np.testing.assert_array_equal(got.view(np.uint32), halves.astype(np.float32).view(np.uint32))
    nan = _host_dequant(host_lib, 1, np.array([np.nan], np.float16).view(np.uint8).reshape(1, -1), 1)[0]
    assert np.isnan(nan[0])


def test_random_raw_blocks_match_reference(host_lib):
    """Arbitrary bytes (every bit pattern of scales and quants), not only what a quantizer emits."""
    rng = np.random.default_rng(7)
    for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"):
        ggml_type, qk, bb = cuda_source.FORMATS[name]
        raw = rng.integers(0, 256, (3, 2 * bb), dtype=np.uint8)
        # Keep the f16 scales finite and moderate so both sides compute ordinary numbers.
        for r in range(3):
            for b in range(2):
                blk = raw[r, b * bb : (b + 1) * bb]
                for off in _scale_offsets(name, bb):
                    blk[off : off + 2] = np.frombuffer(np.float16(rng.uniform(-2, 2)).tobytes(), np.uint8)
        want = quant.dequantize(raw, ggml_type, (3, 2 * qk))
        got = _host_dequant(host_lib, ggml_type, raw, 2 * qk)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=name)


def _scale_offsets(name: str, bb: int) -> tuple[int, ...]:
    return {
        "q4_0": (0,),
        "q4_1": (0, 2),
        "q5_0": (0,),
        "q5_1": (0, 2),
        "q8_0": (0,),
        "q2_k": (80, 82),
        "q3_k": (108,),
        "q4_k": (0, 2),
        "q5_k": (0, 2),
        "q6_k": (208,),
    }[name]


def test_kernel_module_compiles_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: the CUDA module's syntax is checked only on the GPU then")
    src = tmp_path / "kernels.cu"
    src.write_text(cuda_source.kernel_source())
    res = subprocess.run(
        [nvcc, "--ptx", "-arch=sm_80", "-Werror", "all-warnings", "-o", str(tmp_path / "k.ptx"), str(src)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    for name in cuda_source.FORMATS:
        assert f".entry rows_{name}" in ptx and f".entry mul_{name}" in ptx
    for kernel in ("add_rms_norm", "rope", "gated", "softcap", "kv_store", "attention"):
        assert f".entry {kernel}" in ptx


def test_f16_rounding_matches_numpy(host_lib):
    """The F16 KV cache's rounding: ties to even, subnormals, overflow to inf, as float16 conversion does."""
    rng = np.random.default_rng(11)
    x = np.concatenate(
        [
            rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 6, 4000),
            [65504.0, 65519.9, 65520.0, -7e4, 0.0, -0.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-25, 3 * 2.0**-25],
        ]
    ).astype(np.float32)
    out = np.empty_like(x)
    host_lib.round_f16_n(x.ctypes.data_as(ctypes.c_void_p), len(x), out.ctypes.data_as(ctypes.c_void_p))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
