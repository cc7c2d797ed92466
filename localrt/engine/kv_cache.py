"""The KV cache: preallocated once per loaded model, `n_slots` sequences of up to `n_ctx` tokens each.

Layer il holds k/v of shape (n_slots, n_head_kv, cap_il, head_dim): uint16 float16 bits for kv_type "f16"
(llama.cpp's default F16 cache, at its size: Numba has no float16 type, the kernels widen each element
exactly), float32 for "f32". `cap_il` is n_ctx for full
attention layers; a sliding-window layer keeps a ring of `window + n_batch` positions (position p at
index p % cap), enough for every query of a batch to see its whole window after the batch's own keys
were written. `lengths[s]` is how many positions of slot s hold valid keys.
"""
from __future__ import annotations

import numpy as np

KV_TYPES = ("f16", "f32")


def _committed(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros whose pages are touched now, as llama.cpp clears its cache at load.

    np.zeros maps untouched pages, and the first write to each (a 2 MiB transparent huge page to zero, where
    the kernel has them on) would then cost the first request on each slot: measured 0.5-0.9 s added to a
    29-token prefill on a fresh slot of SmolLM2 at 4096 context, stalling every sequence decoding beside it."""
    a = np.empty(shape, dtype)
    a.fill(0)  # +0.0 in float32 and in float16 bits
    return a


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
    ) -> None:
        if n_ctx <= 0 or n_slots <= 0:
            raise ValueError(f"KV cache needs n_ctx > 0 and n_slots > 0, got {n_ctx}, {n_slots}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {KV_TYPES}, got {kv_type!r}")
        # "f16": float16 values (stored as their uint16 bits), the numerics and size of llama.cpp's default
        # F16 cache; "f32": full precision. A layer offloaded to a device keeps float32 holding f16-rounded values.
        self.as_f16 = kv_type == "f16"
        dtype = np.uint16 if self.as_f16 else np.float32
        self.n_ctx = n_ctx
        self.n_slots = n_slots
        self.n_batch = n_batch
        self.windows = tuple(windows) if windows is not None else (0,) * n_layer
        self.k: list[np.ndarray] = []  # per layer: (n_slots, n_head_kv, cap, head_dim) uint16 f16 bits | f32
        self.v: list[np.ndarray] = []  # per layer: (n_slots, n_head_kv, cap, head_dim_v) uint16 f16 bits | f32
        for w in self.windows:
            cap = n_ctx if w <= 0 else min(n_ctx, w + n_batch)
            self.k.append(_committed((n_slots, n_head_kv, cap, head_dim), dtype))
            self.v.append(_committed((n_slots, n_head_kv, cap, head_dim_v), dtype))
        self.lengths = np.zeros(n_slots, np.int64)  # (n_slots,) valid positions per slot

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def check_batch(self, positions: np.ndarray, slots: np.ndarray) -> None:
        """Reject a batch that would not be causal-contiguous or would overflow a ring or the context."""
        for s in np.unique(slots):
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

    def advance(self, positions: np.ndarray, slots: np.ndarray) -> None:
        """Mark the batch's positions as filled (after every layer stored its keys)."""
        for s in np.unique(slots):
            self.lengths[s] = int(positions[slots == s].max()) + 1

    def can_trim(self, slot: int, n: int) -> bool:
        """Whether slot can go back to n positions (a ring layer may have overwritten what n needs)."""
        dropped = int(self.lengths[slot]) - n
        for w, k in zip(self.windows, self.k):
            if w > 0 and k.shape[2] < self.n_ctx and dropped > k.shape[2] - w:
                return False
        return 0 <= n <= self.lengths[slot]

    def trim(self, slot: int, n: int) -> None:
        """Keep the first n positions of slot (prefix reuse); raises if the rings cannot provide them."""
        if not self.can_trim(slot, n):
            raise ValueError(f"cannot trim slot {slot} from {self.lengths[slot]} to {n} positions")
        self.lengths[slot] = n

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Give slot dst the first n positions of slot src (a prefix another sequence computed)."""
        if src == dst or not self.can_trim(src, n):
            raise ValueError(f"cannot copy {n} positions of slot {src} into slot {dst}")
        for w, k, v in zip(self.windows, self.k, self.v):
            if w > 0 and k.shape[2] < self.n_ctx:  # a ring: every index may hold a position n still needs
                k[dst], v[dst] = k[src], v[src]
            else:
                k[dst, :, :n], v[dst, :, :n] = k[src, :, :n], v[src, :, :n]
        self.lengths[dst] = n

    def clear(self, slot: int) -> None:
        self.lengths[slot] = 0
