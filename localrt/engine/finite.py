"""The scan of a GGUF file's weights for NaN and infinity, at create (issue 48).

A NaN or infinite value in a weight reaches the logits (sampled as garbage, or refused at run time) on every
request, so `create` refuses the file instead: every F32 / F16 / BF16 tensor's values and every quantized block's
float scales (the f16 `d`, and `m` / `dmin` where the format has them; the integer quants and sub-block scales
cannot be non-finite; MXFP4's E8M0 exponent byte e is a power of two that only overflows, with e >= 253 and a large
code) are read in place, through NumPy views of the blocks' own layout (quant.formats), a few
MB at a time. A zero scale is legal (an all-zero block). Each error is an InvalidModel (a 400) naming the tensor,
the value and where it is.

Loading does not scan: a file in the store was scanned when it was created, and the loader's own check
(localrt.engine.validate) still reads the small float tensors, which is all it can afford.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from quant.dequant import e8m0_half
from quant.formats import FORMATS, KVALUES_MXFP4, GGMLType

from ..errors import InvalidModel

F32, F16, BF16 = 0, 1, 30
CHUNK_BYTES = 8 << 20  # rows read per step: bounds the temporaries (the file itself is only mapped)

# Per float encoding: (unsigned view, mask of the bits below the sign, the smallest masked value that is inf/NaN).
_F32_BITS = (np.uint32, 0x7FFFFFFF, 0x7F800000)
_F16_BITS = (np.uint16, 0x7FFF, 0x7C00)
_BF16_BITS = (np.uint16, 0x7FFF, 0x7F80)
_FLOATS = {F32: _F32_BITS, F16: _F16_BITS, BF16: _BF16_BITS}
# MXFP4's element values are KVALUES_MXFP4[q] * 2^(e - 128): every code is finite up to e = 252 (12 * 2^124)
_E8M0_ALWAYS_FINITE = 252
_MXFP4_ABS = np.abs(np.array(KVALUES_MXFP4, dtype=np.float32))  # (16,) |doubled value| per code


def check_finite(tensors: Mapping) -> None:
    """Every tensor (GGUF name -> .ggml_type and .data, raw uint8 rows (n_rows, row_bytes)) holds finite floats;
    tensors of a type quant does not describe are skipped (validate refuses those the forward reads)."""
    for name, t in tensors.items():
        data = getattr(t, "data", None)
        if isinstance(data, np.ndarray) and data.size:
            rows = data.reshape(len(data), -1) if data.ndim > 1 else data.reshape(1, -1)  # (n_rows, row_bytes)
            _check_tensor(name, int(t.ggml_type), rows, tuple(t.shape))


def _check_tensor(name: str, ggml_type: int, rows: np.ndarray, shape: tuple) -> None:
    """rows: (n_rows, row_bytes) uint8, every row of a tensor of `shape` (NumPy order)."""
    fmt = FORMATS.get(ggml_type)
    if fmt is None:
        return
    step = max(1, CHUNK_BYTES // max(1, rows.shape[1]))  # rows a chunk
    for r0 in range(0, len(rows), step):
        chunk = rows[r0 : r0 + step]  # (step, row_bytes), a view
        if ggml_type in _FLOATS:
            _check_values(name, fmt.name, chunk, r0, shape, _FLOATS[ggml_type])
        else:
            blocks = np.ascontiguousarray(chunk).reshape(-1).view(fmt.dtype)  # (n_blocks,); a view when contiguous
            if ggml_type == GGMLType.MXFP4:
                _check_e8m0(name, blocks, chunk.shape[1] // fmt.type_size, r0, shape)
            for field, dtype, _ in fmt.fields:
                if dtype == "<f2":
                    _check_scales(name, fmt.name, field, blocks[field], chunk.shape[1] // fmt.type_size, r0, shape)


def _check_values(name: str, type_name: str, chunk: np.ndarray, r0: int, shape: tuple, bits: tuple) -> None:
    """The elements of an F32 / F16 / BF16 chunk (step, row_bytes) uint8 of rows r0.. are finite."""
    uint, mask, top = bits
    values = np.ascontiguousarray(chunk).reshape(-1).view(uint)  # (step * row elements,)
    if np.bitwise_and(values, uint(mask)).max() < top:  # exponent all ones: inf or NaN
        return
    i = _first_bad(values, uint(mask), top)
    per_row = chunk.shape[1] // np.dtype(uint).itemsize
    raise InvalidModel(
        f"tensor {name!r} holds NaN or infinite values ({type_name}: {_decode(values[i], type_name)} "
        f"at {_row(shape, r0 + i // per_row)}, column {i % per_row})"
    )


def _check_scales(
    name: str, type_name: str, field: str, scales: np.ndarray, per_row: int, r0: int, shape: tuple
) -> None:
    """The f16 `field` of every block of a chunk (scales: (n_blocks,) strided f16, per_row blocks a row) is finite."""
    bits = scales.view(np.uint16)  # same itemsize: a strided view, no copy
    if np.bitwise_and(bits, np.uint16(0x7FFF)).max() < 0x7C00:
        return
    i = _first_bad(bits, np.uint16(0x7FFF), 0x7C00)
    raise InvalidModel(
        f"tensor {name!r} ({type_name}) has a block scale {field} = {float(scales[i])} in block "
        f"{i % per_row} of {_row(shape, r0 + i // per_row)}: a NaN or infinite scale makes every output "
        f"it touches NaN (a zero scale, an all-zero block, is fine)"
    )


def _check_e8m0(name: str, blocks: np.ndarray, per_row: int, r0: int, shape: tuple) -> None:
    """No MXFP4 block of a chunk (blocks: (n_blocks,) structured, per_row blocks a row) has an element beyond
    float32: ggml reads e = 255 as 2^127 (no NaN), so only e >= 253 with a large enough code can overflow."""
    e = blocks["e"]
    if e.max() <= _E8M0_ALWAYS_FINITE:
        return
    idx = np.flatnonzero(e > _E8M0_ALWAYS_FINITE)  # (m,) the blocks that might overflow
    qs = blocks["qs"][idx]  # (m, 16)
    largest = np.maximum(_MXFP4_ABS[qs & 15], _MXFP4_ABS[qs >> 4]).max(axis=1)  # (m,) largest |doubled value|
    with np.errstate(over="ignore"):
        top = largest * e8m0_half(e[idx])  # (m,) the largest |element|
    bad = np.flatnonzero(~np.isfinite(top))
    if len(bad):
        i, exp = int(idx[bad[0]]), int(e[idx[bad[0]]])
        raise InvalidModel(
            f"tensor {name!r} (MXFP4) has a block exponent e = {exp} in block {i % per_row} of "
            f"{_row(shape, r0 + i // per_row)}: its element {largest[bad[0]] / 2:g} x 2^{exp - 127} "
            f"overflows float32 to infinity"
        )


def _row(shape: tuple, row: int) -> str:
    """Where raw row `row` is: a stacked expert tensor (n_expert, rows, cols) names the expert."""
    if len(shape) == 3 and shape[1] > 0:
        return f"expert {row // shape[1]}, row {row % shape[1]}"
    return f"row {row}"


def _first_bad(values: np.ndarray, mask, top: int) -> int:
    return int(np.argmax(np.bitwise_and(values, mask) >= top))


def _decode(raw, type_name: str) -> str:
    """A NaN / inf element's value for the message, from its bits."""
    if type_name == "F32":
        return str(np.asarray(raw).view(np.float32))
    if type_name == "F16":
        return str(np.asarray(raw).view(np.float16))
    return str((np.asarray(raw, np.uint32) << 16).view(np.float32))  # BF16: the upper half of an f32
