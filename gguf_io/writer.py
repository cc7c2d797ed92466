"""GGUF v3 writer: metadata and tensor infos first, then tensor data streamed one tensor at a time."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ._encode import encode_kv, infer_spec
from .constants import (
    BLOCK_SIZES,
    DEFAULT_ALIGNMENT,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGUF_MAGIC,
    MAX_ALIGNMENT,
    GGMLType,
    GGUFValueType,
    type_name,
)

_NATIVE_DTYPES = {
    GGMLType.F32: np.dtype("<f4"),
    GGMLType.F16: np.dtype("<f2"),
    GGMLType.F64: np.dtype("<f8"),
    GGMLType.I8: np.dtype("<i1"),
    GGMLType.I16: np.dtype("<i2"),
    GGMLType.I32: np.dtype("<i4"),
    GGMLType.I64: np.dtype("<i8"),
    GGMLType.BF16: np.dtype("<u2"),
}
_FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.F64)


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


class GGUFWriter:
    """Streaming writer. Declare every tensor with add_tensor_info, then write_tensor in the same order.

    Writes to `<path>.<pid>.partial` and renames on a clean close(), so a crash never leaves a half file at `path`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        metadata: dict | None = None,
        *,
        metadata_types: dict | None = None,
        alignment: int | None = None,
    ) -> None:
        self.path = Path(path)
        self._metadata: dict[str, tuple[object, object]] = {}
        self._infos: list[tuple[str, int, tuple[int, ...], int]] = []  # name, type, shape, nbytes
        self._written = 0
        self._file = None
        types = metadata_types or {}
        for key, value in (metadata or {}).items():
            self.add_metadata(key, value, types.get(key))
        self.alignment = self._resolve_alignment(alignment)

    def add_metadata(self, key: str, value: object, spec: object = None) -> None:
        if self._file is not None:
            raise ValueError("metadata must be added before write_header()")
        if key in self._metadata:
            raise ValueError(f"duplicate metadata key {key!r}")
        self._metadata[key] = (value, spec if spec is not None else infer_spec(value, key))

    def add_tensor_info(self, name: str, ggml_type: int, shape: Iterable[int]) -> None:
        """Declares a tensor; `shape` is in NumPy order (rows last-but-one)."""
        if self._file is not None:
            raise ValueError("tensor infos must be added before write_header()")
        shape = tuple(int(d) for d in shape)
        _check_tensor_decl(name, ggml_type, shape, {i[0] for i in self._infos})
        block, type_size = BLOCK_SIZES[ggml_type]
        nbytes = int(np.prod(shape[:-1], dtype=object)) * (shape[-1] // block) * type_size
        self._infos.append((name, int(ggml_type), shape, nbytes))

    def write_header(self) -> None:
        if self._file is not None:
            raise ValueError("write_header() was already called")
        self._resolve_alignment(self.alignment)
        header = self._header_bytes()
        self._tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
        self._file = self._tmp.open("wb")
        self._file.write(header)
        self._file.write(bytes(_pad(len(header), self.alignment) - len(header)))

    def write_tensor(self, data: object, name: str | None = None) -> None:
        """Writes the next declared tensor's data (raw uint8 blocks, or a native-dtype array)."""
        if self._file is None:
            self.write_header()
        if self._written >= len(self._infos):
            raise ValueError("more tensors written than declared")
        tname, ggml_type, shape, nbytes = self._infos[self._written]
        if name is not None and name != tname:
            raise ValueError(f"tensor {name!r} written where {tname!r} was declared")
        raw = _tensor_bytes(tname, ggml_type, shape, nbytes, data)
        self._file.write(raw)
        self._file.write(bytes(_pad(nbytes, self.alignment) - nbytes))
        self._written += 1

    def close(self) -> None:
        if self._file is None:
            self.write_header()
        if self._file.closed:
            return
        if self._written != len(self._infos):
            self.abort()
            raise ValueError(f"{len(self._infos) - self._written} declared tensors were never written")
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Discards the partial output."""
        if self._file is not None:
            self._file.close()
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> GGUFWriter:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _resolve_alignment(self, alignment: int | None) -> int:
        meta = self._metadata.get("general.alignment")
        if meta and meta[1] != GGUFValueType.UINT32:
            raise ValueError("general.alignment must be written as UINT32")
        if alignment is None:
            alignment = int(meta[0]) if meta else DEFAULT_ALIGNMENT
        elif meta and int(meta[0]) != alignment:
            raise ValueError(f"alignment {alignment} disagrees with general.alignment {meta[0]}")
        if not (0 < alignment <= MAX_ALIGNMENT and alignment & (alignment - 1) == 0):
            raise ValueError(f"alignment {alignment} is not a power of two in 1..{MAX_ALIGNMENT}")
        if alignment != DEFAULT_ALIGNMENT and not meta:
            self._metadata["general.alignment"] = (alignment, GGUFValueType.UINT32)
        return alignment

    def _header_bytes(self) -> bytes:
        parts = [GGUF_MAGIC, struct.pack("<IQQ", 3, len(self._infos), len(self._metadata))]
        parts += [encode_kv(key, value, spec) for key, (value, spec) in self._metadata.items()]
        offset = 0
        for name, ggml_type, shape, nbytes in self._infos:
            raw = name.encode("utf-8")
            ne = shape[::-1]  # ggml order, innermost first
            parts.append(struct.pack(f"<Q{len(raw)}sI{len(ne)}QIQ", len(raw), raw, len(ne), *ne, ggml_type, offset))
            offset += _pad(nbytes, self.alignment)
        return b"".join(parts)


def _check_tensor_decl(name: str, ggml_type: int, shape: tuple[int, ...], seen: set[str]) -> None:
    if name in seen:
        raise ValueError(f"duplicate tensor name {name!r}")
    if len(name.encode("utf-8")) >= GGML_MAX_NAME:
        raise ValueError(f"tensor name {name!r} is longer than {GGML_MAX_NAME - 1} bytes")
    if ggml_type not in BLOCK_SIZES:
        raise ValueError(f"tensor {name!r}: unknown ggml type {ggml_type}")
    if not 1 <= len(shape) <= GGML_MAX_DIMS or min(shape) < 1:
        raise ValueError(f"tensor {name!r}: shape {shape} needs 1..{GGML_MAX_DIMS} dims, each >= 1")
    block = BLOCK_SIZES[ggml_type][0]
    if shape[-1] % block:
        raise ValueError(
            f"tensor {name!r}: row length {shape[-1]} is not a multiple of the "
            f"{type_name(ggml_type)} block size {block}"
        )


def _tensor_bytes(name: str, ggml_type: int, shape: tuple[int, ...], nbytes: int, data: object) -> memoryview:
    arr = np.asarray(data) if not isinstance(data, (bytes, bytearray, memoryview)) else np.frombuffer(data, np.uint8)
    if arr.dtype != np.uint8:
        arr = _native_array(name, ggml_type, shape, arr)
    if arr.nbytes != nbytes:
        raise ValueError(f"tensor {name!r}: {arr.nbytes} bytes of data, {type_name(ggml_type)} {shape} needs {nbytes}")
    return memoryview(np.ascontiguousarray(arr).reshape(-1))


def _native_array(name: str, ggml_type: int, shape: tuple[int, ...], arr: np.ndarray) -> np.ndarray:
    want = _NATIVE_DTYPES.get(ggml_type)
    ok = want is not None and (arr.dtype == want or (ggml_type in _FLOAT_TYPES and arr.dtype.kind == "f"))
    if not ok:
        raise ValueError(
            f"tensor {name!r}: {arr.dtype} data cannot be written as {type_name(ggml_type)}; pass raw uint8 blocks"
        )
    if arr.size != int(np.prod(shape, dtype=object)):
        raise ValueError(f"tensor {name!r}: {arr.size} elements for shape {shape}")
    return arr.astype(want, copy=False).view(np.uint8)


def write(
    path: str | os.PathLike,
    metadata: dict,
    tensors: Iterable[tuple],
    *,
    metadata_types: dict | None = None,
    alignment: int | None = None,
) -> None:
    """Writes a whole GGUF v3 file; `tensors` yields (name, ggml_type, shape_numpy_order, data)."""
    tensors = list(tensors)
    with GGUFWriter(path, metadata, metadata_types=metadata_types, alignment=alignment) as w:
        for name, ggml_type, shape, _ in tensors:
            w.add_tensor_info(name, ggml_type, shape)
        for name, _, _, data in tensors:
            w.write_tensor(data, name)
