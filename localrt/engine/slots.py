"""A Batcher's slots: which sequence holds which KV slot, and the cache whose block tables they write.

The step is planned on a copy of this (`Slots.copy`: the cache's bookkeeping without its arrays, each held
sequence's progress copied) and executed on the real one, by the same functions (localrt.engine.preempt): the
plan cannot differ from what its execution does, and planning changes nothing.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from .preempt import DECODE, PREFILL, WAITING, chunk_end

CANCELLED = "cancelled"
# Prompt rows one step may evaluate beside its decode rows: the oldest prompt's next chunk always, and the chunks of
# the prompts admitted after it while their rows stay within this (and num_batch). Short prompts that arrive together
# (a team's requests after a meeting) then all start in the first step, as llama-server fills one batch with several
# slots' prompts, instead of one prompt per step; a decode step still waits for at most this many prompt rows (or
# one chunk of a longer prompt).
PREFILL_ROWS_PER_STEP = 256


class Slots:
    """slot -> its sequence (in the order they were added), over `cache`; `max_run`: the rows of one replay forward,
    `reuse_min`: the shortest cached prefix a prompt reuses."""

    def __init__(self, cache, n_slots: int, max_run: int, reuse_min: int) -> None:
        self.cache = cache
        self.n_slots = n_slots
        self.max_run = max_run
        self.reuse_min = reuse_min
        self.held: dict[int, object] = {}  # slot -> its Sequence
        self.last_used = [0] * n_slots  # slot -> step count when it was last released (least recently used first)
        self.steps = 0
        self._origin: dict[int, object] = {}  # id(a copy's sequence) -> the sequence it copies (a copy only)

    def copy(self) -> Slots:
        """A copy to plan on: changing it (releasing, preempting, resuming) changes neither the cache nor a sequence."""
        new = copy.copy(self)
        new.cache = self.cache.ledger()
        new.last_used = list(self.last_used)
        new.held, new._origin = {}, {}
        for slot, seq in self.held.items():
            twin = copy.copy(seq)  # shares the history and sampler, which planning only reads
            twin.progress = replace(seq.progress)
            new.held[slot] = twin
            new._origin[id(twin)] = self.origin(seq)
        return new

    def origin(self, seq):
        """The real sequence seq stands for (seq itself outside a copy)."""
        return self._origin.get(id(seq), seq)

    def mirror(self, seq):
        """This copy's stand-in for the real seq (seq itself outside a copy)."""
        twin = self.held.get(seq.slot)
        return twin if twin is not None and self.origin(twin) is seq else seq

    def running(self) -> list:
        return [s for s in self.held.values() if s.state in (PREFILL, DECODE)]

    def drop(self, seq) -> None:
        """seq is cancelled: dropped without a Done, its slot free again."""
        seq.state = CANCELLED
        self.release(seq)

    def release(self, seq) -> None:
        """Free seq's slot; its blocks stay cached with the ids whose keys they hold (for a later prompt's reuse)."""
        if self.held.get(seq.slot) is seq:
            del self.held[seq.slot]
            self.cache.retire(seq.slot, seq.history, seq.pieces, seq.cache_scope)
            self.last_used[seq.slot] = self.steps

    def prefixes(self, slot: int, scope: str):
        """What a sequence in slot may reuse: every cached prefix and every other running sequence's positions, of
        its scope."""
        running = [
            self.cache.running_prefix(s, held.history, held.pieces, held.cache_scope)
            for s, held in self.held.items()
            if s != slot and held.state != WAITING
        ]
        return self.cache.prefixes(running, scope)

    def pick(self, seq) -> int:
        """The free slot for seq: the one whose own arrays hold the longest prefix of its prompt, else the least
        recently used."""
        free = [s for s in range(self.n_slots) if s not in self.held]
        if not free:
            raise RuntimeError(f"all {self.n_slots} slots are busy")
        own = {}  # a slot-bound cache: the prefix each free slot's own arrays hold (no copy to reuse it)
        for source in self.prefixes(-1, seq.cache_scope):
            if source.slot in free and source.entry is not None:
                own[source.slot] = max(
                    own.get(source.slot, 0), self.cache.reusable(source, seq.prompt, seq.pieces, self.reuse_min)
                )
        return max(free, key=lambda s: (own.get(s, 0), -self.last_used[s]))

    def reuse(self, slot: int, seq, target: list[int]) -> int:
        """Give slot the longest exactly reusable prefix of target (seq's prompt, or its history after a preemption)
        from any cached prefix or running sequence (KVCache.match_prefix, take_prefix); the first position left to
        evaluate."""
        sources = self.prefixes(slot, seq.cache_scope)
        best, pick = self.cache.match_prefix(target, seq.pieces, sources, reuse_min=self.reuse_min, slot=slot)
        self.cache.take_prefix(slot, pick, best)
        return best

    def prefilling(self) -> list:
        """The sequences whose next prompt chunk (or replay run) this step evaluates, oldest first: the oldest always,
        the ones after it while the rows stay within PREFILL_ROWS_PER_STEP and num_batch."""
        out, rows = [], 0
        for seq in self.held.values():
            if seq.state != PREFILL:
                continue
            n = chunk_end(seq, self.max_run) - seq.progress.computed
            if out and rows + n > min(PREFILL_ROWS_PER_STEP, seq.num_batch):
                break  # first come, first served: a younger short prompt does not pass a longer one
            out.append(seq)
            rows += n
        return out
