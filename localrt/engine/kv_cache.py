"""The KV cache of a loaded model: a paged pool for the full-attention layers, per-slot rings for the others.

Full-attention layer il holds k/v in one pool of fixed-size blocks shared by every sequence:
k (n_blocks, n_head_kv, block_size, head_dim), v (n_blocks, n_head_kv, block_size, head_dim_v); slot s's
positions [i * B, (i + 1) * B) live in block `tables[s, i]` (-1: none yet). Sequences take blocks as they grow
(`prepare`, before a forward writes them), share the full blocks of a common prefix by reference count
(`share`) and copy a shared block only before writing below its frontier, i.e. where another holder may read
(copy-on-write: a sequence diverging from a shared prefix copies its partly filled last block); a finished
sequence's blocks stay cached for later prompts (`retire`) until the pool needs them (LRU, localrt.engine.kv_pool).
The pool's size is the KV budget: by default `n_slots * n_ctx` positions, never less than one full context (so
one sequence always fits: a block only a cached prefix shares with it is taken over when no block is left to
copy it into).

A sliding-window layer keeps its small ring per slot, (n_slots, n_head_kv, window + n_batch, head_dim) (position p
at index p % cap: enough for every query of a batch to see its whole window after the batch's own keys were
written), as llama.cpp keeps a separate SWA cache; so does a layer offloaded to a device (`place_layer`: the
contiguous (n_slots, n_head_kv, n_ctx, head_dim) layout its kernels read). A cache with such per-slot layers is
`slot_bound`: a finished sequence's prefix is reusable only while its slot is not given to another sequence.

Values: uint16 float16 bits for kv_type "f16" (llama.cpp's default F16 cache, at its size: Numba has no float16
type, the kernels widen each element exactly), float32 for "f32". `lengths[s]` is how many positions of slot s
hold valid keys.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from .backends.pieces import exact_reuse
from .kv_pool import BlockPool, Entry

KV_TYPES = ("f16", "f32")
# Positions per block. Sharing is exact at any size (a partly filled shared block is copied before it diverges), so
# the size trades waste (under one block per sequence, and per cached prefix) against bookkeeping; 64 keeps a
# block's keys of one head contiguous for 64 positions (8 KiB at head_dim 64 in f16) and divides the 256-position
# BLAS pieces, so a piece's keys are whole blocks.
KV_BLOCK = 64


@dataclass(frozen=True, eq=False)
class Prefix:
    """Keys a new sequence may reuse: a cached prefix (`entry`) or a running sequence's computed positions."""

    tokens: list[int]  # the ids whose keys it holds, in order
    pieces: list[tuple[int, int]]  # the positions it computed on the BLAS path (backends.pieces.prompt_pieces)
    blocks: list[int]  # the pool blocks holding them
    slot: int  # the slot whose per-slot layers hold them (-1: none; the cache is not slot-bound)
    entry: Entry | None = None  # the cached prefix, or None for a running sequence
    scope: str = ""  # whose prompts may reuse it: only a sequence of the same scope does (Batcher.add)


