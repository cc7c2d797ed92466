"""When the paged KV pool runs dry: preempt the newest running sequence, resume it when blocks free up.

Before a step's forwards take their blocks (`KVCache.prepare`), `make_room` counts the blocks the planned rows
need; cached prefixes are evicted first (LRU, by the pool itself), and while that is not enough the most recently
admitted running sequence is preempted: its blocks go back to the pool as a cached prefix (a later resume reuses
whatever of them was not evicted meanwhile), it keeps its slot, state "waiting", and emits nothing. The oldest
sequence is never preempted for a younger one and the pool holds at least one full context, so the oldest always
advances: no deadlock, and no sequence is ever truncated or sees another's keys.

`resume_waiting` (each step, oldest first) puts a waiting sequence back once the pool can give it the blocks of
its whole history plus one block of growth per running sequence: it reuses its longest exact cached prefix, then
evaluates the rest of its prompt in the same chunks as before and replays its decoded tokens in runs of at most
`max_run` rows, the per-row numerics its decode steps had (localrt.engine.batch: batch invariance), so its keys,
and the tokens it goes on to produce, are bit for bit those of a run that was never preempted.

`park` does the same for fairness (localrt.runtime.fairness: a client over its share of the slots while another
waits) and frees the slot as well; `unpark` gives the sequence a free slot again, still waiting, and
`resume_waiting` puts it back as above (its prefix reused from the pool, the rest replayed): a slot's number never
changes a sequence's numerics. A sequence drafting with a draft model is not parked: that model's cache of its
positions is bound to its slot.
"""

from __future__ import annotations

PREFILL, DECODE, WAITING = "prefill", "decode", "waiting"


def _need(cache, seq, end: int) -> int:
    return cache.blocks_needed(seq.slot, min(end, cache.n_ctx))


def chunk_end(seq, max_run: int) -> int:
    """Where seq's next prefill (or replay) forward ends."""
    from .backends.pieces import prefill_end

    if seq.progress.computed < len(seq.prompt):
        return prefill_end(seq.progress.computed, len(seq.prompt), seq.num_batch)
    return min(seq.progress.known, seq.progress.computed + max_run)


def make_room(batcher, groups, prefilling):
    """(groups, prefilling) for this step, less the sequences preempted so that the pool can hold their rows.
    `prefilling`: the sequences whose next prompt chunk the step evaluates (Batcher._prefilling)."""
    cache = batcher.model.cache
    while True:
        need = sum(_need(cache, s, len(s.history) + len(draft)) for group in groups for s, _, draft in group)
        need += sum(_need(cache, s, chunk_end(s, batcher.max_run)) for s in prefilling)
        if need <= cache.pool.available():
            return groups, prefilling
        running = [s for s in batcher._held.values() if s.state in (PREFILL, DECODE)]
        if len(running) <= 1:  # cannot happen (the pool holds a full context); never preempt the last one
            return groups, prefilling
        victim = running[-1]
        preempt(batcher, victim)
        groups = [g for g in ([row for row in group if row[0] is not victim] for group in groups) if g]
        if victim in prefilling:
            prefilling = batcher._prefilling()


def preempt(batcher, seq) -> None:
    """seq gives back its blocks (kept as a cached prefix) and waits; it keeps its slot and its sampler state."""
    cache = batcher.model.cache
    if seq.progress.pending is not None:
        seq.progress.pending = None  # it is history[-1]: decoded again after the replay
        seq.progress.known = len(seq.history) - 1
    cache.retire(seq.slot, seq.history, seq.pieces, seq.cache_scope)
    seq.state = WAITING
    seq.preemptions += 1


def resume_waiting(batcher) -> None:
    """Put waiting sequences back, oldest first, while the pool can hold each one's history."""
    cache = batcher.model.cache
    for seq in list(batcher._held.values()):
        if seq.state != WAITING:
            continue
        running = sum(s.state in (PREFILL, DECODE) for s in batcher._held.values())
        blocks = -(-max(seq.progress.known, 1) // cache.block_size)
        if cache.pool.available() < blocks + running:
            return  # first come, first served: a younger waiting sequence does not go first
        target = seq.history if seq.prefilled else seq.prompt
        seq.progress.computed = batcher._reuse(seq.slot, seq, target)
        seq.state = PREFILL
        if seq.progress.computed >= seq.progress.known:  # every position but the pending token's was still cached
            seq.state, seq.progress.pending = DECODE, seq.history[-1]


def parkable(seq) -> bool:
    """Whether seq may leave its slot (`park`): not one whose draft model holds its positions in that slot."""
    return not seq.finished and (seq.draft is None or seq.draft.source is None)


def park(batcher, seq) -> None:
    """seq gives back its blocks (as `preempt`) and its slot; it keeps its sampler state, emits nothing, and is
    out of the batcher until `unpark`."""
    if seq.state != WAITING:
        preempt(batcher, seq)
    batcher._release(seq)  # the slot is free for another sequence; its blocks are already a cached prefix
    seq.slot = -1


def unpark(batcher, seq) -> None:
    """A parked seq takes a free slot again, waiting: `resume_waiting` puts it back when the pool has room."""
    seq.slot = batcher._pick_slot(seq)
    batcher._held[seq.slot] = seq
