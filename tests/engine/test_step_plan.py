"""Issue 43, part 3: a Batcher's step planned and run with no weights. A stub model keeps only the KV cache's
bookkeeping in its forward (the blocks a batch's positions take, the lengths it advances) and answers with logits
whose greedy token is the input token plus one, so every sequence's output is known beforehand and the decisions
of `Batcher.plan` (who is dropped, who prefills, which decode rows run, who is preempted and resumed) are checked
on their own, in milliseconds."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from localrt.engine.batch import Batcher
from localrt.engine.kv_cache import KVCache

N_VOCAB = 64
GREEDY = {"temperature": 0, "draft_num_predict": 0}


class WeightlessModel:
    """What a Batcher reads of a model, with a forward that computes nothing."""

    def __init__(self, n_ctx: int = 256, n_slots: int = 3, num_batch: int = 64, n_blocks: int = 0) -> None:
        self.cache = KVCache(1, 1, 2, 2, n_ctx, n_slots, n_batch=num_batch, kv_type="f32", n_blocks=n_blocks)
        self.backend = types.SimpleNamespace(invariant_rows=63, invariant_run=63)  # as the CPU's per-row bound
        self.weights = types.SimpleNamespace(devices=None, layers=[])
        self.config = types.SimpleNamespace(n_vocab=N_VOCAB)
        self.num_ctx, self.num_batch, self.tokenizer = n_ctx, num_batch, None
        self.forwards: list[tuple[list[int], list[int]]] = []  # (positions, slots) of each forward

    def _check_ids(self, ids) -> None:
        assert all(0 <= i < N_VOCAB for i in ids)

    def forward(self, batch, cache, output_rows=None) -> np.ndarray:
        cache.check_batch(batch.positions, batch.slots)
        cache.prepare(batch.positions, batch.slots)
        cache.advance(batch.positions, batch.slots)
        self.forwards.append((batch.positions.tolist(), batch.slots.tolist()))
        rows = batch.tokens if output_rows is None else batch.tokens[np.asarray(output_rows)]
        logits = np.zeros((len(rows), N_VOCAB), np.float32)  # (rows, n_vocab)
        logits[np.arange(len(rows)), (rows + 1) % N_VOCAB] = 1.0
        return logits


def _expected(prompt: list[int], n: int) -> list[int]:
    return [(prompt[-1] + 1 + i) % N_VOCAB for i in range(n)]


def _run(batcher: Batcher, seqs) -> tuple[dict, list]:
    """Step until every sequence finished: each one's tokens, and every step's plan."""
    got, plans = {id(s): [] for s in seqs}, []
    while not all(s.finished for s in seqs):
        plan = batcher.plan()
        plans.append(plan)
        for seq, events in batcher.execute(plan):
            got[id(seq)] += [e.token for e in events if hasattr(e, "token")]
    return got, plans


def test_planning_runs_no_forward_and_drops_the_cancelled():
    model = WeightlessModel()
    batcher = Batcher(model)
    gone = threading.Event()
    a = batcher.add(list(range(1, 11)), {**GREEDY, "num_predict": 3})
    b = batcher.add(list(range(2, 12)), {**GREEDY, "num_predict": 3}, cancelled=gone)
    gone.set()
    plan = batcher.plan()
    assert model.forwards == []
    assert plan.cancelled == [b] and plan.prefill == [(a, 0, 10)] and plan.decode == []
    assert b.state == "prefill" and batcher.free_slots == 1  # planning changed nothing
    out = batcher.execute(plan)
    assert out[0] == (b, []) and model.forwards == [(list(range(10)), [a.slot] * 10)]  # the plan's one chunk
    assert b.state == "cancelled" and batcher.free_slots == 2


def test_the_oldest_prompt_goes_first_and_a_short_younger_one_does_not_pass_it():
    model = WeightlessModel(num_batch=64)
    batcher = Batcher(model)
    long = batcher.add([5] * 200, {**GREEDY, "num_predict": 2})
    short = batcher.add([6] * 10, {**GREEDY, "num_predict": 2})
    prefills = []
    while short.state == "prefill":
        plan = batcher.plan()
        prefills.append([(c.seq is long and "long" or "short", c.end - c.start) for c in plan.prefill])
        batcher.execute(plan)
    # 64-row chunks of the long prompt (num_batch); the short one joins only where the rows stay within num_batch
    assert prefills[:3] == [[("long", 64)]] * 3 and prefills[3] == [("long", 8), ("short", 10)]


def test_decode_rows_of_every_running_sequence_share_one_forward():
    model = WeightlessModel()
    batcher = Batcher(model)
    seqs = [batcher.add([i] * 5, {**GREEDY, "num_predict": 4}) for i in (1, 2, 3)]
    got, plans = _run(batcher, seqs)
    decoding = [[row[0] for group in p.decode for row in group] for p in plans if p.decode]
    assert decoding[0] == seqs and len(plans[-1].decode) == 1  # all three in one group
    assert [got[id(s)] for s in seqs] == [_expected(s.prompt, 4) for s in seqs]


def test_when_the_pool_runs_dry_the_newest_waits_and_every_output_is_unchanged():
    model = WeightlessModel(n_ctx=128, n_slots=2, num_batch=64, n_blocks=2)  # the pool: one context, 2 blocks of 64
    batcher = Batcher(model)
    a = batcher.add([3] * 40, {**GREEDY, "num_predict": 60})
    b = batcher.add([4] * 40, {**GREEDY, "num_predict": 60})
    got, plans = _run(batcher, [a, b])
    preempted = [s for p in plans for s in p.preempted]
    resumed = [s for p in plans for s in p.resumed]
    assert preempted and set(preempted) == {b} and b in resumed  # the oldest never waits for a younger one
    assert a.preemptions == 0 and b.preemptions == len(preempted)
    assert got[id(a)] == _expected(a.prompt, 60) and got[id(b)] == _expected(b.prompt, 60)
    assert model.cache.pool.n_in_use == 0  # finished: every block back (cached or free)


def _state(batcher) -> tuple:
    """Everything a step may change: the pool's bookkeeping, the tables, and each sequence's place and progress."""
    cache, pool = batcher.model.cache, batcher.model.cache.pool
    arrays = tuple(a.tolist() for a in (pool.refs, pool.holds, pool.stamp, pool.fill, cache.tables, cache.lengths))
    entries = [(e.tokens[:], e.blocks[:], e.slot, e.stamp) for e in pool.entries]
    seqs = [(s.slot, s.state, vars(s.progress).copy(), s.preemptions) for s in batcher.sequences]
    return arrays, list(pool.free), entries, seqs


def test_a_plan_that_preempts_and_resumes_changes_nothing_and_is_what_runs():
    """Planning on a full pool decides preemptions and resumes on a copy of the slots: the cache and the sequences
    are as they were, planning again decides the same, and the forwards execute runs are the plan's rows."""
    model = WeightlessModel(n_ctx=128, n_slots=3, num_batch=64, n_blocks=2)
    batcher = Batcher(model)
    seqs = [batcher.add([3 + i] * 30, {**GREEDY, "num_predict": 50}) for i in range(3)]
    seen = {"preempted": 0, "resumed": 0}
    while not all(s.finished for s in seqs):
        before = _state(batcher)
        plan = batcher.plan()
        assert _state(batcher) == before and batcher.plan() == plan
        seen["preempted"] += len(plan.preempted)
        seen["resumed"] += len(plan.resumed)
        planned = [(p, c.seq.slot) for c in plan.prefill for p in range(c.start, c.end)]
        for r in (r for group in plan.decode for r in group):  # the pending token and the draft, after the history
            planned += [(len(r.seq.history) - 1 + j, r.seq.slot) for j in range(1 + len(r.draft))]
        ran = len(model.forwards)
        batcher.execute(plan)
        rows = sorted((p, s) for positions, slots in model.forwards[ran:] for p, s in zip(positions, slots))
        assert rows == sorted(planned)
    assert seen["preempted"] and seen["resumed"]
    assert all(s.history[len(s.prompt) :] == _expected(s.prompt, 50) for s in seqs)


def test_a_stale_plan_is_refused():
    model = WeightlessModel()
    batcher = Batcher(model)
    a = batcher.add([1] * 10, {**GREEDY, "num_predict": 3})
    plan = batcher.plan()
    batcher.execute(batcher.plan())  # the prompt ran: the first plan's chunk is no longer the next one
    with pytest.raises(RuntimeError, match="stale"):
        batcher.execute(plan)
    assert a.progress.computed == 10
