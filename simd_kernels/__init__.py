"""Numba kernels: fused dequantize x dot over raw GGUF blocks (matvec, matmul, get_rows).

`MUL` and `ROWS` import a format's kernel module when a kernel of that format is first asked for.

`simd_kernels.ops` (norms, RoPE, softmax, attention) lives beside these and is imported on its own.

Adding a block format (IQ4_NL, IQ4_XS and MXFP4 came in this way):
1. `gguf_io/constants.py`: its GGMLType id and its row of BLOCK_SIZES (elements and bytes per block), the one
   table of sizes that `quant` and `simd_kernels.BLOCKS` read.
2. `quant/formats.py`: its byte layout (`_block(name, fields)`, which must fill those bytes) and VEC_DOT_TYPE, the
   Q8 flavour llama.cpp quantizes activations to against it. `quant/dequant.py`: the obvious NumPy dequant, checked
   bit for bit against `gguf.quants` (tests/quant/test_quant_dequant.py); a quantizer in `quant/` if `create -q` writes it.
3. `simd_kernels/dequant.py`: `rows_<name>` (ROWS: embedding rows), bit-exact with the reference.
4. The fused kernel: row-dot intrinsics for 1-4 (and 8) tokens in the module of its family (`block32`, `kquants`,
   `iquants`), their LLVM IR built from `simd_kernels.ir`'s helpers (types, block loads, shuffles, the int8 lane dots),
   made into `mul_<name>` by `simd.fused_kernel`, the loop nest every format shares (which keeps a row's
   numbers independent of how many tokens share the call, and makes EXPERTS, GROUPED and MULTI beside it); then its
   module and name in `api._MUL_MODULES` and `api._NAMES`. A new module also goes in `_cache_guard.MODULES`.
5. Optionally a prompt kernel (`prefill.prefill_kernel`) in PREFILL, for 64+ token pieces.
6. Tests: its id in tests/_kernel_blocks.py's ALL (against llama.cpp's dot emulated exactly, and float64 bounds), which
   test_batch_engine's row invariance and test_kernels_cache's cache check pick up. A kernel that takes minutes to
   compile cold goes in SLOW_COMPILE there, as Q2_K and Q3_K do.
"""

from . import _cache_guard, rows, warm
from .api import (
    BLOCKS,
    EXPERTS,
    GROUPED,
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

__all__ = [
    "BLOCKS",
    "EXPERTS",
    "GROUPED",
    "MUL",
    "MULTI",
    "PREFILL",
    "ROWS",
    "KernelArgumentError",
    "get_rows",
    "matmul",
    "matvec",
]
