"""Hostile variants of a good tiny GGUF: metadata keys set, removed or retyped, tensors poisoned or dropped.

`rewrite(src, dst, ...)` re-writes a file with gguf_io's writer, so any value (NaN, 0, negative, 2**40, a float
where an integer belongs) reaches the reader exactly as a hostile file would carry it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf_io
from gguf_io import GGUFValueType as VT

F32 = 0


def rewrite(
    src: Path,
    dst: Path,
    *,
    meta: dict | None = None,
    types: dict | None = None,
    drop_keys=(),
    nan_in=(),
    drop_tensors=(),
    values: dict | None = None,
    add_tensors: dict | None = None,
) -> Path:
    """dst = src with metadata `meta` set (`types` gives a value type, else it is inferred: a negative int is
    INT64, a float FLOAT32), `drop_keys` removed, the first element of each F32 tensor in `nan_in` made NaN,
    `values` (name -> float32 array of the same size) written over F32 tensors, `drop_tensors` left out and
    `add_tensors` (name -> float32 array) added."""
    meta, types, values = meta or {}, types or {}, values or {}
    with gguf_io.open(src) as f:
        md = {k: v for k, v in f.metadata.items() if k not in drop_keys}
        spec = {k: t for k, t in f.metadata_types.items() if k in md and k not in meta}
        md.update(meta)
        spec.update(types)
        tensors = []
        for name, t in f.tensors.items():
            if name in drop_tensors:
                continue
            data = np.array(t.data)  # (n_rows, row_bytes) uint8 copy: the source mapping closes below
            if name in nan_in or name in values:
                assert t.ggml_type == F32, name
                flat = data.reshape(-1).view(np.float32)
                if name in values:
                    flat[:] = np.asarray(values[name], np.float32).reshape(-1)
                if name in nan_in:
                    flat[0] = np.nan
            tensors.append((name, t.ggml_type, t.shape, data))
    for name, arr in (add_tensors or {}).items():
        arr = np.asarray(arr, np.float32)
        tensors.append((name, F32, arr.shape, arr))
    gguf_io.write(dst, md, tensors, metadata_types=spec)
    return Path(dst)


__all__ = ["VT", "rewrite"]
