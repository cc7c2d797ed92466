"""GGUF v2/v3 reader: one read-only mmap per file, metadata parsed eagerly, tensor data as views."""

from __future__ import annotations

import errno
import mmap
import os
import stat
import struct
from pathlib import Path

import numpy as np

from ._cursor import Cursor
from ._metadata import read_metadata
from ._sniff import describe_non_gguf
from ._tensors import TensorInfo, build_tensors, read_tensor_count, read_tensor_infos
from .constants import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    MAX_ALIGNMENT,
    SUPPORTED_VERSIONS,
    InvalidGGUF,
)


class GGUFFile:
    """An opened GGUF model (one file, or every part of a split set); close() releases the maps."""

    def __init__(
        self,
        path: Path,
        version: int,
        alignment: int,
        data_offset: int,
        metadata: dict[str, object],
        metadata_types: dict[str, object],
        tensors: dict[str, TensorInfo],
        maps: list[mmap.mmap],
        parts: tuple[Path, ...],
    ) -> None:
        self.path = path
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset  # of the first part
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors
        self.parts = parts
        self._maps = maps

    def close(self) -> None:
        """Drops this object's views; a map stays alive while a caller still holds a tensor view."""
        self.tensors = {}
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:
                pass  # views exported to the caller pin it; it is unmapped when the last one goes
        self._maps = []

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"


def open_file(path: str | os.PathLike, *, lazy_strings: bool = False) -> GGUFFile:
    """Opens one GGUF file (no split handling). OSError for a path that cannot be opened.

    lazy_strings: metadata string arrays are `StringArray`s (offsets into the mapping, decoded when indexed,
    every item checked as an eager read checks it) instead of lists of str; they keep the file mapped."""
    path = Path(path)
    mm = _map(path)
    try:
        return _parse(path, mm, lazy_strings)
    except BaseException:
        _close_quietly(mm)
        raise


def _map(path: Path) -> mmap.mmap:
    # Checked before open() too: opening a FIFO would block until a writer appears.
    _check_regular(path, path.stat())
    with path.open("rb") as f:
        st = os.fstat(f.fileno())
        _check_regular(path, st)
        if st.st_size == 0:
            raise InvalidGGUF(f"{path}: empty file (0 bytes), not a GGUF model")
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _check_regular(path: Path, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if not stat.S_ISREG(st.st_mode):
        raise InvalidGGUF(f"{path}: not a regular file (a device, pipe or socket)")


def _close_quietly(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass


def _parse(path: Path, mm: mmap.mmap, lazy_strings: bool = False) -> GGUFFile:
    size = len(mm)
    try:
        cur = Cursor(mm, size, lazy_strings)
        version = _read_preamble(cur)
        n_tensors = read_tensor_count(cur)
        metadata, types = read_metadata(cur)
        infos = read_tensor_infos(cur, n_tensors)
        alignment = _alignment(metadata)
        data_start = -(-cur.pos // alignment) * alignment
        file_bytes = np.frombuffer(mm, dtype=np.uint8)  # (size,) read-only, the whole file
        tensors = build_tensors(infos, data_start, alignment, file_bytes)
    except InvalidGGUF as e:
        raise InvalidGGUF(f"{path}: {e}") from None
    except (struct.error, IndexError, OverflowError, ValueError, UnicodeError, RecursionError) as e:
        # Safety net so callers see one error type; the fuzz test asserts it never fires.
        raise InvalidGGUF(f"{path}: malformed GGUF (unexpected {type(e).__name__}: {e})") from e
    return GGUFFile(path, version, alignment, data_start, metadata, types, tensors, [mm], (path,))


def _read_preamble(cur: Cursor) -> int:
    if cur.buf[:4] != GGUF_MAGIC:
        raise InvalidGGUF(describe_non_gguf(cur.buf[:1024], cur.size))
    cur.take(4, "magic")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and version:
            raise InvalidGGUF("big-endian (byte-swapped) GGUF files are not supported")
        raise InvalidGGUF(f"unsupported GGUF version {version} (supported: 2 and 3)")
    return version


def _alignment(metadata: dict[str, object]) -> int:
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not (0 < alignment <= MAX_ALIGNMENT and alignment & (alignment - 1) == 0):
        raise InvalidGGUF(
            f"bad alignment: general.alignment is {alignment}, expected a power of two in 1..{MAX_ALIGNMENT}"
        )
    return alignment
