"""The paged KV pool (localrt.engine.kv_pool, kv_cache): blocks, reference counts, LRU eviction, copy-on-write,
kernels that read through the block tables bit for bit as over a contiguous cache, shared prefix blocks, and
what happens when the pool runs dry (preemption: outputs unchanged)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from localrt import load_model
from localrt.config import load as load_config
from localrt.engine.backends.backend import CPUBackend, _block_attention
from localrt.engine.batch import Batcher
from localrt.engine.kv_cache import KVCache, pool_blocks
from localrt.engine.kv_pool import BlockPool, Entry
from localrt.errors import KVCacheFull
from localrt.runtime.loading import estimate_memory, kv_counts
from simd_kernels import ops, paged
from simd_kernels.checks import KernelArgumentError

from fixtures.decoders import small, write_model

# -- kernels over a paged pool equal the contiguous ones ---------------------------------------------


def _paged_copy(kc: np.ndarray, size: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """kc (n_slots, n_kv, cap, hd) laid out in a pool of shuffled blocks: (pool, table)."""
    n_slots, n_kv, cap, hd = kc.shape
    per = -(-cap // size)
    table = rng.permutation(n_slots * per + 5)[: n_slots * per].reshape(n_slots, per).astype(np.int32)
    pool = np.zeros((n_slots * per + 5, n_kv, size, hd), kc.dtype)  # (n_blocks, n_kv, B, hd)
    for s in range(n_slots):
        for i in range(per):
            lo, hi = i * size, min(cap, (i + 1) * size)
            pool[table[s, i], :, : hi - lo] = kc[s, :, lo:hi]
    return pool, table


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
@pytest.mark.parametrize("hd, window, softcap", [(32, 0, 0.0), (64, 24, 0.0), (48, 0, 30.0)])
def test_paged_attention_is_bit_identical_to_contiguous(dtype, hd, window, softcap):
    rng = np.random.default_rng(hd + window)
    n_slots, n_head, n_kv, cap, size = 4, 6, 2, 600, 64
    kc, vc = (rng.standard_normal((n_slots, n_kv, cap, hd)).astype(np.float32) for _ in range(2))
    if dtype == np.uint16:
        kc, vc = kc.astype(np.float16).view(np.uint16), vc.astype(np.float16).view(np.uint16)
    (kp, table), (vp, _) = (
        _paged_copy(kc, size, np.random.default_rng(1)),
        _paged_copy(vc, size, np.random.default_rng(1)),
    )
    # Decode rows from one key (serial kernel) to hundreds (threaded), several slots.
    positions = np.array([0, 3, 63, 64, 200, 450, 599, 130], np.int64)
    slots = np.array([0, 1, 2, 3, 0, 1, 2, 3], np.int64)
    q = rng.standard_normal((8, n_head, hd)).astype(np.float32)
    want, got = np.empty((8, n_head, hd), np.float32), np.empty((8, n_head, hd), np.float32)
    ops.attention(q, kc, vc, positions, slots, window, 0.17, want, softcap)
    paged.attention_paged(q, kp, vp, table, positions, slots, window, 0.17, got, softcap)
    assert np.array_equal(want, got)
    # A BLAS piece (consecutive positions of one slot) gathered from the blocks.
    pos = np.arange(256, 400, dtype=np.int64)
    qp = rng.standard_normal((len(pos), n_head, hd)).astype(np.float32)
    want, got = np.empty((len(pos), n_head, hd), np.float32), np.empty((len(pos), n_head, hd), np.float32)
    _block_attention(qp, kc, vc, pos, 2, window, 0.17, want, softcap)
    _block_attention(qp, kp, vp, pos, 2, window, 0.17, got, softcap, table)
    assert np.array_equal(want, got)
    # And the backend's dispatch: pieces and per-row rows of one prompt chunk.
    be = CPUBackend()
    pos = np.arange(200, 400, dtype=np.int64)
    qp = rng.standard_normal((len(pos), n_head, hd)).astype(np.float32)
    sl = np.full(len(pos), 1, np.int64)
    want, got = np.empty((len(pos), n_head, hd), np.float32), np.empty((len(pos), n_head, hd), np.float32)
    be.attention(qp, kc, vc, pos, sl, window, 0.17, want, softcap)
    be.attention(qp, kp, vp, pos, sl, window, 0.17, got, softcap, table=table)
    assert np.array_equal(want, got)


def test_paged_store_writes_each_row_at_its_block():
    rng = np.random.default_rng(0)
    pool_k, pool_v = np.zeros((6, 2, 4, 3), np.float32), np.zeros((6, 2, 4, 5), np.float32)
    table = np.array([[5, 2, -1], [0, -1, -1]], np.int32)
    k, v = rng.standard_normal((3, 2, 3)).astype(np.float32), rng.standard_normal((3, 2, 5)).astype(np.float32)
    paged.kv_store_paged(k, v, pool_k, pool_v, table, np.array([5, 1, 3]), np.array([0, 1, 0]))
    assert np.array_equal(pool_k[2, :, 1], k[0]) and np.array_equal(pool_v[0, :, 1], v[1])
    assert np.array_equal(pool_k[5, :, 3], k[2])
    with pytest.raises(KernelArgumentError):  # position 9 of slot 0 has no block
        paged.kv_store_paged(k[:1], v[:1], pool_k, pool_v, table, np.array([9]), np.array([0]))
    with pytest.raises(KernelArgumentError):
        paged.attention_paged(
            np.zeros((1, 2, 3), np.float32),
            pool_k,
            pool_k,
            table,
            np.array([4]),
            np.array([1]),
            0,
            1.0,
            np.zeros((1, 2, 3), np.float32),
        )


# -- the pool's bookkeeping --------------------------------------------------------------------------


def test_blocks_are_taken_shared_and_freed_by_reference_count():
    pool = BlockPool(4, 16)
    a, b = pool.take(0), pool.take(1)
    assert (a, b) == (0, 1) and pool.n_free == 2 and pool.n_in_use == 2
    pool.ref(a)
    assert pool.refs[a] == 2 and not pool.exclusive(a) and pool.exclusive(b)
    pool.unref(a)
    pool.unref(a)
    assert pool.n_free == 3 and a in pool.free
    with pytest.raises(RuntimeError):
        pool.unref(a)


def test_cached_blocks_are_evicted_lru_tail_first_and_cut_their_entries():
    pool = BlockPool(4, 2)
    old = Entry([1, 2, 3, 4], [], [pool.take(0), pool.take(1)])
    new = Entry([5, 6, 7], [], [pool.take(0), pool.take(1)])
    for e in (old, new):
        pool.add_entry(e)
        for b in e.blocks:
            pool.unref(b)  # the sequence left: cached, held only by its entry
    assert pool.n_free == 0 and pool.n_cached == 4 and pool.available() == 4
    assert pool.take(0) == 1  # old's last block goes first
    assert old.blocks == [0] and old.tokens == [1, 2] and pool.evictions == 1
    assert pool.take(1) == 0  # then old's first: old is gone
    assert pool.entries == [new]
    pool.touch(new)
    pool.take(0)
    assert new.blocks == [2] and new.tokens == [5, 6]
    pool.take(0)
    assert not pool.entries and pool.available() == 0
    with pytest.raises(KVCacheFull):
        pool.take(0)


def test_an_entry_a_longer_one_covers_block_for_block_is_dropped():
    pool = BlockPool(4, 2)
    short = Entry([1, 2], [], [pool.take(0)])
    pool.add_entry(short)
    pool.add_entry(Entry([1, 2, 3], [], [short.blocks[0], pool.take(1)]))
    assert len(pool.entries) == 1 and pool.entries[0].tokens == [1, 2, 3] and pool.holds[0] == 1


def test_entries_cut_back_to_what_another_one_holds_are_dropped():
    """1000 requests with one system prompt leave few entries: once their own tails are evicted, what is left of
    each is what another entry holds."""
    pool = BlockPool(6, 2)
    system = [pool.take(0)]
    pool.add_entry(Entry([1, 2], [], list(system)))
    pool.unref(system[0])
    for tail in range(1, 6):
        b = pool.take(1)
        pool.ref(system[0])
        pool.add_entry(Entry([1, 2, tail, tail], [], [system[0], b]))
        pool.unref(system[0])
        pool.unref(b)
    assert len(pool.entries) == 5  # the bare system prompt entry was covered by the first with a tail
    for _ in range(5):
        pool.take(1)  # evicts the tails, oldest first
    assert len(pool.entries) == 1 and pool.entries[0].blocks == system and pool.holds[system[0]] == 1


def _cache(**kw) -> KVCache:
    return KVCache(2, 1, 4, 4, 16, n_slots=3, n_batch=16, kv_type="f32", block_size=4, **kw)


def _write(cache, slot, n, value):
    """Positions lengths..n-1 of slot written with `value` in every paged layer, as a forward would."""
    pos = np.arange(int(cache.lengths[slot]), n)
    slots = np.full(len(pos), slot)
    cache.check_batch(pos, slots)
    cache.prepare(pos, slots)
    k = np.full((len(pos), 1, 4), value, np.float32)
    for il in range(2):
        paged.kv_store_paged(k, k, cache.k[il], cache.v[il], cache.tables, pos, slots)
    cache.advance(pos, slots)


def test_sequences_take_blocks_as_they_grow_share_prefixes_and_copy_on_write():
    cache = _cache(n_blocks=8)
    assert cache.k[0].shape == (8, 1, 4, 4) and cache.pool.n_blocks == 8
    assert cache.blocks_needed(0, 6) == 2
    _write(cache, 0, 6, 1.0)
    first = cache.blocks_of(0)
    assert len(first) == 2 and cache.pool.n_in_use == 2
    cache.share(1, first, 6)  # a second sequence with the same 6-position prefix: by reference
    assert cache.blocks_of(1) == first and list(cache.pool.refs[first]) == [2, 2]
    assert cache.blocks_needed(1, 7) == 0  # position 6 is block 1's frontier: appended in place
    _write(cache, 1, 7, 2.0)
    assert cache.blocks_of(1) == first and cache.pool.fill[first[1]] == 3
    assert cache.blocks_needed(0, 7) == 1  # the first now writes below the frontier: its block 1 is copied first
    _write(cache, 0, 7, 3.0)
    mine = cache.blocks_of(0)
    assert mine[0] == first[0] and mine[1] != first[1]
    assert cache.k[0][mine[1], 0, 1, 0] == 1.0 and cache.k[0][mine[1], 0, 2, 0] == 3.0  # copied, then written
    assert cache.k[0][first[1], 0, 2, 0] == 2.0  # the second sequence's block is untouched
    entry = cache.retire(1, list(range(7)), [])
    assert entry.blocks == first and cache.pool.refs[first[0]] == 1 and cache.pool.refs[first[1]] == 0
    assert cache.pool.n_cached == 1 and cache.lengths[1] == 0
    cache.trim(0, 3)  # back to 3 positions: its own block 1 goes back to the free list
    assert cache.blocks_of(0) == [first[0]] and cache.pool.n_in_use == 1
    cache.clear(0)
    assert cache.pool.n_in_use == 0 and cache.pool.n_cached == 2


def test_forget_prefixes_drops_the_cached_ones_and_keeps_what_runs():
    cache = _cache(n_blocks=8)
    _write(cache, 0, 6, 1.0)
    cache.share(1, cache.blocks_of(0), 6)
    _write(cache, 1, 7, 2.0)
    cache.retire(1, list(range(7)), [])
    _write(cache, 2, 3, 3.0)
    cache.retire(2, [9, 9, 9], [])
    assert len(cache.prefixes()) == 2 and cache.pool.n_cached == 1  # slot 0 holds the first entry's blocks
    running = cache.blocks_of(0)
    cache.forget_prefixes()
    assert cache.prefixes() == [] and cache.pool.n_cached == 0
    assert cache.blocks_of(0) == running and list(cache.pool.refs[running]) == [1, 1]  # slot 0 still holds its own
    assert cache.pool.n_in_use == 2 and cache.pool.n_free == 6


def test_two_sequences_appending_at_one_shared_frontier_in_one_batch_each_get_their_own():
    cache = _cache(n_blocks=8)
    _write(cache, 0, 6, 1.0)
    entry = cache.retire(0, list(range(6)), [])
    cache.share(1, entry.blocks, 6)
    cache.share(2, entry.blocks, 6)
    pos, slots = np.array([6, 6]), np.array([1, 2])
    cache.check_batch(pos, slots)
    cache.prepare(pos, slots)
    k = np.array([2.0, 3.0], np.float32)[:, None, None] * np.ones((2, 1, 4), np.float32)
    for il in range(2):
        paged.kv_store_paged(k, k, cache.k[il], cache.v[il], cache.tables, pos, slots)
    cache.advance(pos, slots)
    one, two = cache.blocks_of(1), cache.blocks_of(2)
    assert one == entry.blocks and two[1] != one[1]  # the first appends in place, the second copies
    assert cache.k[0][one[1], 0, 2, 0] == 2.0 and cache.k[0][two[1], 0, 2, 0] == 3.0
    assert cache.k[0][two[1], 0, 1, 0] == 1.0  # the shared rows came along


def test_a_lone_sequence_takes_over_a_block_shared_only_with_a_cached_prefix():
    cache = _cache(n_blocks=4)  # exactly one context: 16 positions
    _write(cache, 0, 14, 1.0)
    entry = cache.retire(0, list(range(14)), [])
    cache.share(0, entry.blocks, 13)  # then position 13 is written again, below block 3's frontier
    _write(cache, 0, 16, 3.0)  # no free block to copy block 3 into: the cached prefix gives it up
    assert entry.tokens == list(range(12)) and cache.pool.n_free == 0 and cache.pool.exclusive(cache.blocks_of(0)[3])


def test_match_prefix_finds_the_longest_exact_prefix_of_cached_and_running_sequences():
    """Prefix matching needs no weights: ids, BLAS pieces and blocks decide what a new prompt reuses."""
    cache = _cache(n_blocks=8)
    _write(cache, 0, 10, 1.0)
    cached = cache.retire(0, list(range(10)), [])
    _write(cache, 1, 7, 2.0)
    running = cache.running_prefix(1, [0, 1, 2, 3, 90, 91, 92, 93], [])  # 7 of its 8 ids computed
    assert running.tokens == [0, 1, 2, 3, 90, 91, 92] and running.entry is None
    sources = cache.prefixes([running])
    assert [s.entry for s in sources] == [cached, None]
    target = list(range(8)) + [50]
    assert cache.match_prefix(target, [], sources) == (8, sources[0])  # the cached prefix agrees on 8 ids
    assert cache.match_prefix([0, 1, 2, 3, 90, 91, 5], [], sources) == (6, running)
    assert cache.match_prefix(list(range(10)), [], sources)[0] == 9  # the last position is always evaluated
    assert cache.match_prefix(target, [], sources, reuse_min=9) == (0, None)
    # a prompt whose first 8 positions are one BLAS piece reuses them only from a cache that computed them so
    assert cache.match_prefix(target, [(0, 8)], sources) == (0, None)
    cache.take_prefix(2, sources[0], 8)
    assert cache.lengths[2] == 8 and cache.blocks_of(2) == cached.blocks[:2]


def test_the_budget_sets_the_pool():
    assert pool_blocks(4096, 4) == 4 * 64 and pool_blocks(4096, 4, 1000) == 64  # never below one context
    assert pool_blocks(4096, 4, 6400) == 100 and pool_blocks(100, 2) == 4
    assert load_config({"LOCALRT_KV_BUDGET": "8192"}).kv_budget == 8192 and load_config({}).kv_budget == 0
    assert load_config({"LOCALRT_KV_BUDGET": "2GiB"}).kv_budget_bytes == 2 << 30
    assert load_config({"LOCALRT_KV_BUDGET": "1.5 GB"}).kv_budget_bytes == 1_500_000_000
    for bad in ("-1", "12 parsecs", "GiB", "1e999GB", "nanMB"):
        with pytest.raises(ValueError, match="LOCALRT_KV_BUDGET"):
            load_config({"LOCALRT_KV_BUDGET": bad})


# -- on a tiny model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool") / "tiny.gguf"
    write_model(path, small(seed=5, wtype=8))
    return path


def test_the_loader_honours_the_budget_and_the_estimate_counts_it(tiny_path):
    model = load_model(tiny_path, num_ctx=256, num_batch=32, n_slots=4, kv_budget=384)
    assert model.cache.pool.n_blocks == 6
    one = estimate_memory(tiny_path, 256, 32, 4, 384)
    two = estimate_memory(tiny_path, 256, 32, 4, 384 + 64)
    assert two.private - one.private == model.cache.nbytes // 6  # one block more
    per_block = model.cache.block_bytes  # 2 layers x 2 KV heads x (16 + 16) x f16 x 64 positions
    assert per_block == 2 * 2 * 32 * 2 * 64
    by_bytes = load_model(tiny_path, num_ctx=256, num_batch=32, n_slots=4, kv_budget_bytes=6 * per_block + 100)
    assert by_bytes.cache.pool.n_blocks == 6 and by_bytes.cache.nbytes == model.cache.nbytes
    assert estimate_memory(tiny_path, 256, 32, 4, kv_budget_bytes=6 * per_block).private == one.private
    counts = kv_counts(model.cache)
    assert counts["kv_cache_bytes"] == model.cache.nbytes and counts["kv_blocks"] == 6
    assert counts["kv_cache_used_bytes"] == 0 and counts["kv_blocks_in_use"] == 0


def _run_all(model, requests, budget_check=None):
    """Events of each (ids, options) stepped together through one Batcher; the Batcher."""
    b = Batcher(model)
    events = {}
    seqs = [b.add(ids, opts, logprobs=2) for ids, opts in requests]
    while b.sequences:
        for seq, evs in b.step():
            events.setdefault(id(seq), []).extend(evs)
        if budget_check is not None:
            budget_check(model.cache)
    return [events.get(id(s), []) for s in seqs], seqs


def test_a_shared_system_prompt_is_referenced_not_copied(tiny_path):
    model = load_model(tiny_path, num_ctx=256, num_batch=64, n_slots=2)
    system = list(range(40, 140))  # 100 positions: a BLAS piece 0..63 (attention gathered from blocks), per-row after
    a, b = system + [7, 8, 9], system + [10, 11]
    model.cache.forget_prefixes()
    alone = list(model.generate(b, {"temperature": 0, "num_predict": 12}, logprobs=2))
    model.cache.forget_prefixes()
    batcher = Batcher(model)
    first = batcher.add(a, {"temperature": 0, "num_predict": 30})
    while first.state != "decode":
        batcher.step()
    held = model.cache.blocks_of(first.slot)
    second = batcher.add(b, {"temperature": 0, "num_predict": 12}, logprobs=2)
    assert second.n_cached == 100
    mine = model.cache.blocks_of(second.slot)
    assert mine == held[:2]  # positions 0..99 are in the first's blocks 0 and 1: referenced
    assert list(model.cache.pool.refs[mine]) == [2, 2]
    got = []
    while not second.finished:
        got += [e for s, evs in batcher.step() if s is second for e in evs]
    assert model.cache.blocks_of(first.slot)[:2] == held[:2]  # the first kept its blocks
    assert model.cache.pool.refs[held[0]] == 1
    assert got[:-1] == alone[:-1] and got[-1].context == alone[-1].context  # tokens and logprobs, bit for bit
    assert got[-1].prompt_cached_count == 100 and got[-1].prompt_eval_count == len(b)
    batcher.close()
    assert model.cache.pool.n_in_use == 0 and model.cache.pool.n_cached > 0  # finished: cached, not freed


def test_a_step_is_planned_without_running_the_model(tiny_path):
    model = load_model(tiny_path, num_ctx=256, num_batch=64, n_slots=3)
    batcher = Batcher(model)
    gone = threading.Event()
    a = batcher.add([60, 70, 71] * 5, {"num_predict": 4, "temperature": 0})
    b = batcher.add([61, 70, 71] * 5, {"num_predict": 4, "temperature": 0}, cancelled=gone)
    gone.set()

    def no_forward(*args, **kwargs):
        raise AssertionError("planning ran the model")

    model.forward = no_forward
    plan = batcher.plan()
    del model.forward  # the method again
    assert plan.cancelled == [b] and plan.prefill == [(a, 0, 15)] and plan.decode == [] and not plan.preempted
    assert b.state == "prefill" and batcher.free_slots == 1  # planning changed nothing
    out = batcher.execute(plan)
    assert b.state == "cancelled" and batcher.free_slots == 2
    assert out[0] == (b, []) and out[1][0] is a and a.progress.pending == out[1][1][0].token
    plan = batcher.plan()
    assert [[row[0] for row in group] for group in plan.decode] == [[a]] and plan.prefill == []
    batcher.close()


def test_when_the_pool_runs_dry_the_newest_waits_and_every_output_is_unchanged(tiny_path):
    """Three sequences whose contexts need 9 blocks share a pool of 4: the newest are preempted and resumed, and
    each gives token for token (sampled with a seed too) what it gives alone, with bit-equal logprobs (the 64-token
    prompt is a BLAS piece, its decoded tokens per-row: a replay on the wrong path would show); the pool never
    holds more."""
    model = load_model(tiny_path, num_ctx=256, num_batch=64, n_slots=3, kv_budget=256)
    sampled = {"temperature": 1.5, "top_k": 3, "seed": 7}
    requests = [
        ([60 + i, 70, 71, 72] * (10 + 3 * i), {"num_predict": 120, "temperature": 0, **opts})
        for i, opts in enumerate([{}, sampled, {}])
    ]
    for ids, opts in requests:
        opts["temperature"] = opts.get("temperature", 0)
    alone = []
    for ids, opts in requests:
        model.cache.forget_prefixes()
        alone.append(list(model.generate(ids, opts, logprobs=2)))
    model.cache.forget_prefixes()

    def within(cache):
        assert cache.pool.n_in_use <= cache.pool.n_blocks == 4

    got, seqs = _run_all(model, requests, within)
    assert sum(s.preemptions for s in seqs) > 0 and seqs[0].preemptions == 0  # the oldest never waits
    for want, have in zip(alone, got):
        assert [e.token for e in have[:-1]] == [e.token for e in want[:-1]]
        assert have[:-1] == want[:-1]
        assert have[-1].eval_count == want[-1].eval_count and have[-1].done_reason == want[-1].done_reason


def test_sliding_window_rings_stay_per_slot(tmp_path):
    """gemma3: rings per slot, full layers in the pool; a prefix copied from another slot's running sequence is
    exact (its rings are copied, its blocks referenced)."""
    path = tmp_path / "g.gguf"
    write_model(path, small(arch="gemma3", n_layer=6, window=8, seed=2, wtype=8))  # layer 5 full
    model = load_model(path, num_ctx=128, num_batch=16, n_slots=2)
    cache = model.cache
    assert cache.slot_bound and any(cache.paged) and not all(cache.paged)
    assert cache.table_of(cache.paged.index(False)) is None
    prompt = list(range(3, 40))
    model.cache.forget_prefixes()
    alone = list(model.generate(prompt + [5, 6], {"temperature": 0, "num_predict": 8}))
    model.cache.forget_prefixes()
    b = Batcher(model)
    first = b.add(prompt + [9], {"temperature": 0, "num_predict": 20})
    while first.state != "decode":
        b.step()
    second = b.add(prompt + [5, 6], {"temperature": 0, "num_predict": 8})
    assert second.n_cached == len(prompt) and second.slot != first.slot
    got = []
    while not second.finished:
        got += [e for s, evs in b.step() if s is second for e in evs]
    assert got[:-1] == alone[:-1] and got[-1].context == alone[-1].context
