"""Quantize a whole GGUF model file, as `llama-quantize` does (per-tensor recipe, no importance matrix).

`quantize_model(src, dst, "q4_K_M")` is a generator of progress events `(done, total, tensor_name)`; the
output appears at `dst` only after the last tensor, and a consumer that stops early leaves no file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

import gguf_io
import quant
from quant import recipe
from quant.formats import GGMLType, QuantError

GGML_QNT_VERSION = 2  # general.quantization_version llama.cpp writes
_FLOAT_SOURCES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
_CHUNK_ELEMENTS = 1 << 22  # rows converted per step: bounds float32 temporaries to ~16 MiB each

QUANTIZATIONS = tuple(ft.name for ft in recipe.FILE_TYPES.values())


def quantize_model(
    src: str | os.PathLike, dst: str | os.PathLike, quantization: str, *, allow_requantize: bool = False
) -> Iterator[tuple[int, int, str]]:
    """Writes `src` quantized to `quantization` (e.g. "q4_K_M", "q8_0") at `dst`, yielding progress.

    Sources: F32 / F16 / BF16 / Q8_0 weights; other quantized weights only with allow_requantize
    (each requantization loses quality). MXFP4 weights (gpt-oss's experts) are copied unchanged whatever the
    target, and MXFP4 itself is refused as a target by name (quant.recipe). Raises quant.QuantError or
    gguf_io.InvalidGGUF.
    """
    ft = recipe.get_file_type(quantization)
    with gguf_io.open(src) as f:
        targets = recipe.plan([(t.name, t.shape, t.ggml_type) for t in f.tensors.values()], f.metadata, ft.name)
        _check_sources(f.tensors, targets, allow_requantize)
        metadata, types = _output_metadata(f, ft)
        order = recipe.llama_order(f.tensors)
        with gguf_io.GGUFWriter(dst, metadata, metadata_types=types, alignment=f.alignment) as w:
            for name in order:
                w.add_tensor_info(name, targets[name], f.tensors[name].shape)
            for done, name in enumerate(order, 1):
                w.write_tensor(convert_tensor(f.tensors[name], targets[name]), name)
                yield done, len(order), name


def _check_sources(tensors: dict, targets: dict[str, int], allow_requantize: bool) -> None:
    for name, info in tensors.items():
        if targets[name] == info.ggml_type or info.ggml_type in _FLOAT_SOURCES:
            continue
        if info.ggml_type not in quant.FORMATS or quant.FORMATS[info.ggml_type].activations_only:
            raise QuantError(f"tensor {name!r} has type id {info.ggml_type}, which cannot be converted")
        if info.ggml_type != GGMLType.Q8_0 and not allow_requantize:
            raise QuantError(
                f"tensor {name!r} is already {quant.FORMATS[info.ggml_type].name}; requantizing it "
                "loses quality (start from an F16/BF16/F32/Q8_0 model or allow requantization)"
            )


def _output_metadata(f, ft: recipe.FileType) -> tuple[dict, dict]:
    """The source's metadata minus split.* keys, then quantization_version and file_type, last (as llama.cpp)."""
    own = ("general.quantization_version", "general.file_type")
    metadata = {k: v for k, v in f.metadata.items() if not k.startswith("split.") and k not in own}
    types = {k: v for k, v in f.metadata_types.items() if k in metadata}
    for key, value in (("general.quantization_version", GGML_QNT_VERSION), ("general.file_type", ft.value)):
        metadata[key] = value
        types[key] = gguf_io.GGUFValueType.UINT32
    return metadata, types


def convert_tensor(info, target: int) -> np.ndarray:
    """One tensor's raw blocks (rows, row_bytes) in `target`: copied when the type already matches."""
    if info.ggml_type == target:
        return info.data
    n_rows, n_cols = info.data.shape[0], info.shape[-1]
    out = np.empty((n_rows, quant.row_bytes(target, n_cols)), dtype=np.uint8)  # (rows, target row bytes)
    step = max(1, _CHUNK_ELEMENTS // n_cols)
    for a in range(0, n_rows, step):
        b = min(n_rows, a + step)
        rows = quant.dequantize(info.data[a:b], info.ggml_type, (b - a, n_cols))  # (b-a, cols) float32
        try:
            out[a:b] = quant.quantize(rows, target)
        except QuantError as e:
            raise QuantError(f"tensor {info.name!r}: {e}") from e
    return out
