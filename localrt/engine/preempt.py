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


def fits(slots, groups, prefilling) -> bool:
    """Whether the pool can give the blocks of this step's rows: each decode row with its draft (speculative.Row)
    and each of `prefilling`'s next chunk."""
    cache = slots.cache
    need = sum(_need(cache, r.seq, len(r.seq.history) + max(len(r.draft), r.propose)) for g in groups for r in g)
    need += sum(_need(cache, s, chunk_end(s, slots.max_run)) for s in prefilling)
    return need <= cache.pool.available()


def make_room(slots, groups, prefilling):
    """(groups, prefilling, preempted) for this step: the newest running sequences preempted, newest first, until
    the pool can hold the rows of the others. `prefilling`: the sequences whose next prompt chunk the step
    evaluates (Slots.prefilling)."""
    preempted = []
    while not fits(slots, groups, prefilling):
        running = slots.running()
        if len(running) <= 1:  # cannot happen (the pool holds a full context); never preempt the last one
            break
        victim = running[-1]
        preempt(slots, victim)
        preempted.append(victim)
        groups = [g for g in ([row for row in group if row.seq is not victim] for group in groups) if g]
        if victim in prefilling:
            prefilling = slots.prefilling()
    return groups, prefilling, preempted


def preempt(slots, seq) -> None:
    """seq gives back its blocks (kept as a cached prefix) and waits; it keeps its slot and its sampler state."""
    if seq.progress.pending is not None:
        seq.progress.pending = None  # it is history[-1]: decoded again after the replay
        seq.progress.known = len(seq.history) - 1
    slots.cache.retire(seq.slot, seq.history, seq.pieces, seq.cache_scope)
    seq.state = WAITING
    seq.preemptions += 1


def resume_waiting(slots) -> list:
    """Put waiting sequences back, oldest first, while the pool can hold each one's history; the ones put back."""
    cache, out = slots.cache, []
    for seq in list(slots.held.values()):
        if seq.state != WAITING:
            continue
        blocks = -(-max(seq.progress.known, 1) // cache.block_size)
        if cache.pool.available() < blocks + len(slots.running()):
            break  # first come, first served: a younger waiting sequence does not go first
        resume(slots, seq)
        out.append(seq)
    return out


def resume(slots, seq) -> None:
    """A waiting seq takes its longest cached prefix back and evaluates the rest of its history from there."""
    target = seq.history if seq.prefilled else seq.prompt
    seq.progress.computed = slots.reuse(seq.slot, seq, target)
    seq.state = PREFILL
    if seq.progress.computed >= seq.progress.known:  # every position but the pending token's was still cached
        seq.state, seq.progress.pending = DECODE, seq.history[-1]


def parkable(seq) -> bool:
    """Whether seq may leave its slot (`park`): not one whose draft model holds its positions in that slot."""
    return not seq.finished and (seq.draft is None or seq.draft.source is None)


def park(slots, seq) -> None:
    """seq gives back its blocks (as `preempt`) and its slot; it keeps its sampler state, emits nothing, and is
    out of the batcher until `unpark`."""
    if seq.state != WAITING:
        preempt(slots, seq)
    slots.release(seq)  # the slot is free for another sequence; its blocks are already a cached prefix
    seq.slot = -1


def unpark(slots, seq) -> None:
    """A parked seq takes a free slot again, waiting: `resume_waiting` puts it back when the pool has room."""
    seq.slot = slots.pick(seq)
    slots.held[seq.slot] = seq
