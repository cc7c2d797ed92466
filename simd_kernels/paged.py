"""The KV store and the per-row attention over a paged cache: keys live in fixed-size blocks of a shared pool and
each sequence's block table says which block holds its positions [i * B, (i + 1) * B).

k_pool (n_blocks, n_kv, B, head_dim), v_pool (n_blocks, n_kv, B, head_dim_v): float32, or uint16 float16 bits;
table (n_slots, max_blocks) int32, -1 where a slot has no block. Position p of slot s is row p % B of block
table[s, p // B]. The attention runs `ops.attention`'s kernel (simd_kernels.attend), so a paged cache gives
bit-identical outputs to a contiguous one holding the same values (tests/engine/test_kv_pool.py checks it).
"""

from __future__ import annotations

import numpy as np

from . import attend, checks
from .checks import KernelArgumentError
from .jit import njit


def _check_pool(k_pool, v_pool, table, positions, slots, n_tok: int, n_kv: int, hd: int, hd_v: int) -> int:
    """Shapes, dtypes and every block the rows index; returns the largest position (-1 for no rows)."""
    n_blocks, _, size, _ = checks.dims("k_pool", k_pool, 4)
    checks.shape("k_pool", k_pool, (n_blocks, n_kv, size, hd))
    checks.shape("v_pool", v_pool, (n_blocks, n_kv, size, hd_v))
    checks.kv_dtype(k_pool, v_pool)
    n_slots, max_blocks = checks.dims("table", table, 2)
    if table.dtype != np.int32 or size == 0:
        raise KernelArgumentError(f"the block table must be int32 and blocks non-empty, got {table.dtype}, {size}")
    p_max = checks.rows_index(positions, slots, n_tok, n_slots)
    if n_tok and p_max >= max_blocks * size:
        raise KernelArgumentError(f"position {p_max} is beyond the {max_blocks * size} positions a block table maps")
    if n_tok and not _mapped(table, positions, slots, size, n_blocks):
        raise KernelArgumentError("a row's position has no block (or a block id out of range) in its slot's table")
    return p_max


@njit(cache=True, nogil=True)
def _mapped(table, positions, slots, size, n_blocks):
    """Whether every block holding positions 0..p of each row's slot is a valid block id."""
    for t in range(positions.shape[0]):
        for i in range(positions[t] // size + 1):
            b = table[slots[t], i]
            if b < 0 or b >= n_blocks:
                return False
    return True


def kv_store_paged(k, v, k_pool, v_pool, table, positions, slots):
    """Write k (n_tok, n_kv, head_dim), v (n_tok, n_kv, head_dim_v) at each row's block and offset."""
    n_tok, n_kv, hd = checks.dims("k", k, 3)
    hd_v = checks.dims("v", v, 3)[2]
    checks.shape("v", v, (n_tok, n_kv, hd_v))
    if k.dtype != k_pool.dtype or v.dtype != v_pool.dtype:  # a store would convert values, not copy float16 bits
        raise KernelArgumentError(f"k, v ({k.dtype}, {v.dtype}) must have the pool's dtype {k_pool.dtype}")
    _check_pool(k_pool, v_pool, table, positions, slots, n_tok, n_kv, hd, hd_v)
    return _kv_store_paged(k, v, k_pool, v_pool, table, positions, slots)


@njit(cache=True, nogil=True)
def _kv_store_paged(k, v, k_pool, v_pool, table, positions, slots):
    size = k_pool.shape[2]
    for t in range(k.shape[0]):
        p = positions[t]
        b = table[slots[t], p // size]
        j = p % size
        for h in range(k.shape[1]):
            k_pool[b, h, j, :] = k[t, h, :]
            v_pool[b, h, j, :] = v[t, h, :]


def attention_paged(q, k_pool, v_pool, table, positions, slots, window, scale, out, softcap=0.0, sinks=None):
    """`ops.attention` over a paged cache: q (n_tok, n_head, head_dim) f32, out (n_tok, n_head, head_dim_v) f32;
    sinks None or (n_head,) f32."""
    n_tok, n_head, hd = checks.dims("q", q, 3)
    n_kv = checks.dims("k_pool", k_pool, 4)[1]
    hd_v = checks.dims("v_pool", v_pool, 4)[3]
    checks.shape("out", out, (n_tok, n_head, hd_v))
    if n_kv == 0 or n_head % n_kv:
        raise KernelArgumentError(f"{n_head} query heads cannot share {n_kv} KV heads")
    p_max = _check_pool(k_pool, v_pool, table, positions, slots, n_tok, n_kv, hd, hd_v)
    if n_tok == 0:
        return out
    return attend.run(q, k_pool, v_pool, table, True, positions, slots, window, scale, softcap, out, p_max, sinks)


def gather(pool, table_row, k0: int, k1: int) -> np.ndarray:
    """Positions k0..k1-1 of one slot from a pool (n_blocks, n_kv, B, hd) as a contiguous (n_kv, k1 - k0, hd) copy."""
    size = pool.shape[2]
    b0, b1 = k0 // size, (k1 - 1) // size + 1
    ids = table_row[b0:b1]
    if (ids < 0).any() or (ids >= pool.shape[0]).any():
        raise KernelArgumentError(f"positions {k0}..{k1 - 1} are not all in blocks of the pool")
    blocks = pool[ids]  # (nb, n_kv, B, hd)
    flat = blocks.transpose(1, 0, 2, 3).reshape(pool.shape[1], (b1 - b0) * size, pool.shape[3])  # (n_kv, nb * B, hd)
    return flat[:, k0 - b0 * size : k1 - b0 * size]