def _committed(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros whose pages are touched now, as llama.cpp clears its cache at load.

    np.zeros maps untouched pages, and the first write to each (a 2 MiB transparent huge page to zero, where
    the kernel has them on) would then cost the first request on each slot: measured 0.5-0.9 s added to a
    29-token prefill on a fresh slot of SmolLM2 at 4096 context, stalling every sequence decoding beside it."""
    a = np.empty(shape, dtype)
    a.fill(0)  # +0.0 in float32 and in float16 bits
    return a


def pool_position_bytes(windows, n_head_kv: int, head_dim: int, head_dim_v: int, kv_type: str = "f16") -> int:
    """Bytes one position takes in the pool: K and V of every full-attention layer."""
    return sum(w <= 0 for w in windows) * n_head_kv * (head_dim + head_dim_v) * (2 if kv_type == "f16" else 4)


def budget_positions(kv_budget: int, kv_budget_bytes: int, position_bytes: int) -> int:
    """The pool's budget in positions: kv_budget, else kv_budget_bytes over the bytes of one position (at least 1;
    0 where neither is set or no layer is pooled)."""
    if kv_budget_bytes > 0 and not kv_budget and position_bytes > 0:
        return max(1, kv_budget_bytes // position_bytes)
    return kv_budget


def pool_blocks(n_ctx: int, n_slots: int, budget: int = 0, block_size: int = KV_BLOCK) -> int:
    """Blocks of the pool for a budget of `budget` positions (0: n_slots * n_ctx), at least one full context."""
    per_ctx = -(-n_ctx // block_size)
    want = n_slots * per_ctx if budget <= 0 else -(-budget // block_size)
    return max(per_ctx, want)


class KVCache:
    def __init__(
        self,
        n_layer: int,
        n_head_kv: int,
        head_dim: int,
        head_dim_v: int,
        n_ctx: int,
        n_slots: int = 1,
        windows: tuple[int, ...] | None = None,
        n_batch: int = 512,
        kv_type: str = "f16",
        *,
        n_blocks: int = 0,
        block_size: int = KV_BLOCK,
    ) -> None:
        if n_ctx <= 0 or n_slots <= 0 or block_size <= 0:
            raise ValueError(f"KV cache needs n_ctx, n_slots, block_size > 0, got {n_ctx}, {n_slots}, {block_size}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {KV_TYPES}, got {kv_type!r}")
        # "f16": float16 values (stored as their uint16 bits), the numerics and size of llama.cpp's default
        # F16 cache; "f32": full precision. A layer offloaded to a device keeps float32 holding f16-rounded values.
        self.as_f16 = kv_type == "f16"
        self.dtype = np.uint16 if self.as_f16 else np.float32
        self.n_ctx = n_ctx
        self.n_slots = n_slots
        self.n_batch = n_batch
        self.block_size = block_size
        self.max_blocks = -(-n_ctx // block_size)
        n_blocks = max(n_blocks, self.max_blocks) if n_blocks > 0 else pool_blocks(n_ctx, n_slots, 0, block_size)
        self.pool = BlockPool(n_blocks, block_size)
        self.tables = np.full((n_slots, self.max_blocks), -1, np.int32)  # (n_slots, max_blocks) block ids
        self.windows = tuple(windows) if windows is not None else (0,) * n_layer
        self.paged = [w <= 0 for w in self.windows]  # per layer: in the pool, or per slot (ring / offloaded)
        self.caps = [n_ctx if w <= 0 else min(n_ctx, w + n_batch) for w in self.windows]  # positions per slot
        self.k: list[np.ndarray] = []  # per layer: (n_blocks, n_kv, B, hd) pool | (n_slots, n_kv, cap, hd) per slot
        self.v: list[np.ndarray] = []  # per layer: the same with head_dim_v
        for il, cap in enumerate(self.caps):
            lead = (n_blocks, n_head_kv, block_size) if self.paged[il] else (n_slots, n_head_kv, cap)
            self.k.append(_committed((*lead, head_dim), self.dtype))
            self.v.append(_committed((*lead, head_dim_v), self.dtype))
        self.lengths = np.zeros(n_slots, np.int64)  # (n_slots,) valid positions per slot

    def ledger(self) -> KVCache:
        """A copy of the bookkeeping (block tables, lengths, the pool's counts and cached prefixes) without the keys:
        what a step would do to the cache is planned on it (localrt.engine.slots), and changes nothing here."""
        new = copy.copy(self)
        new.pool = self.pool.copy()
        new.tables, new.lengths = self.tables.copy(), self.lengths.copy()
        new.k, new.v = [], []  # no keys: copying a slot's per-slot layers (copy_slotted) is bookkeeping-free
        return new

    # -- layout ------------------------------------------------------------------------------------

    def table_of(self, il: int) -> np.ndarray | None:
        """The block tables layer il's kernels read through, or None for a per-slot layer."""
        return self.tables if self.paged[il] else None

    def place_layer(self, il: int, zeros) -> None:
        """Layer il moves to a device: `zeros(shape)` allocates its per-slot (n_slots, n_kv, n_ctx, hd) arrays there,
        the layout its kernels read; the host pool arrays of the layer are dropped."""
        k, v = self.k[il], self.v[il]
        self.paged[il] = False
        self.k[il] = zeros((self.n_slots, k.shape[1], self.caps[il], k.shape[3]))
        self.v[il] = zeros((self.n_slots, v.shape[1], self.caps[il], v.shape[3]))

    @property
    def slot_bound(self) -> bool:
        """Whether some layer keeps per-slot arrays (a prefix is reusable only from the slot holding them)."""
        return not all(self.paged)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over every paged layer (k and v)."""
        return sum(k.nbytes + v.nbytes for k, v, p in zip(self.k, self.v, self.paged) if p) // self.pool.n_blocks

    @property
    def used_bytes(self) -> int:
        """Bytes holding keys: the pool's blocks in use or cached, and the per-slot layers' filled positions."""
        held = self.pool.n_blocks - self.pool.n_free
        filled = self.lengths.copy()  # (n_slots,) positions each slot's per-slot layers hold
        for e in self.pool.entries:
            if e.slot >= 0:
                filled[e.slot] = max(filled[e.slot], e.length)
        slotted = 0
        for k, v, p, cap in zip(self.k, self.v, self.paged, self.caps):
            if not p:
                per_pos = (k.nbytes + v.nbytes) // (self.n_slots * cap)
                slotted += int(np.minimum(filled, cap).sum()) * per_pos
        return held * self.block_bytes + slotted

    # -- a batch -----------------------------------------------------------------------------------

    def check_batch(self, positions: np.ndarray, slots: np.ndarray) -> None:
        """Reject a batch that would not be causal-contiguous or would overflow a ring or the context."""
        for s in _slot_ids(slots):
            if not 0 <= s < self.n_slots:
                raise ValueError(f"slot {s} out of range 0..{self.n_slots - 1}")
            pos = positions[slots == s]
            start = int(self.lengths[s])
            if len(pos) > self.n_batch:
                raise ValueError(f"{len(pos)} tokens for slot {s} in one batch, more than n_batch {self.n_batch}")
            if not np.array_equal(pos, np.arange(start, start + len(pos))):
                raise ValueError(f"slot {s} holds {start} positions; batch positions must continue from there")
            if start + len(pos) > self.n_ctx:
                raise ValueError(f"slot {s} would reach {start + len(pos)} positions, over n_ctx {self.n_ctx}")

    def blocks_needed(self, slot: int, end: int) -> int:
        """Blocks `prepare` must take for slot to hold positions up to end - 1: new ones, and copies of blocks another
        live sequence reads past where slot writes (one only cached prefixes hold can be taken over instead)."""
        B, table, pool = self.block_size, self.tables[slot], self.pool
        start = int(self.lengths[slot])
        n = 0
        for i in range(start // B, -(-end // B)):
            b = int(table[i])
            n += b < 0 or (pool.refs[b] > 1 and not pool.writable(b, max(start - i * B, 0)))
        return n

    def prepare(self, positions: np.ndarray, slots: np.ndarray) -> None:
        """Give every slot of a checked batch the blocks its positions are written to: new blocks as it grows, and a
        private copy of a shared block it would write below the block's frontier (copy-on-write; a block shared only
        with cached prefixes is copied while blocks are to spare, else taken from them). Raises KVCacheFull when the
        pool cannot."""
        B, pool = self.block_size, self.pool
        ends = {int(s): int(positions[slots == s].max()) + 1 for s in _slot_ids(slots)}
        todo = []  # (slot, block number) that need a new block, a copy, or a take-over
        for s, end in ends.items():
            table, start = self.tables[s], int(self.lengths[s])
            for i in range(start // B, -(-end // B)):
                b = int(table[i])
                if b >= 0 and pool.writable(b, max(start - i * B, 0)):
                    pool.fill[b] = min(B, end - i * B)
                else:
                    todo.append((s, i))
        if not todo:  # the usual decode step: every row appends to a block it may write
            return
        must = [int(self.tables[s, i]) for s, i in todo]
        spare = pool.available() - sum(b < 0 or pool.refs[b] > 1 for b in must)  # blocks left for optional copies
        for s, i in todo:
            table = self.tables[s]
            b = int(table[i])
            if b >= 0 and pool.refs[b] == 1 and spare <= 0:
                pool.claim(b)  # the cached prefixes holding it end before it
            else:
                spare -= b >= 0 and pool.refs[b] == 1
                b = self._copy_on_write(table, i, b)
            pool.fill[b] = min(B, ends[s] - i * B)

    def _copy_on_write(self, table: np.ndarray, i: int, b: int) -> int:
        """A new block at table[i], holding a copy of what shared block b holds (b < 0: none)."""
        nb = self.pool.take(i)
        if b >= 0:
            for il, p in enumerate(self.paged):
                if p:
                    self.k[il][nb], self.v[il][nb] = self.k[il][b], self.v[il][b]
            self.pool.unref(b)
        table[i] = nb
        return nb

    def advance(self, positions: np.ndarray, slots: np.ndarray) -> None:
        """Mark the batch's positions as filled (after every layer stored its keys)."""
        for s in _slot_ids(slots):
            self.lengths[s] = int(positions[slots == s].max()) + 1

    # -- prefixes ----------------------------------------------------------------------------------

    def ring_keeps(self, length: int, n: int) -> bool:
        """Whether per-slot layers filled to `length` positions still hold what a sequence of n positions needs."""
        dropped = length - n
        for w, cap in zip(self.windows, self.caps):
            if w > 0 and cap < self.n_ctx and dropped > cap - w:
                return False
        return 0 <= n <= length

    def can_trim(self, slot: int, n: int) -> bool:
        """Whether slot can go back to n positions (a ring layer may have overwritten what n needs)."""
        return self.ring_keeps(int(self.lengths[slot]), n)

    def trim(self, slot: int, n: int) -> None:
        """Keep the first n positions of slot; raises if the rings cannot provide them. Blocks past them are let go."""
        if not self.can_trim(slot, n):
            raise ValueError(f"cannot trim slot {slot} from {self.lengths[slot]} to {n} positions")
        self._release(slot, -(-n // self.block_size))
        self.lengths[slot] = n

    def clear(self, slot: int) -> None:
        self._release(slot, 0)
        self.lengths[slot] = 0

    def blocks_of(self, slot: int) -> list[int]:
        """The blocks holding slot's valid positions, in order."""
        return [int(b) for b in self.tables[slot, : -(-int(self.lengths[slot]) // self.block_size)]]

    def share(self, slot: int, blocks: list[int], n: int) -> None:
        """Slot (emptied first) holds n positions whose keys are in `blocks` (another sequence's), by reference."""
        self.clear(slot)
        nb = -(-n // self.block_size)
        if len(blocks) < nb:
            raise ValueError(f"{len(blocks)} blocks cannot hold {n} positions")
        for i, b in enumerate(blocks[:nb]):
            self.pool.ref(b)
            self.tables[slot, i] = b
        self.lengths[slot] = n

    def copy_slotted(self, src: int, dst: int, n: int) -> None:
        """Give slot dst the first n positions of slot src's per-slot layers (a ring: all of it)."""
        if not self.k:
            return  # a ledger: no keys to copy
        for il, p in enumerate(self.paged):
            if p:
                continue
            k, v = self.k[il], self.v[il]  # (n_slots, n_kv, cap, hd[_v])
            if self.windows[il] > 0 and self.caps[il] < self.n_ctx:  # a ring: every index may hold a position n needs
                k[dst], v[dst] = k[src], v[src]
            else:
                k[dst, :, :n], v[dst, :, :n] = k[src, :, :n], v[src, :, :n]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Give slot dst the first n positions of slot src: its blocks by reference, its per-slot layers copied."""
        if src == dst or not self.can_trim(src, n):
            raise ValueError(f"cannot copy {n} positions of slot {src} into slot {dst}")
        self.share(dst, self.blocks_of(src), n)
        self.copy_slotted(src, dst, n)

    def retire(self, slot: int, tokens: list[int], pieces: list[tuple[int, int]], scope: str = "") -> Entry | None:
        """A sequence leaves slot: its blocks stay cached as an Entry (the ids `tokens` whose keys they hold; None
        for no positions) and the slot's table is emptied. In a slot-bound cache the slot's rings still
        hold the entry's positions until the slot is given to another sequence: `ring_keeps` on the entry's length)."""
        n = int(self.lengths[slot])
        entry = None
        if n > 0:
            entry = Entry(
                list(tokens[:n]), list(pieces), self.blocks_of(slot), slot if self.slot_bound else -1, scope=scope
            )
            self.pool.add_entry(entry)
        self.clear(slot)
        return entry

    def running_prefix(self, slot: int, history: list[int], pieces: list[tuple[int, int]], scope: str = "") -> Prefix:
        """What a running sequence in slot (its ids `history`, its BLAS `pieces`) holds for others to reuse."""
        return Prefix(history[: int(self.lengths[slot])], pieces, self.blocks_of(slot), slot, None, scope)

    def prefixes(self, running: list[Prefix] = (), scope: str | None = None) -> list[Prefix]:
        """Every cached prefix, then the `running` sequences' (running_prefix); only those of `scope` if given."""
        out = [Prefix(e.tokens, e.pieces, e.blocks, e.slot, e, e.scope) for e in self.pool.entries] + list(running)
        return out if scope is None else [p for p in out if p.scope == scope]

    def forget_prefixes(self) -> None:
        """Forget every cached prefix of finished sequences: the next prompt reuses none of them and is evaluated
        fresh (what a running sequence holds stays; their blocks go back to the free list unless one holds them)."""
        self.pool.clear_entries()

    def reusable(self, source: Prefix, target: list[int], pieces: list[tuple[int, int]], reuse_min: int = 1) -> int:
        """How many leading positions of target (a prompt whose BLAS pieces are `pieces`) source gives with the
        numerics a fresh evaluation has (backends.pieces.exact_reuse); 0 below reuse_min. At least the last
        position of target is always left to evaluate (its logits are needed)."""
        common = _common_prefix(source.tokens, target, min(len(target) - 1, len(source.tokens)))
        keep = exact_reuse(common, source.pieces, pieces)
        if keep < reuse_min or (source.slot >= 0 and not self.ring_keeps(len(source.tokens), keep)):
            return 0
        return keep

    def match_prefix(
        self,
        target: list[int],
        pieces: list[tuple[int, int]],
        sources: list[Prefix],
        *,
        reuse_min: int = 1,
        slot: int = -1,
    ) -> tuple[int, Prefix | None]:
        """The longest exactly reusable prefix of target among sources: (its length, its source), (0, None) for
        none. On a tie the source in `slot` itself wins (nothing to copy), else the first listed."""
        best, pick = 0, None
        for source in sources:
            keep = self.reusable(source, target, pieces, reuse_min)
            if keep > best or (keep == best and keep and source.slot == slot):
                best, pick = keep, source
        return best, pick

    def take_prefix(self, slot: int, source: Prefix | None, n: int) -> None:
        """Slot (emptied first) holds source's first n positions: its full blocks by reference (a partly filled
        last block is copied when first written: `prepare`), its per-slot layers copied from the slot holding
        them. Source None: the slot is just emptied."""
        self.clear(slot)
        if source is not None:
            self.share(slot, source.blocks, n)
            if source.slot >= 0 and source.slot != slot:
                self.copy_slotted(source.slot, slot, n)
            if source.entry is not None:
                self.pool.touch(source.entry)
        self.pool.drop_slot(slot)  # the slot's per-slot layers are about to be overwritten

    def _release(self, slot: int, keep: int) -> None:
        """Let go of slot's blocks from number keep on."""
        table = self.tables[slot]
        for i in range(keep, self.max_blocks):
            b = int(table[i])
            if b >= 0:
                self.pool.unref(b)
                table[i] = -1


def _slot_ids(slots: np.ndarray) -> list[int]:
    """The distinct slots of a batch, ascending: np.unique's answer without its cost on a few rows (in NumPy 2 its
    first call also imports numpy.ma, 10 ms of a fresh process's first token)."""
    return sorted(set(slots.tolist()))


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most limit."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(diff[0]) if len(diff) else n
