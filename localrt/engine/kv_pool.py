"""The bookkeeping of a paged KV pool: `n_blocks` blocks of `size` positions, shared by reference count.

A block is in one of three states: *in use* (refs > 0: in the block table of at least one live sequence),
*cached* (refs == 0 but held by one or more finished sequences' `Entry`s, kept for a later prompt's prefix reuse)
or *free*. A block always holds the same position range [i * size, (i + 1) * size) of whatever sequences use it
(`index` = i). Taking a block pops the free list; when it is empty the least recently used cached block is
evicted (the tail of a sequence before its head: ties on the clock go to the higher index), and every entry
holding it is cut back to the positions before it. Every holder of a block sees a prefix of the rows written into
it (`fill`): a live sequence appends at a shared block's frontier in place, and the KV cache copies a shared block
before writing below its frontier (copy-on-write), which only a sequence that diverges from the others does.

Pure bookkeeping (no k/v storage): `localrt.engine.kv_cache.KVCache` owns the arrays and the block tables.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import KVCacheFull


@dataclass(eq=False)
class Entry:
    """A finished sequence's cached prefix: the ids whose keys `blocks` hold, the prompt positions it computed on
    the BLAS path (for `backends.pieces.exact_reuse`) and, where the cache keeps per-slot layers (sliding-window
    rings, offloaded layers), the slot whose arrays hold the rest (-1: the pool holds everything)."""

    tokens: list[int]
    pieces: list[tuple[int, int]]
    blocks: list[int]
    slot: int = -1
    stamp: int = field(default=0, compare=False)
    scope: str = ""  # whose prompts may reuse it (Batcher.add's cache_scope)

    @property
    def length(self) -> int:
        return len(self.tokens)


class BlockPool:
    def __init__(self, n_blocks: int, size: int) -> None:
        if n_blocks <= 0 or size <= 0:
            raise ValueError(f"a KV pool needs n_blocks > 0 and size > 0, got {n_blocks}, {size}")
        self.n_blocks = n_blocks
        self.size = size
        self.refs = np.zeros(n_blocks, np.int32)  # (n_blocks,) live block tables holding each block
        self.holds = np.zeros(n_blocks, np.int32)  # (n_blocks,) finished entries holding each block
        self.stamp = np.zeros(n_blocks, np.int64)  # (n_blocks,) clock when last used (LRU)
        self.index = np.zeros(n_blocks, np.int64)  # (n_blocks,) which position range of its sequence it holds
        self.fill = np.zeros(n_blocks, np.int64)  # (n_blocks,) rows written so far (the block's frontier)
        self.free: list[int] = list(range(n_blocks - 1, -1, -1))  # a stack: block 0 is taken first
        self.entries: list[Entry] = []
        self.clock = 0
        self.evictions = 0  # blocks evicted so far (for /api/ps and tests)

    def copy(self) -> BlockPool:
        """The same bookkeeping, changed apart from this one (its entries copied too)."""
        new = copy.copy(self)
        for name in ("refs", "holds", "stamp", "index", "fill"):
            setattr(new, name, getattr(self, name).copy())
        new.free = list(self.free)
        new.entries = [replace(e, tokens=list(e.tokens), blocks=list(e.blocks)) for e in self.entries]
        return new

    # -- counts ------------------------------------------------------------------------------------

    @property
    def n_free(self) -> int:
        return len(self.free)

    @property
    def n_in_use(self) -> int:
        return int(np.count_nonzero(self.refs))

    @property
    def n_cached(self) -> int:
        return int(np.count_nonzero((self.refs == 0) & (self.holds > 0)))

    def available(self) -> int:
        """Blocks `take` can give now: the free ones and the cached ones it would evict."""
        return self.n_free + self.n_cached

    def exclusive(self, b: int) -> bool:
        """Whether a live sequence holding b may write anywhere into it (no other table, no entry holds it)."""
        return self.refs[b] == 1 and self.holds[b] == 0

    def writable(self, b: int, row: int) -> bool:
        """Whether a live sequence holding b may write rows from `row` on: it holds b alone, or `row` is the block's
        frontier (every other holder sees a prefix of what was written, so appending changes nothing it reads)."""
        return row == self.fill[b] or self.exclusive(b)

    # -- blocks ------------------------------------------------------------------------------------

    def take(self, index: int) -> int:
        """A block for position range `index` of a live sequence (refs 1); evicts LRU when none is free."""
        if not self.free:
            self._evict()
        b = self.free.pop()
        self.refs[b] = 1
        self.index[b] = index
        self.fill[b] = 0
        self.stamp[b] = self.tick()
        return b

    def ref(self, b: int) -> None:
        self.refs[b] += 1
        self.stamp[b] = self.clock

    def unref(self, b: int) -> None:
        if self.refs[b] <= 0:
            raise RuntimeError(f"KV block {b} released more often than it was taken")
        self.refs[b] -= 1
        self._maybe_free(b)

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    # -- entries -----------------------------------------------------------------------------------

    def add_entry(self, entry: Entry) -> None:
        """Keep a finished sequence's blocks cached; drops older entries it covers block for block."""
        entry.stamp = self.tick()
        for b in entry.blocks:
            self.holds[b] += 1
            self.stamp[b] = entry.stamp
        for old in list(self.entries):
            if _covers(entry, old):
                self.drop(old)  # its every block is in the new entry: nothing it could give is lost
        self.entries.append(entry)

    def touch(self, entry: Entry) -> None:
        """A prompt reused entry: it and its blocks are the most recently used."""
        entry.stamp = self.tick()
        for b in entry.blocks:
            self.stamp[b] = entry.stamp

    def drop(self, entry: Entry) -> None:
        if entry in self.entries:
            self.entries.remove(entry)
            self._cut(entry, 0)

    def drop_slot(self, slot: int) -> None:
        """Forget the entries whose per-slot layers live in slot (a new sequence is about to overwrite them)."""
        for e in [e for e in self.entries if e.slot == slot and slot >= 0]:
            self.drop(e)

    def clear_entries(self) -> None:
        """Forget every cached prefix (their blocks go back to the free list unless a live sequence holds them)."""
        for e in list(self.entries):
            self.drop(e)

    def claim(self, b: int) -> None:
        """The one live sequence holding b takes it over: every entry holding it is cut back to before it."""
        i = int(self.index[b])
        for e in [e for e in self.entries if i < len(e.blocks) and e.blocks[i] == b]:
            self._cut(e, i)
            if not e.blocks or any(f is not e and _covers(f, e) for f in self.entries):
                self.drop(e)  # nothing left, or nothing another entry does not give as well (entries stay few)

    def _cut(self, entry: Entry, i: int) -> None:
        """Release entry's blocks from number i on and its tokens from position i * size on."""
        for b in entry.blocks[i:]:
            self.holds[b] -= 1
            self._maybe_free(b)
        del entry.blocks[i:]
        del entry.tokens[i * self.size :]

    def _evict(self) -> None:
        cached = np.flatnonzero((self.refs == 0) & (self.holds > 0))
        if not len(cached):
            raise KVCacheFull(self.n_blocks, self.size)
        # Least recently used first; of one sequence's blocks (one stamp) the last positions first.
        b = int(cached[np.lexsort((-self.index[cached], self.stamp[cached]))[0]])
        self.claim(b)  # refs 0: once no entry holds it, _maybe_free puts it on the free list
        self.evictions += 1

    def _maybe_free(self, b: int) -> None:
        if self.refs[b] == 0 and self.holds[b] == 0:
            self.free.append(b)


def _covers(big: Entry, small: Entry) -> bool:
    """Whether big holds small's every block at the same place and at least its positions (so small is redundant)."""
    return (
        big.slot == small.slot
        and big.scope == small.scope
        and big.length >= small.length
        and big.blocks[: len(small.blocks)] == small.blocks
    )
