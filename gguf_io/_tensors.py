"""Tensor infos: parsing, validation of shapes, types and the data layout, and zero-copy views."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ._cursor import Cursor
from .constants import (
    BLOCK_SIZES,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    INT64_MAX,
    MAX_TENSORS,
    InvalidGGUF,
    type_name,
)

# name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8)
_MIN_INFO_BYTES = 32


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor: GGUF name, ggml type id, NumPy-order shape and its raw blocks in the mapping."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]  # NumPy order: ggml ne reversed, rows last-but-one
    data: np.ndarray  # uint8 (n_rows, row_bytes), read-only view into the file mapping
    offset: int  # absolute file offset of the first byte
    nbytes: int

    @property
    def n_elements(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True, slots=True)
class _RawInfo:
    name: str
    ggml_type: int
    ne: tuple[int, ...]  # ggml order, ne[0] innermost
    rel_offset: int  # relative to the data section
    info_at: int  # file offset of this tensor info, for messages


def read_tensor_infos(cur: Cursor, n_tensors: int) -> list[_RawInfo]:
    names: set[str] = set()
    infos = []
    for i in range(n_tensors):
        info = _read_info(cur, i)
        if info.name in names:
            raise InvalidGGUF(f"duplicate tensor name {info.name!r} (tensor info at offset {info.info_at})")
        names.add(info.name)
        infos.append(info)
    return infos


def read_tensor_count(cur: Cursor) -> int:
    return cur.count("tensor count", MAX_TENSORS, _MIN_INFO_BYTES)


def _read_info(cur: Cursor, i: int) -> _RawInfo:
    at = cur.pos
    name = cur.string(f"name of tensor #{i}")
    if len(name.encode("utf-8")) >= GGML_MAX_NAME:
        raise InvalidGGUF(f"tensor name {name[:80]!r} at offset {at} is longer than {GGML_MAX_NAME - 1} bytes")
    n_dims = cur.u32(f"n_dims of tensor {name!r}")
    if not 1 <= n_dims <= GGML_MAX_DIMS:
        raise InvalidGGUF(f"tensor {name!r} (info at offset {at}) has n_dims {n_dims}, expected 1..{GGML_MAX_DIMS}")
    ne = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
    ggml_type = cur.u32(f"type of tensor {name!r}")
    rel_offset = cur.u64(f"data offset of tensor {name!r}")
    return _RawInfo(name, ggml_type, ne, rel_offset, at)


# Type ids ggml retired that files still carry, reused by others: said in the error so the user knows what it is.
_KNOWN_FOREIGN = {
    4: " (ggml's retired Q4_2; Ollama's own gpt-oss files use it for their private MXFP4 layout: "
    "use a gpt-oss GGUF converted by llama.cpp, whose MXFP4 is type 39)"
}


def row_layout(info: _RawInfo) -> tuple[int, int]:
    """(n_rows, row_bytes) of a tensor after checking its type and dimensions."""
    where = f"tensor {info.name!r} (info at offset {info.info_at})"
    if info.ggml_type not in BLOCK_SIZES:
        raise InvalidGGUF(
            f"{where}: unsupported tensor type id {info.ggml_type}{_KNOWN_FOREIGN.get(info.ggml_type, '')}"
        )
    if any(d == 0 or d > INT64_MAX for d in info.ne):
        raise InvalidGGUF(f"{where}: dimensions {list(info.ne)} must each be in 1..2^63-1")
    if prod(info.ne) > INT64_MAX:
        raise InvalidGGUF(f"{where}: element count of dimensions {list(info.ne)} overflows int64")
    block, type_size = BLOCK_SIZES[info.ggml_type]
    if info.ne[0] % block:
        raise InvalidGGUF(
            f"{where}: row length {info.ne[0]} is not a multiple of the {type_name(info.ggml_type)} block size {block}"
        )
    return prod(info.ne[1:]), info.ne[0] // block * type_size


def build_tensors(
    infos: list[_RawInfo], data_start: int, alignment: int, file_bytes: np.ndarray
) -> dict[str, TensorInfo]:
    """Checks every tensor's bytes lie aligned, inside the file and apart, then makes the views."""
    size = file_bytes.shape[0]
    layouts = [row_layout(info) for info in infos]
    spans = [_span(info, rows * row_bytes, data_start, alignment) for info, (rows, row_bytes) in zip(infos, layouts)]
    _check_inside(infos, spans, data_start, alignment, size)
    _check_apart(infos, spans)
    tensors = {}
    for info, (rows, row_bytes), (start, end) in zip(infos, layouts, spans):
        view = file_bytes[start:end].reshape(rows, row_bytes)  # (n_rows, row_bytes)
        tensors[info.name] = TensorInfo(info.name, info.ggml_type, info.ne[::-1], view, start, end - start)
    return tensors


def _span(info: _RawInfo, nbytes: int, data_start: int, alignment: int) -> tuple[int, int]:
    if info.rel_offset % alignment:
        raise InvalidGGUF(
            f"tensor {info.name!r}: data offset {info.rel_offset} is not a multiple of the alignment {alignment}"
        )
    start = data_start + info.rel_offset
    return start, start + nbytes


def _check_inside(
    infos: list[_RawInfo], spans: list[tuple[int, int]], data_start: int, alignment: int, size: int
) -> None:
    bad = [i for i, (_, end) in enumerate(spans) if end > size]
    if not bad:
        return
    needed = max(end for _, end in spans)
    if _is_packed(infos, spans, data_start, alignment):
        raise InvalidGGUF(f"truncated file: header says {needed} bytes needed, file has {size}")
    info, (start, end) = infos[bad[0]], spans[bad[0]]
    raise InvalidGGUF(
        f"out-of-bounds tensor {info.name!r}: data [{start}, {end}) lies outside the file of {size} bytes"
    )


def _is_packed(infos: list[_RawInfo], spans: list[tuple[int, int]], data_start: int, alignment: int) -> bool:
    """Whether tensors sit back to back in info order, as every writer lays them out."""
    expected = data_start
    for start, end in spans:
        if start != expected:
            return False
        expected = -(-end // alignment) * alignment
    return True


def _check_apart(infos: list[_RawInfo], spans: list[tuple[int, int]]) -> None:
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    for a, b in zip(order, order[1:]):
        if spans[b][0] < spans[a][1]:
            raise InvalidGGUF(
                f"tensors {infos[a].name!r} [{spans[a][0]}, {spans[a][1]}) and "
                f"{infos[b].name!r} [{spans[b][0]}, {spans[b][1]}) overlap"
            )
