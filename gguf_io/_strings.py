"""A metadata string array kept as offsets into the mapped file, decoded one item at a time.

`tokenizer.ggml.tokens` holds 262k strings in Gemma 3's file: as Python `str` objects that is ~22 MB of private
memory before any tokenizer table. A `StringArray` holds two int64 offsets per item (the bytes stay in the
page cache, shared and evictable) and decodes an item when it is indexed. It was checked in full when the
file was opened: every length against the header bounds and every item as UTF-8, as an eager read checks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


class StringArray(Sequence):
    """Read-only sequence of str over `data` (uint8 (file_size,) view of the mapping; keeps it mapped)."""

    __slots__ = ("_data", "_starts", "_ends")

    def __init__(self, data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self._data = data  # (file_size,) uint8, read-only view of the mmap
        self._starts = starts  # (n,) int64 first byte of each item
        self._ends = ends  # (n,) int64 one past its last byte

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        s, e = int(self._starts[i]), int(self._ends[i])  # IndexError past either end, as a list's
        return self._data[s:e].tobytes().decode("utf-8")  # validated at open

    def raw(self, i: int) -> bytes:
        """Item i's UTF-8 bytes."""
        return self._data[int(self._starts[i]) : int(self._ends[i])].tobytes()

    def __iter__(self) -> Iterator[str]:
        data = self._data
        for s, e in zip(self._starts.tolist(), self._ends.tolist()):
            yield data[s:e].tobytes().decode("utf-8")

    def spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(data (file_size,) uint8 of the mapping, starts (n,) int64, ends (n,) int64): item i is data[starts[i]:ends[i]]."""
        return self._data, self._starts, self._ends

    def join(self, sep: str) -> str:
        """sep.join(self); for a one-byte (ASCII) sep in one NumPy gather and one decode."""
        if len(sep) != 1 or not sep.isascii():
            return sep.join(self)
        if not len(self):
            return ""
        joined, seps = _joined(self._data, self._starts, self._ends)
        joined[seps] = ord(sep)
        return joined[1:].tobytes().decode("utf-8")

    def lengths(self) -> np.ndarray:
        """(n,) int64 byte length of every item."""
        return self._ends - self._starts

    def tolist(self) -> list[str]:
        """All items as str, in one decode when no item holds a NUL."""
        if not len(self):
            return []
        items = self.join("\0").split("\0")
        return items if len(items) == len(self) else list(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # mutable-sequence semantics as a list's: unhashable

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"


def _joined(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All n >= 1 items, each after a NUL byte: (joined (sum(lengths) + n,) uint8 copy, seps (n,) NUL positions).

    The items lie back to back in the file, each after its 8-byte length: one mask keeps their bytes and each
    length's last byte (then zeroed), so the gather needs no per-byte index array."""
    assert np.array_equal(starts[1:] - 8, ends[:-1]), "items must be consecutive length-prefixed strings"
    lengths = ends - starts  # (n,)
    off = int(starts[0]) - 1
    span = data[off : int(ends[-1])]  # (span,) a view of the mapping
    keep = np.ones(len(span), bool)  # (span,) drop the first 7 bytes of every length after the first item
    for j in range(1, 8):
        keep[starts[1:] - off - j - 1] = False
    joined = span[keep]  # (sum(lengths) + n,) a copy
    seps = np.cumsum(lengths + 1) - (lengths + 1)  # (n,) where item i's separator landed
    joined[seps] = 0
    return joined, seps


def first_invalid_utf8(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
    """-1 if every item is valid UTF-8, else the index of the first one that is not.

    One decode of all items joined by NUL bytes, which is exact: a NUL can neither complete a truncated
    multi-byte sequence nor be a continuation byte, so the join is valid iff every item is."""
    if len(starts) == 0:
        return -1
    joined, seps = _joined(data, starts, ends)
    try:
        joined.tobytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return int(np.searchsorted(seps, e.start, "right")) - 1
    return -1
