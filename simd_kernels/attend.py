"""The per-row attention kernel shared by the contiguous cache (`ops.attention`) and the paged pool
(`paged.attention_paged`): one code path, so the two give bit-identical outputs for the same keys.

A cache is read as blocks: k (n_blocks, n_kv, B, head_dim), v (n_blocks, n_kv, B, head_dim_v), float32 or uint16
float16 bits. Paged, position p of slot s is row p % B of block table[s, p // B]. Contiguous, the cache
(n_slots, n_kv, cap, hd) is one block per slot, B = cap, and position p is row p % cap of block s (a ring for
sliding-window layers).

A job is one (query token, head). Tried: a job per KV head that converts each key row once for the query heads
sharing it (GQA); it was slower here, the row copy costing more than the conversions it saved. So was a job per
run of a sequence's rows (a draft's) and head, converting each key once for the rows: the dots, not the loads, cost
(docs/measurements.md).
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from . import threads
from .checks import KernelArgumentError
from .half import kv_f32
from .jit import njit
from .attend_simd import LANES, key_dot1, key_dots16, mix_values
from .vmath import expf, tanhf

# Reassociation lets LLVM vectorize the dot-product reductions; no flag that assumes finite values, since the
# running max starts at -inf.
_REDUCE = {"reassoc", "contract", "nsz", "arcp"}

NO_TABLE = np.zeros((0, 0), np.int32)  # the `table` argument of a contiguous cache
NO_SINKS = np.zeros(0, np.float32)  # the `sinks` argument of a model without attention sinks
KEYS = 4  # keys a step of `_attend_loops` takes together (its code is written out for four)
# Value rows per attend_simd.mix_values call: it goes through them once per four 16-element chunks of the head, so they should
# stay in L1 (Gemma 3's 256-dim heads over 1000 keys: one call a block ran its four passes from L3, a slower step).
MIX_KEYS = 32


# e^x is taken at x >= -87, where it is a normal float32 (1.6e-38): below, expf's last multiply makes a subnormal,
# which x86 takes through a microcode assist (the -inf padding alone made softmax_causal much slower). A key that far
# below the maximum gets 1.6e-38 / total instead of less: no sum can see it.
_EXP_FLOOR = np.float32(-87.0)


def run(q, k, v, table, paged: bool, positions, slots, window: int, scale: float, softcap, out, p_max: int, sinks=None):
    """The attention of rows the caller has checked (at least one; p_max their largest position): the softcap
    refused unless 0 or positive, the sinks unless None or (n_head,) f32, then the jobs on this thread, or on
    Numba's threads once they read enough keys (a decode step over a few hundred positions does).

    sinks (n_head,) f32 (gpt-oss's `attn_sinks`): per query head a logit that joins the softmax's maximum and
    denominator, as a key with no value would (ggml's soft_max with sinks); it is not scaled or softcapped."""
    softcap = np.float32(softcap)
    if not softcap >= 0:
        raise KernelArgumentError(f"softcap must be 0 (off) or positive, got {softcap}")
    sinks = check_sinks(sinks, q.shape[1])
    n_tok, n_head, hd = q.shape
    n_keys = p_max + 1 if window <= 0 else min(p_max + 1, window)
    work = n_tok * n_head * n_keys * (hd + v.shape[3]) * 4  # bytes of k, v read
    if work >= threads.PARALLEL_MIN_BYTES * 4 and n_tok * n_head > 1:
        threads.use_threads_for(work)
        return _parallel(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks)
    return _serial(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks)


def check_sinks(sinks, n_head: int) -> np.ndarray:
    """NO_SINKS for None, else the sinks as a contiguous (n_head,) f32 array; anything else is refused."""
    if sinks is None:
        return NO_SINKS
    if not isinstance(sinks, np.ndarray) or sinks.dtype != np.float32 or sinks.shape != (n_head,):
        raise KernelArgumentError(
            f"sinks must be a ({n_head},) float32 array (one per query head), got "
            f"{getattr(sinks, 'shape', type(sinks).__name__)} {getattr(sinks, 'dtype', '')}"
        )
    if not np.isfinite(sinks).all():
        raise KernelArgumentError("sinks hold NaN or infinite values")
    return np.ascontiguousarray(sinks)


@njit(inline="always")
def _block_of(table, paged, s, pos, size):
    """(block, row) holding position pos of slot s."""
    if paged:
        return table[s, pos // size], pos % size
    return s, pos % size


@njit(inline="always")
def _vector_heads(q, k, v, out):
    """Whether `_attend` can take its heads as whole vectors (simd_kernels.attend_simd): head_dim a multiple of 16,
    head_dim_v of 64, each array contiguous along its dims."""
    return (
        q.shape[2] % LANES == 0
        and v.shape[3] % (4 * LANES) == 0
        and q.strides[2] == 4
        and out.strides[2] == 4
        and k.strides[3] == k.itemsize
        and v.strides[3] == v.itemsize
    )


@njit(cache=True, nogil=True, fastmath=_REDUCE)
def _attend(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks, job):
    """Job `job` of `run`: token job // n_head, query head job % n_head.

    The scores 16 keys at a time where a block has 16 more (the rest one at a time: the same sum, attend_simd.key_dot1),
    softcapped, their softmax, then the value rows mixed MIX_KEYS at a time (attend_simd.mix_values, one chain of FMAs per
    element over all the keys): a key's terms do not depend on where blocks end, so the paged and the contiguous cache
    give the same bits, and a row's on the other rows of the call not at all."""
    if not _vector_heads(q, k, v, out):
        _attend_loops(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks, job)
        return
    n_head = q.shape[1]
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
    j = 0
    pos = start
    while pos <= p:
        b, lo = _block_of(table, paged, s, pos, size)
        hi = min(size, lo + p + 1 - pos)  # rows lo..hi-1 of block b hold positions pos..
        r = lo
        while r < hi:
            if r + LANES <= hi:
                key_dots16(q, k, scores, t, h, b, kvh, r, j, sc)
                step = LANES
            else:
                scores[j] = key_dot1(q, k, t, h, b, kvh, r) * sc
                step = 1
            j += step
            r += step
        pos += hi - lo
    if softcap > 0:
        for j in range(n):
            scores[j] = softcap * np.float32(math.tanh(scores[j] / softcap))
    m = -np.inf
    for j in range(n):
        m = max(m, scores[j])
    if sinks.shape[0]:
        m = max(m, sinks[h])
    total = 0.0
    for j in range(n):
        e = expf(max(scores[j] - m, _EXP_FLOOR))
        scores[j] = e
        total += e
    if sinks.shape[0]:  # the sink's share of the denominator: a key with no value
        total += expf(max(sinks[h] - m, _EXP_FLOOR))
    inv = np.float32(1.0 / total)
    for j in range(n):
        scores[j] *= inv
    for d in range(hd_v):
        out[t, h, d] = 0.0
    j = 0
    pos = start
    while pos <= p:
        b, lo = _block_of(table, paged, s, pos, size)
        hi = min(size, lo + p + 1 - pos)
        for r in range(lo, hi, MIX_KEYS):
            mix_values(v, scores, out, t, h, b, kvh, r, j + r - lo, min(MIX_KEYS, hi - r))
        j += hi - lo
        pos += hi - lo


@njit(cache=True, nogil=True, fastmath=_REDUCE)
def _attend_loops(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks, job):
    """`_attend` for heads whose dims are not whole vectors (or arrays not contiguous along them), as plain loops.

    Each block's rows are taken KEYS at a time from a row that is a multiple of KEYS (the rest one at a time): which
    keys are summed together depends on their positions alone where blocks hold a multiple of KEYS rows (a pool's
    blocks; a cache without a ring), so the paged and the contiguous cache give the same bits. Four keys a step
    share the loop's bookkeeping and q's loads, and for the values one load and store of the output row: 20.4 / 80.6
    us at 1 / 4 rows over 250 keys (SmolLM2's 9 heads, one thread), against 24.2 / 94.5 one key a step. Elements are
    indexed directly: a view of a row per key would cost reference counting."""
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
        r = lo
        while r < hi:
            if r % KEYS == 0 and r + KEYS <= hi:
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for d in range(hd):
                    x = q[t, h, d]
                    a0 += x * kv_f32(k[b, kvh, r, d])
                    a1 += x * kv_f32(k[b, kvh, r + 1, d])
                    a2 += x * kv_f32(k[b, kvh, r + 2, d])
                    a3 += x * kv_f32(k[b, kvh, r + 3, d])
                scores[j], scores[j + 1], scores[j + 2], scores[j + 3] = a0 * sc, a1 * sc, a2 * sc, a3 * sc
                step = KEYS
            else:
                a0 = np.float32(0.0)
                for d in range(hd):
                    a0 += q[t, h, d] * kv_f32(k[b, kvh, r, d])
                scores[j] = a0 * sc
                step = 1
            for i in range(j, j + step):
                if softcap > 0:
                    scores[i] = softcap * np.float32(math.tanh(scores[i] / softcap))
                m = max(m, scores[i])
            j += step
            r += step
        pos += hi - lo
    if sinks.shape[0]:
        m = max(m, sinks[h])
    total = 0.0
    for j in range(n):
        e = expf(max(scores[j] - m, _EXP_FLOOR))
        scores[j] = e
        total += e
    if sinks.shape[0]:  # the sink's share of the denominator: a key with no value
        total += expf(max(sinks[h] - m, _EXP_FLOOR))
    inv = np.float32(1.0 / total)
    for d in range(hd_v):
        out[t, h, d] = 0.0
    j = 0
    pos = start
    while pos <= p:
        b, lo = _block_of(table, paged, s, pos, size)
        hi = min(size, lo + p + 1 - pos)
        r = lo
        while r < hi:
            if r % KEYS == 0 and r + KEYS <= hi:
                w0, w1, w2, w3 = scores[j] * inv, scores[j + 1] * inv, scores[j + 2] * inv, scores[j + 3] * inv
                for d in range(hd_v):
                    out[t, h, d] += (w0 * kv_f32(v[b, kvh, r, d]) + w1 * kv_f32(v[b, kvh, r + 1, d])) + (
                        w2 * kv_f32(v[b, kvh, r + 2, d]) + w3 * kv_f32(v[b, kvh, r + 3, d])
                    )
                step = KEYS
            else:
                w0 = scores[j] * inv
                for d in range(hd_v):
                    out[t, h, d] += w0 * kv_f32(v[b, kvh, r, d])
                step = 1
            j += step
            r += step
        pos += hi - lo


@njit(cache=True, nogil=True, parallel=True)
def _parallel(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks):
    for job in prange(q.shape[0] * q.shape[1]):
        _attend(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks, job)
    return out


@njit(cache=True, nogil=True)
def _serial(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks):
    for job in range(q.shape[0] * q.shape[1]):
        _attend(q, k, v, table, paged, positions, slots, window, scale, softcap, out, sinks, job)
    return out


def softmax_causal(sc, scale: float, softcap: float, positions, k0: int, window: int, sinks=None) -> None:
    """In place over a prompt piece's raw scores: sc (group, m, n_keys) f32, sc[g, i, j] = q . k of query row i
    (at positions[i]) and the key at position k0 + j -> that row's softmax over the keys it sees (k0 + j
    <= positions[i], and within `window` when positive) of the scaled (and softcapped) scores; 0 for the others.
    sinks (group,) f32: head g's sink logit joins its rows' maximum and denominator (see `run`)."""
    softcap = np.float32(softcap)
    if not softcap >= 0:
        raise KernelArgumentError(f"softcap must be 0 (off) or positive, got {softcap}")
    group, m, n = sc.shape
    if len(positions) != m or m == 0 or positions.min() < k0 or positions.max() - k0 >= n:
        raise KernelArgumentError(
            f"positions {positions.min(initial=0)}..{positions.max(initial=0)} (of {len(positions)})"
            f" do not fit scores {sc.shape} from key {k0}"
        )
    _softmax_causal(sc, np.float32(scale), softcap, positions, k0, window, check_sinks(sinks, group))


# Written so that each loop vectorizes, over a buffer of whole 64-key blocks padded with -inf: LLVM runs the
# remainder of a vectorized loop scalar, and a row's remainder (up to 63 keys) ran expf one key at a time; the
# maximum as 16 running lanes (a max reduction over one accumulator stayed scalar). It is faster than the numpy
# expressions it replaced (docs/measurements.md).
@njit(cache=True, nogil=True, error_model="numpy", fastmath=_REDUCE)
def _softmax_causal(sc, scale, softcap, positions, k0, window, sinks):
    group, m, n = sc.shape
    buf = np.empty((n + 63) // 64 * 64, np.float32)  # (n_keys rounded up to 64,) one row's visible scores
    lanes = np.empty(16, np.float32)  # (16,) running maxima
    for g in range(group):
        for i in range(m):
            row = sc[g, i]  # (n_keys,)
            hi = positions[i] - k0 + 1  # keys lo..hi-1 are visible
            lo = 0
            if window > 0:
                lo = max(0, hi - window)
            seen = hi - lo
            padded = (seen + 63) // 64 * 64
            keys = row[lo:hi]  # (seen,) views: loops from 0 index them without Numba's negative-index fix-up
            pad = buf[seen:padded]  # (padded - seen,)
            if softcap > 0:
                for j in range(seen):
                    buf[j] = softcap * tanhf(keys[j] * scale / softcap)
            else:
                for j in range(seen):
                    buf[j] = keys[j] * scale
            for j in range(len(pad)):
                pad[j] = -np.inf
            for u in range(16):
                lanes[u] = buf[u]
            for j in range(16, padded, 16):
                for u in range(16):
                    v = buf[j + u]
                    lanes[u] = v if v > lanes[u] else lanes[u]
            top = lanes[0]
            for u in range(1, 16):
                top = lanes[u] if lanes[u] > top else top
            if sinks.shape[0]:
                top = max(top, sinks[g])
            total = np.float32(0.0)
            for j in range(padded):
                e = expf(max(buf[j] - top, _EXP_FLOOR))
                buf[j] = e
                total += e
            if sinks.shape[0]:  # the sink's share of the denominator: a key with no value
                total += expf(max(sinks[g] - top, _EXP_FLOOR))
            inv = np.float32(1.0) / total
            before, after = row[:lo], row[hi:]
            for j in range(len(before)):
                before[j] = 0.0
            for j in range(seen):
                keys[j] = buf[j] * inv
            for j in range(len(after)):
                after[j] = 0.0
