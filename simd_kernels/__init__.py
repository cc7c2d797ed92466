"""Numba kernels: fused dequantize x dot over raw GGUF blocks (matvec, matmul, get_rows).

`simd_kernels.ops` (norms, RoPE, softmax, attention) lives beside these and is imported on its own.
"""
from . import _cache_guard
from .api import BLOCKS, EXPERTS, MUL, ROWS, KernelArgumentError, get_rows, matmul, matvec

_cache_guard.check(MUL[8])

__all__ = ["BLOCKS", "EXPERTS", "MUL", "ROWS", "KernelArgumentError", "get_rows", "matmul", "matvec"]
