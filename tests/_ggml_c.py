"""Optional oracle: ggml's own C quantizers, from the libggml shipped inside llama-cpp-python when installed.

The libraries are looked for where llama-cpp-python itself looks: `$LLAMA_CPP_LIB_PATH` if set, else the
`lib` folder inside the installed `llama_cpp` package.
`ggml_c_quantizer(name)` returns a function float32 (rows, cols) -> uint8 (rows, row_bytes), or None when
llama-cpp-python (or that symbol) is absent, so tests can skip cleanly; `ggml_c_quantize_chunk(type)` the
same through `ggml_quantize_chunk`, the entry point llama.cpp's model quantizer calls.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

import numpy as np

import quant

_LIBS: list[ctypes.CDLL] | None = None


def _libdir() -> Path | None:
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        return Path(os.environ["LLAMA_CPP_LIB_PATH"])
    spec = importlib.util.find_spec("llama_cpp")
    if spec is not None and spec.origin is not None:
        return Path(spec.origin).parent / "lib"
    return None


def _libs() -> list[ctypes.CDLL]:
    global _LIBS
    if _LIBS is None:
        _LIBS = []
        libdir = _libdir()
        if libdir is not None:
            for name in ("libggml-base.so", "libggml-cpu.so"):
                if (libdir / name).exists():
                    _LIBS.append(ctypes.CDLL(str(libdir / name), mode=ctypes.RTLD_GLOBAL))
            if len(_LIBS) == 2 and hasattr(_LIBS[1], "ggml_cpu_init"):
                _LIBS[1].ggml_cpu_init()
    return _LIBS


def ggml_c_quantizer(symbol: str, ggml_type: int):
    for lib in _libs():
        fn = getattr(lib, symbol, None)
        if fn is not None:
            break
    else:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros((x.shape[0], quant.row_bytes(ggml_type, x.shape[1])), dtype=np.uint8)
        fn(x.ctypes.data, out.ctypes.data, x.size)
        return out

    return run


def ggml_c_quantize_chunk(ggml_type: int):
    """`ggml_quantize_chunk(type, src, dst, 0, rows, cols, NULL)` (no importance matrix) as float32 (rows, cols) ->
    uint8 (rows, row_bytes), or None without libggml. For the IQ types it runs the scale search llama-quantize
    runs, where `quantize_row_*_ref` (if any) does not."""
    for lib in _libs():
        fn = getattr(lib, "ggml_quantize_chunk", None)
        if fn is not None:
            break
    else:
        return None
    fn.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    fn.restype = ctypes.c_size_t

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros((x.shape[0], quant.row_bytes(ggml_type, x.shape[1])), dtype=np.uint8)
        written = fn(int(ggml_type), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
        assert written == out.nbytes, f"ggml_quantize_chunk wrote {written} bytes, expected {out.nbytes}"
        return out

    return run
