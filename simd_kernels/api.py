"""Public entry points: matvec (decode), matmul (a batch of tokens), get_rows (embedding lookup).

Each dispatches on the GGML type id to a raw @njit kernel; the raw kernels (`MUL`, `ROWS`) may also be
called directly from other nopython code, with the same argument contract: w C-contiguous uint8
(rows, row_bytes) raw blocks, x C-contiguous float32 (n_tok, cols), out float32 (n_tok, rows); the raw
kernels check nothing. Only cheap shape/dtype checks run per call here, and `threads.use_threads_for`
picks one thread or all for the call (callers of the raw kernels may do the same).
"""

from __future__ import annotations

import importlib

import numpy as np
from gguf_io.constants import BLOCK_SIZES

from .checks import KernelArgumentError
from .ir import X86
from .simd import EXPERTS as _EXPERTS_BY_NAME
from .simd import GROUPED as _GROUPED_BY_NAME
from .simd import MULTI as _MULTI_BY_NAME
from .threads import use_threads_for

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16, MXFP4 = 10, 11, 12, 13, 14, 20, 23, 30, 39


class KernelTable(dict):
    """ggml type id -> kernel, importing the module of a format on first use: a process loads (and Numba
    registers) the kernels of the formats its models hold, not all of them. Hits are plain dict lookups."""

    def __init__(self, where: dict[int, tuple[str, str]]) -> None:
        super().__init__()
        self._where = where  # type id -> (module in this package, kernel name)

    def __missing__(self, ggml_type: int):
        module, name = self._where[ggml_type]  # KeyError for a type without a kernel, as a dict's
        kernel = self[ggml_type] = getattr(importlib.import_module(f"{__package__}.{module}"), name)
        return kernel

    def __contains__(self, ggml_type: object) -> bool:
        return ggml_type in self._where

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def keys(self):
        return self._where.keys()

    def values(self):
        return [self[t] for t in self._where]

    def items(self):
        return [(t, self[t]) for t in self._where]

    def get(self, ggml_type, default=None):
        return self[ggml_type] if ggml_type in self._where else default


_MUL_MODULES = {
    F32: "floats",
    F16: "floats",
    BF16: "floats",
    Q4_0: "block32",
    Q4_1: "block32",
    Q5_0: "block32",
    Q5_1: "block32",
    Q8_0: "block32",
    Q2_K: "kquants",
    Q3_K: "kquants",
    Q4_K: "kquants",
    Q5_K: "kquants",
    Q6_K: "kquants",
    IQ4_NL: "iquants",
    IQ4_XS: "iquants",
    MXFP4: "iquants",
}
_NAMES = {
    F32: "f32",
    F16: "f16",
    BF16: "bf16",
    Q4_0: "q4_0",
    Q4_1: "q4_1",
    Q5_0: "q5_0",
    Q5_1: "q5_1",
    Q8_0: "q8_0",
    Q2_K: "q2_k",
    Q3_K: "q3_k",
    Q4_K: "q4_k",
    Q5_K: "q5_k",
    Q6_K: "q6_k",
    IQ4_NL: "iq4_nl",
    IQ4_XS: "iq4_xs",
    MXFP4: "mxfp4",
}

# ggml type id -> (elements per block, bytes per block) for the weight formats the kernels read: gguf_io's table
BLOCKS: dict[int, tuple[int, int]] = {t: BLOCK_SIZES[t] for t in _NAMES}

# mul(w, x (n_tok, cols) f32, out (n_tok, rows) f32): fused dequantize x dot
MUL = KernelTable({t: (module, f"mul_{_NAMES[t]}") for t, module in _MUL_MODULES.items()})

# experts(w (n_expert * rows, row_bytes), rows, x (n_x, cols) f32, experts (n_pair,) int64, xrow (n_pair,) int64,
# out (n_pair, rows) f32): out[p] = expert experts[p]'s rows . x[xrow[p]], as MUL computes each of them (simd.py)
EXPERTS = {t: _EXPERTS_BY_NAME[k.py_func.__name__] for t, k in MUL.items() if k.py_func.__name__ in _EXPERTS_BY_NAME}

