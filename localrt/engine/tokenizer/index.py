"""text -> token id over a vocabulary that stays in the mapped file (a `gguf_io.StringArray`).

A dict of 262k str keys (Gemma 3) costs ~37 MB of private memory: the strings and the dict with its int values.
`TokenIndex` is an open-addressing hash table of int32 ids (2 x the vocabulary, rounded up to a power of two)
keyed by the CRC-32 of each token's UTF-8 bytes, computed for the whole vocabulary in one NumPy pass per byte
position; a lookup hashes the query with zlib.crc32 and compares bytes in the mapping. Same answers as the dict.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Sequence

import numpy as np

from ...errors import ModelLoadError


def _crc_table() -> np.ndarray:
    """The 256-entry table of the reflected CRC-32 (polynomial 0xEDB88320) that zlib.crc32 computes."""
    c = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        c = np.where(c & 1, np.uint32(0xEDB88320) ^ (c >> np.uint32(1)), c >> np.uint32(1))
    return c.astype(np.uint32)


_CRC = _crc_table()


def crc32_items(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """(n,) uint32 zlib.crc32 of every item data[starts[i]:ends[i]], one vectorized step per byte position."""
    lengths = ends - starts  # (n,)
    order = np.argsort(-lengths)  # longest first: the items still going are always a prefix
    pos = starts[order]  # (n,) next byte of each item, in that order
    left = lengths[order]  # (n,) bytes still to hash
    crc = np.full(len(order), 0xFFFFFFFF, np.uint32)  # (n,)
    live = int(np.count_nonzero(left > 0))
    step = 0
    while live:
        b = data[pos[:live] + step]  # (live,) uint8
        c = crc[:live]
        crc[:live] = _CRC[(c ^ b) & np.uint32(0xFF)] ^ (c >> np.uint32(8))
        step += 1
        live = int(np.searchsorted(-left, -step, "left"))  # items longer than step
    out = np.empty_like(crc)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    return out


class TokenIndex:
    """Read-only mapping token text -> id for a StringArray vocabulary; `renamed` overrides some ids' texts
    (llama.cpp's "[EMPTY_i]" for empty entries). Duplicate texts raise ModelLoadError, as the dict build does."""

    def __init__(self, tokens, renamed: dict[int, str]) -> None:
        data, starts, ends = tokens.spans()
        n = len(starts)
        self._n = n
        self._tokens = tokens
        self._renamed = {text: tid for tid, text in renamed.items()}  # few entries: a plain dict
        hashes = crc32_items(data, starts, ends)  # (n,) uint32
        size = 1 << max(4, int(2 * max(n, 1) - 1).bit_length())  # >= 2n slots: short probe runs
        self._mask = size - 1
        skip = np.zeros(n, bool)  # (n,) ids whose own text is not a key (renamed)
        skip[list(renamed)] = True
        keyed = np.flatnonzero(~skip)  # (m,) ids whose file text is their key
        slots = _place(hashes, self._mask, keyed)  # (size,) int32 id or -1
        self._slots = array("i", slots.tobytes())  # Python-int reads at C speed, 4 bytes per slot
        self._starts = array("q", starts.astype(np.int64).tobytes())
        self._ends = array("q", ends.astype(np.int64).tobytes())
        self._buf = memoryview(data)  # (file_size,) uint8 of the mapping
        pairs = self._duplicates(hashes, keyed)
        for text, tid in self._renamed.items():
            other = self._lookup(text.encode("utf-8"))
            if other is not None:
                pairs.append((min(other, tid), max(other, tid)))
        if pairs:  # the pair a scan in id order meets first, as the dict build reports it
            first, later = min(pairs, key=lambda p: p[1])
            text = self._tokens[first] if first not in renamed else renamed[first]
            raise ModelLoadError(f"duplicate token in vocabulary: {text!r} has ids {first} and {later}")

    def _duplicates(self, hashes: np.ndarray, ids: np.ndarray) -> list[tuple[int, int]]:
        """(first id, later id) of every id whose bytes an earlier id has: only equal hashes need a byte compare."""
        order = ids[np.argsort(hashes[ids])]
        hs = hashes[order]
        groups: dict[int, set[int]] = {}
        for j in np.flatnonzero(hs[1:] == hs[:-1]).tolist():
            groups.setdefault(int(hs[j]), set()).update((int(order[j]), int(order[j + 1])))
        pairs = []
        for members in groups.values():
            seen: dict[bytes, int] = {}
            for tid in sorted(members):
                raw = self._tokens.raw(tid)
                if raw in seen:
                    pairs.append((seen[raw], tid))
                else:
                    seen[raw] = tid
        return pairs

    def _lookup(self, raw: bytes) -> int | None:
        slots, starts, ends, buf, mask = self._slots, self._starts, self._ends, self._buf, self._mask
        i = zlib.crc32(raw) & mask
        n = len(raw)
        while True:
            tid = slots[i]
            if tid < 0:
                return None
            s = starts[tid]
            if ends[tid] - s == n and buf[s : s + n] == raw:
                return tid
            i = (i + 1) & mask

    def get(self, text: str, default=None):
        tid = self._renamed.get(text)
        if tid is not None:
            return tid
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no token text (valid UTF-8) can equal it
            return default
        tid = self._lookup(raw)
        return default if tid is None else tid

    def __getitem__(self, text: str) -> int:
        tid = self.get(text)
        if tid is None:
            raise KeyError(text)
        return tid

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.get(text) is not None

    def __len__(self) -> int:
        return self._n


def _place(hashes: np.ndarray, mask: int, ids: np.ndarray) -> np.ndarray:
    """Linear-probing table (mask + 1,) int32 of ids (-1 empty), each at the first free slot from hash & mask.

    In order of home slot h_0 <= h_1 <= ..., linear probing puts item k at p_k = max(h_k, p_(k-1) + 1), so
    p_k - k is a running maximum of h_k - k: one sort and one accumulate. The few that run past the last slot
    wrap around into the first free slots from 0, where a probe that walks off the end continues."""
    size = mask + 1
    slots = np.full(size, -1, np.int32)  # (size,)
    home = (hashes[ids] & np.uint32(mask)).astype(np.int64)  # (m,)
    order = np.argsort(home)  # ties in any order: each lands in the run after its home
    k = np.arange(len(order), dtype=np.int64)
    at = np.maximum.accumulate(home[order] - k) + k if len(order) else k  # (m,) slot of the k-th by home
    fits = at < size
    slots[at[fits]] = ids[order[fits]]
    free = iter(np.flatnonzero(slots < 0).tolist())  # ascending: what a wrapped probe meets first
    for tid in ids[order[~fits]].tolist():
        slots[next(free)] = tid
    return slots


class RenamedTexts(Sequence):
    """A StringArray's texts with some ids' replaced (llama.cpp's "[EMPTY_i]" for empty entries)."""

    def __init__(self, tokens, renamed: dict[int, str]) -> None:
        self._tokens = tokens
        self._renamed = renamed

    def __len__(self) -> int:
        return len(self._tokens)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        text = self._renamed.get(i if i >= 0 else i + len(self))
        return self._tokens[i] if text is None else text

    def join(self, sep: str) -> str:
        return sep.join(self)
