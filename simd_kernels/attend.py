"""The per-row attention kernel shared by the contiguous cache (`ops.attention`) and the paged pool
(`paged.attention_paged`): one code path, so the two give bit-identical outputs for the same keys.

A cache is read as blocks: k (n_blocks, n_kv, B, head_dim), v (n_blocks, n_kv, B, head_dim_v), float32 or uint16
float16 bits. Paged, position p of slot s is row p % B of block table[s, p // B]. Contiguous, the cache
(n_slots, n_kv, cap, hd) is one block per slot, B = cap, and position p is row p % cap of block s (a ring for
sliding-window layers).

A job is one (query token, head). Tried: a job per KV head that converts each key row once for the query heads
sharing it (GQA); it was slower here (1B, 1024 keys: 268 against 247 us), the row copy costing more than the
conversions it saved.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import threads
from .checks import KernelArgumentError
from .half import kv_f32
from .vmath import expf

# Reassociation lets LLVM vectorize the dot-product reductions; no flag that assumes finite values, since the
# running max starts at -inf.
_REDUCE = {"reassoc", "contract", "nsz", "arcp"}

NO_TABLE = np.zeros((0, 0), np.int32)  # the `table` argument of a contiguous cache


def run(q, k, v, table, paged: bool, positions, slots, window: int, scale: float, softcap, out, p_max: int):
    """The attention of rows the caller has checked (at least one; p_max their largest position): the softcap
    refused unless 0 or positive, then the jobs on this thread, or on Numba's threads once they read enough keys
    (a decode step over a few hundred positions does)."""
    softcap = np.float32(softcap)
    if not softcap >= 0:
        raise KernelArgumentError(f"softcap must be 0 (off) or positive, got {softcap}")
    n_tok, n_head, hd = q.shape
    n_keys = p_max + 1 if window <= 0 else min(p_max + 1, window)
    work = n_tok * n_head * n_keys * (hd + v.shape[3]) * 4  # bytes of k, v read
    if work >= threads.PARALLEL_MIN_BYTES * 4 and n_tok * n_head > 1:
        threads.use_threads_for(work)
        return _parallel(q, k, v, table, paged, positions, slots, window, scale, softcap, out)
    return _serial(q, k, v, table, paged, positions, slots, window, scale, softcap, out)


@njit(inline="always")
def _block_of(table, paged, s, pos, size):
    """(block, row) holding position pos of slot s."""
    if paged:
        return table[s, pos // size], pos % size
    return s, pos % size


@njit(cache=True, nogil=True, fastmath=_REDUCE)
def _attend(q, k, v, table, paged, positions, slots, window, scale, softcap, out, job):
    """Job `job` of `run`: token job // n_head, query head job % n_head."""
    n_head = q.shape[1]
    hd = q.shape[2]
    size = k.shape[2]
    hd_v = v.shape[3]
    t = job // n_head
    h = job % n_head
    kvh = h // (n_head // k.shape[1])
    s = slots[t]
    p = positions[t]
    sc = np.float32(scale)
    start = 0
    if window > 0 and p - window + 1 > 0:
        start = p - window + 1
    n = p - start + 1
    scores = np.empty(n, np.float32)  # (n_keys,)
    m = -np.inf
    j = 0
    pos = start
    while pos <= p:
        b, lo = _block_of(table, paged, s, pos, size)
        hi = min(size, lo + p + 1 - pos)  # rows lo..hi-1 of block b hold positions pos..
        for r in range(lo, hi):
            acc = np.float32(0.0)
            for d in range(hd):
                acc += q[t, h, d] * kv_f32(k[b, kvh, r, d])
            acc *= sc
            if softcap > 0:
                acc = softcap * np.float32(math.tanh(acc / softcap))
            scores[j] = acc
            m = max(m, acc)
            j += 1
        pos += hi - lo
    total = 0.0
    for j in range(n):
        e = expf(scores[j] - m)
        scores[j] = e
        total += e
    inv = np.float32(1.0 / total)
    acc_v = np.zeros(hd_v, np.float32)  # (head_dim_v,)
    j = 0
    pos = start
    while pos <= p:
        b, lo = _block_of(table, paged, s, pos, size)
        hi = min(size, lo + p + 1 - pos)
        for r in range(lo, hi):
            w = scores[j] * inv
            for d in range(hd_v):
                acc_v[d] += w * kv_f32(v[b, kvh, r, d])
            j += 1
        pos += hi - lo
    out[t, h, :] = acc_v


@njit(cache=True, nogil=True, parallel=True)
def _parallel(q, k, v, table, paged, positions, slots, window, scale, softcap, out):
    for job in prange(q.shape[0] * q.shape[1]):
        _attend(q, k, v, table, paged, positions, slots, window, scale, softcap, out, job)
    return out


@njit(cache=True, nogil=True)
def _serial(q, k, v, table, paged, positions, slots, window, scale, softcap, out):
    for job in range(q.shape[0] * q.shape[1]):
        _attend(q, k, v, table, paged, positions, slots, window, scale, softcap, out, job)
    return out
