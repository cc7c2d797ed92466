"""Helpers for tests that need tiny GGUF files (no fixtures here: import and call).

from gguf_fixtures import write_gguf, random_blocks   # pytest puts tests/ on sys.path
path = write_gguf(tmp_path / "m.gguf", {"general.architecture": "llama"},
                  [("w", GGMLType.Q8_0, (4, 64), random_blocks(GGMLType.Q8_0, (4, 64)))])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf_io
from gguf_io import BLOCK_SIZES, GGMLType, GGUFValueType


def row_bytes(ggml_type: int, n_cols: int) -> int:
    block, type_size = BLOCK_SIZES[ggml_type]
    return n_cols // block * type_size


def random_blocks(ggml_type: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Raw bytes for a tensor of `shape` (NumPy order): uint8 (n_rows, row_bytes), with finite f16/f32 scales.

    Float types get real float values; block formats get random bytes whose f16 fields hold finite
    numbers only because every other byte pair is masked below 0x7C00 (see _finite_halves).
    """
    rng = np.random.default_rng(seed)
    n_rows = int(np.prod(shape[:-1], dtype=np.int64))
    if ggml_type in (GGMLType.F32, GGMLType.F16, GGMLType.F64):
        dtype = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.F64: np.float64}[ggml_type]
        return rng.standard_normal((n_rows, shape[-1])).astype(dtype).view(np.uint8)
    raw = rng.integers(0, 256, (n_rows, row_bytes(ggml_type, shape[-1])), dtype=np.uint8)  # (n_rows, row_bytes)
    return _finite_halves(raw)


def _finite_halves(raw: np.ndarray) -> np.ndarray:
    # Clearing bit 6 of each odd byte keeps every little-endian u16 below 0x7C00 -> no f16 inf/NaN.
    raw[..., 1::2] &= 0xBF
    return raw


def write_gguf(
    path: Path,
    metadata: dict | None = None,
    tensors: list | None = None,
    *,
    metadata_types: dict | None = None,
    alignment: int | None = None,
) -> Path:
    """Writes a GGUF v3 file with gguf_io's writer; tensors are (name, ggml_type, shape, data)."""
    gguf_io.write(path, metadata or {}, tensors or [], metadata_types=metadata_types, alignment=alignment)
    return Path(path)


def sample_metadata() -> tuple[dict, dict]:
    """One value of every GGUF value type (scalars, arrays, nested arrays) plus the exact types."""
    t = GGUFValueType
    values = {
        "general.architecture": "llama",
        "u8": 255,
        "i8": -128,
        "u16": 65535,
        "i16": -32768,
        "u32": 2**32 - 1,
        "i32": -(2**31),
        "f32": 0.25,
        "bool": True,
        "str": "héllo\n\u2603",
        "u64": 2**64 - 1,
        "i64": -(2**63),
        "f64": 1e300,
        "arr.str": ["", "a", "\u00e9\u4e2d", "x" * 300],
        "arr.f32": np.array([0.5, -1.0, 3.0e38], dtype=np.float32),
        "arr.i32": np.array([1, -2, 2**31 - 1], dtype=np.int32),
        "arr.u8": np.array([0, 255], dtype=np.uint8),
        "arr.bool": np.array([True, False, True]),
        "arr.u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "arr.f64": np.array([1e-300], dtype=np.float64),
        "arr.empty": np.array([], dtype=np.int16),
    }
    types = {
        "general.architecture": t.STRING,
        "u8": t.UINT8,
        "i8": t.INT8,
        "u16": t.UINT16,
        "i16": t.INT16,
        "u32": t.UINT32,
        "i32": t.INT32,
        "f32": t.FLOAT32,
        "bool": t.BOOL,
        "str": t.STRING,
        "u64": t.UINT64,
        "i64": t.INT64,
        "f64": t.FLOAT64,
        "arr.str": (t.ARRAY, t.STRING),
        "arr.f32": (t.ARRAY, t.FLOAT32),
        "arr.i32": (t.ARRAY, t.INT32),
        "arr.u8": (t.ARRAY, t.UINT8),
        "arr.bool": (t.ARRAY, t.BOOL),
        "arr.u64": (t.ARRAY, t.UINT64),
        "arr.f64": (t.ARRAY, t.FLOAT64),
        "arr.empty": (t.ARRAY, t.INT16),
    }
    return values, types


def sample_tensors(seed: int = 0) -> list[tuple[str, int, tuple[int, ...], np.ndarray]]:
    """A few tensors of different types and ranks (1-D to 4-D), as (name, type, shape, raw bytes)."""
    specs = [
        ("token_embd.weight", GGMLType.Q8_0, (8, 64)),
        ("blk.0.attn_norm.weight", GGMLType.F32, (64,)),
        ("blk.0.ffn_down.weight", GGMLType.Q4_K, (3, 256)),
        ("blk.0.attn_q.weight", GGMLType.Q6_K, (2, 2, 256)),
        ("blk.0.f16", GGMLType.F16, (2, 1, 3, 5)),
        ("output.weight", GGMLType.Q4_1, (5, 32)),
    ]
    return [(name, ty, shape, random_blocks(ty, shape, seed + i)) for i, (name, ty, shape) in enumerate(specs)]
