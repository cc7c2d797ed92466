"""Numba kernels: fused dequantize x dot over raw GGUF blocks (matvec, matmul, get_rows).

`MUL` and `ROWS` import a format's kernel module when a kernel of that format is first asked for.

`simd_kernels.ops` (norms, RoPE, softmax, attention) lives beside these and is imported on its own.
"""
from . import _cache_guard, rows, warm
from .api import (
    BLOCKS,
    EXPERTS,
    MUL,
    MULTI,
    PREFILL,
    ROWS,
    KernelArgumentError,
    get_rows,
    matmul,
    matvec,
)

warm.refuse_blas_probe()  # before any kernel runs: Numba's start-up then skips importing scipy.linalg

_cache_guard.check(rows.n_groups)  # any kernel of the package: they share one cache directory

__all__ = ["BLOCKS", "EXPERTS", "MUL", "MULTI", "PREFILL", "ROWS", "KernelArgumentError", "get_rows",
           "matmul", "matvec"]