# grouped(w0, w1 (n_expert * rows, row_bytes; w1 may have 0 rows), rows, x (n_x, cols) f32, experts (n_groups,)
# int64, starts (n_groups + 1,) int64, out0, out1 (n_x, rows) f32): out_i[t] = expert experts[g]'s rows of w_i . x[t]
# for x's rows t of group g (starts[g] <= t < starts[g + 1]), as MUL computes each of them (simd.py)
GROUPED = {t: _GROUPED_BY_NAME[k.py_func.__name__] for t, k in MUL.items() if k.py_func.__name__ in _GROUPED_BY_NAME}

# multi(w0, w1, w2, x (n_tok, cols) f32, out0, out1, out2): out_i (n_tok, rows_i) = x @ dequant(w_i).T for three
# weights of one format and cols (a 0-row w2 / out2 for two), x quantized once, every row as MUL computes it (simd.py)
MULTI = {t: _MULTI_BY_NAME[k.py_func.__name__] for t, k in MUL.items() if k.py_func.__name__ in _MULTI_BY_NAME}

# rows(w, ids (n,) int64, out (n, cols) f32): dequantize the selected rows
ROWS = KernelTable({t: ("dequant", f"rows_{name}") for t, name in _NAMES.items()})

# prefill(w, xq, xd, sums, out) with (xq, xd, sums) = quantize(x): a prompt piece's kernel for these formats
# (simd_kernels.kquants_prompt, block32_prompt). The K-quants' have numbers of their own (not the per-row kernel's), so they serve
# only the pieces; the 32-element formats' MUL kernels (and MXFP4's, simd_kernels.iquants) share their row dots
# (simd_kernels.block32) on every host. Each is faster than the per-row kernel on a prompt piece (docs/measurements.md).
# Q8_0's unsigned weights (q + 128) pass vpmaddubsw's range, so it takes the kernel only with VNNI.
_PREFILL_MODULES = (
    {
        Q4_K: "kquants_prompt",
        Q5_K: "kquants_prompt",
        Q6_K: "kquants_prompt",
        Q4_0: "block32_prompt",
        Q4_1: "block32_prompt",
        Q5_0: "block32_prompt",
        Q5_1: "block32_prompt",
        MXFP4: "block32_prompt",
    }
    if "avx2" in X86
    else {}
) | ({Q8_0: "block32_prompt"} if {"avx512vnni", "avx512vl"} <= X86 else {})
PREFILL = KernelTable({t: (module, f"PREFILL_{_NAMES[t].upper()}") for t, module in _PREFILL_MODULES.items()})

# Batches at least this large go through dequantized row tiles and BLAS; smaller ones use the fused
# integer kernel (8 tokens per decoded weight block), which measured as fast or faster below this.
BLAS_MIN_TOKENS = 256
TILE_BYTES = 8 << 20  # f32 bytes per dequantized tile: whole matrices for small models, big BLAS calls


def _kernel(table: dict, ggml_type: int):
    try:
        return table[ggml_type]
    except KeyError:
        raise KernelArgumentError(f"ggml type {ggml_type!r} has no kernel (supported: {sorted(table)})") from None


def _readonly(w: np.ndarray) -> np.ndarray:
    """A read-only view of w: model weights are read-only mmap views, so only that kernel variant compiles."""
    if w.flags.writeable:
        w = w.view()
        w.flags.writeable = False
    return w


