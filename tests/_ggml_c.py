"""Optional oracle: ggml's own C quantizers, from the libggml shipped inside llama-cpp-python when installed.

`ggml_c_quantizer(name)` returns a function float32 (rows, cols) -> uint8 (rows, row_bytes), or None when
llama-cpp-python (or that symbol) is absent, so tests can skip cleanly.
"""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np

import quant

_LIBS: list[ctypes.CDLL] | None = None


def _libs() -> list[ctypes.CDLL]:
    global _LIBS
    if _LIBS is None:
        _LIBS = []
        spec = importlib.util.find_spec("llama_cpp")
        if spec is not None and spec.origin is not None:
            libdir = Path(spec.origin).parent / "lib"
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
