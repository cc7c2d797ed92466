"""`quantize(array, ggml_type)`: float data -> raw GGML blocks (rows, row_bytes), ggml's reference quantizers."""

from __future__ import annotations

from math import prod

import numpy as np

from quant import activations, iquants, kquants, legacy, mxfp4
from quant._numeric import F32, require_finite
from quant.formats import GGMLType, QuantError, get_format, row_bytes


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN (ggml_compute_fp32_to_bf16)."""
    u = x.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return np.where(nan, (u >> 16) | 64, rounded).astype(np.uint16)


_FLOAT_TYPES = {
    GGMLType.F32: lambda x: x,
    GGMLType.F16: lambda x: x.astype(np.float16),
    GGMLType.BF16: _bf16,
}

_BLOCK_QUANTIZERS = {
    GGMLType.Q4_0: legacy.quantize_q4_0,
    GGMLType.Q4_1: legacy.quantize_q4_1,
    GGMLType.Q5_0: legacy.quantize_q5_0,
    GGMLType.Q5_1: legacy.quantize_q5_1,
    GGMLType.Q8_0: legacy.quantize_q8_0,
    GGMLType.Q8_1: legacy.quantize_q8_1,
    GGMLType.Q8_K: activations.quantize_q8_k,
    **kquants.K_QUANTIZERS,
    **iquants.I_QUANTIZERS,
    GGMLType.MXFP4: mxfp4.quantize_mxfp4,
}


def _as_rows(array: np.ndarray) -> np.ndarray:
    """Any float array -> contiguous float32 (rows, cols), rows = product of the leading dims."""
    x = np.asarray(array)
    if x.dtype.kind != "f":
        raise QuantError(f"quantize needs floating-point data, got {x.dtype}")
    if x.ndim == 0 or x.size == 0:
        raise QuantError(f"quantize needs a non-empty array with at least one dimension, got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=F32).reshape(prod(x.shape[:-1]), x.shape[-1])


def _quantize_blocks(fn, x: np.ndarray, fmt) -> np.ndarray:
    """Run a block quantizer on rows x (rows, cols) -> (rows, row_bytes); refuse scales f16 cannot hold."""
    with np.errstate(over="ignore"):  # checked below, with a clear error instead of a warning
        blocks = fn(x.reshape(-1, fmt.block_size))  # (n_blocks,) structured
    for name, dt, _ in fmt.fields:
        if dt == "<f2" and not np.all(np.isfinite(blocks[name])):
            i = int(np.flatnonzero(~np.isfinite(blocks[name]))[0])
            raise QuantError(
                f"cannot quantize to {fmt.name}: block {i} (elements {i * fmt.block_size}.."
                f"{(i + 1) * fmt.block_size - 1}) needs a {name} beyond the f16 range"
            )
    return blocks.view(np.uint8).reshape(x.shape[0], -1)


def quantize(array: np.ndarray, ggml_type: int) -> np.ndarray:
    """float array (..., cols) -> uint8 raw blocks (rows, row_bytes) of `ggml_type`, rows = prod(leading dims).

    Block types use ggml's reference quantizers (`quantize_row_*_ref`, no importance matrix): byte-exact
    with ggml for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q8_1/Q8_K, and the same algorithm for the K-quants. IQ4_NL and
    IQ4_XS follow `quantize_iq4_nl` / `quantize_iq4_xs` (the scale search llama-quantize runs); MXFP4 is
    byte-exact with `quantize_row_mxfp4_ref`.
    """
    fmt = get_format(ggml_type)
    x = _as_rows(array)
    n_rows, n_cols = x.shape
    row_bytes(fmt.ggml_type, n_cols)  # raises for a row that is not whole blocks
    if fmt.ggml_type in _FLOAT_TYPES:
        return _FLOAT_TYPES[fmt.ggml_type](x).view(np.uint8).reshape(n_rows, -1)
    require_finite(x, fmt.name)
    return _quantize_blocks(_BLOCK_QUANTIZERS[fmt.ggml_type], x, fmt)


def quantize_activations(array: np.ndarray, ggml_type: int) -> np.ndarray:
    """Activations -> Q8_0 / Q8_1 / Q8_K blocks (rows, row_bytes) exactly as llama.cpp's x86 CPU backend.

    Differs from `quantize` for Q8_0 / Q8_1 (AVX path: id = 127/amax and round half to even).
    """
    fmt = get_format(ggml_type)
    fn = activations.ACTIVATION_QUANTIZERS.get(fmt.ggml_type)
    if fn is None:
        raise QuantError(f"{fmt.name} is not an activation type (use Q8_0, Q8_1 or Q8_K)")
    x = _as_rows(array)
    row_bytes(fmt.ggml_type, x.shape[1])
    require_finite(x, fmt.name)
    return _quantize_blocks(fn, x, fmt)