def _cols(ggml_type: int, w: np.ndarray) -> int:
    """Elements per row of w, checking that w is a uint8 (rows, whole blocks) matrix."""
    if w.dtype != np.uint8 or w.ndim != 2 or not w.flags.c_contiguous:
        raise KernelArgumentError(
            f"weights must be C-contiguous uint8 (rows, row_bytes), got {w.dtype} {w.shape}"
            f"{'' if w.flags.c_contiguous else ' (not contiguous)'}"
        )
    per_block, block_bytes = BLOCKS[ggml_type]
    if w.shape[1] % block_bytes or w.shape[0] == 0:
        raise KernelArgumentError(
            f"weight rows of {w.shape[1]} bytes are not whole {block_bytes}-byte blocks "
            f"of ggml type {ggml_type}, or there are no rows ({w.shape})"
        )
    return w.shape[1] // block_bytes * per_block


def _check_f32(name: str, a: np.ndarray, shape: tuple) -> None:
    if a.dtype != np.float32 or a.shape != shape or not a.flags.c_contiguous:
        raise KernelArgumentError(f"{name} must be C-contiguous float32 {shape}, got {a.dtype} {a.shape}")


def matvec(ggml_type: int, w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """out (rows,) = dequant(w) (rows, cols) @ x (cols,), with x quantized as llama.cpp does."""
    kernel = _kernel(MUL, ggml_type)
    cols = _cols(ggml_type, w)
    _check_f32("x", x, (cols,))
    if out is None:
        out = np.empty(w.shape[0], np.float32)  # (rows,)
    else:
        _check_f32("out", out, (w.shape[0],))
    use_threads_for(w.nbytes)
    kernel(_readonly(w), x.reshape(1, cols), out.reshape(1, -1))
    return out


def matmul(ggml_type: int, w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """out (n_tok, rows) = x (n_tok, cols) @ dequant(w).T."""
    kernel = _kernel(MUL, ggml_type)
    cols = _cols(ggml_type, w)
    if x.ndim != 2:
        raise KernelArgumentError(f"x must be float32 (n_tok, {cols}), got {x.dtype} {x.shape}")
    _check_f32("x", x, (x.shape[0], cols))
    rows = w.shape[0]
    if out is None:
        out = np.empty((x.shape[0], rows), np.float32)  # (n_tok, rows)
    else:
        _check_f32("out", out, (x.shape[0], rows))
    if x.shape[0] < BLAS_MIN_TOKENS:
        use_threads_for(w.nbytes * x.shape[0])
        kernel(_readonly(w), x, out)
    else:
        _matmul_tiles(ROWS[ggml_type], _readonly(w), x, out)
    return out


def _matmul_tiles(rows_kernel, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Dequantize TILE_BYTES of weight rows at a time into a scratch tile and let BLAS multiply it.

    The tile dequantizes on this thread alone: Numba's OpenMP workers and OpenBLAS's threads spin-wait
    after each parallel region, and alternating the two pools on 2 cores starves both.
    """
    rows = w.shape[0]
    tile_rows = min(rows, max(64, TILE_BYTES // (4 * x.shape[1])))
    ids = np.arange(rows, dtype=np.int64)  # (rows,)
    tile = np.empty((tile_rows, x.shape[1]), np.float32)  # (tile_rows, cols)
    part = np.empty((x.shape[0], tile_rows), np.float32)  # (n_tok, tile_rows)
    use_threads_for(0)
    for r0 in range(0, rows, tile_rows):
        n = min(tile_rows, rows - r0)
        rows_kernel(w, ids[r0 : r0 + n], tile[:n])
        np.matmul(x, tile[:n].T, out=part[:, :n])
        out[:, r0 : r0 + n] = part[:, :n]


def get_rows(ggml_type: int, w: np.ndarray, ids) -> np.ndarray:
    """float32 (len(ids), cols): the dequantized rows ids of w (embedding lookup)."""
    kernel = _kernel(ROWS, ggml_type)
    cols = _cols(ggml_type, w)
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise KernelArgumentError(f"ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
        raise KernelArgumentError(f"row ids must lie in [0, {w.shape[0]}), got {ids.min()}..{ids.max()}")
    out = np.empty((ids.size, cols), np.float32)  # (n, cols)
    use_threads_for(out.nbytes)
    kernel(_readonly(w), ids.astype(np.int64, copy=False), out)
    return out
