"""Continuous batching: one step-driven generator of many sequences over one model, batch-invariant numerics.

A `Batcher` is owned by one thread (the model's worker). `add` validates a request and gives it a free KV
slot (the one whose cached tokens share the longest prefix with the prompt: KVCache.match_prefix). `step` is
`plan`, then `execute`: the plan (a StepPlan, decided without running the model or changing anything, as vLLM's
scheduler output) names the cancelled, resumed and preempted sequences, the decode rows with their drafts and the
prompt chunks: the next prefill chunk of the oldest prompt still being evaluated (and of younger ones while the step's
prompt rows stay within PREFILL_ROWS_PER_STEP). Where deciding means changing the slots (a release frees blocks, a
resume takes a cached prefix, a preemption gives blocks back) it is done on a copy of them (localrt.engine.slots),
by the functions that `execute` then runs on the real ones before it runs one forward per decode group and the
chunks' forwards, samples every sequence that got logits and returns each one's events. The plan needs no weights:
a model that keeps only the cache's bookkeeping shows its decisions (tests/engine/test_step_plan.py).
`generate()` is a Batcher of one sequence, so a request runs the same code alone or beside others. A decoding
sequence may carry a prompt-lookup draft in the step's forward (localrt.engine.speculative: rows for its pending
token and the drafted ones, sampled in order while the draws equal the draft, the cache trimmed after), several in
one step, or a draft from the draft model beside it, proposed as the step runs (localrt.engine.draft_model, whose own
cache follows the same way).

Batch invariance: a sequence's tokens do not depend on what else runs with it, nor on what was cached. A row takes
the BLAS path only inside a prompt chunk's pieces (`backends.pieces.blas_pieces`: the chunk cut at multiples of 256
positions, pieces of 64+ rows, each chunk a forward of its own); every other row (decode, drafts, a short piece)
goes through per-row kernels whose reduction order does not depend on the number of rows: the fused 8-bit
`simd_kernels.MUL` path (or `MULTI` for weights sharing an input, each row as MUL computes it; bit-identical per row
for any row count below the backend's `invariant_rows`, tests/engine/test_batch_engine.py checks it) and the per-(token,
head) attention kernel. Chunks end at multiples of num_batch positions, so a position's path depends only on the
prompt. Prefix reuse is exact: a cached position is reused only where it was computed on the path a fresh evaluation
of the new prompt takes (`backends.pieces.exact_reuse`), from any finished sequence's cached prefix or any running
sequence: its full KV blocks referenced, not copied (localrt.engine.kv_cache: a paged pool; a block is copied only
before a sequence writes below what another one wrote into it). When the pool runs dry the newest sequence waits and
is replayed exactly (localrt.engine.preempt).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..api.options import Options, resolve
from ..errors import ContextLengthExceeded, InvalidRequest
from .arch.common import Batch, layer_devices
from .backends.pieces import blas_pieces, prompt_pieces
from . import preempt
from .draft_model import attach, check_drafts, sync_prompt
from .events import Done, Token
from .logprobs import LogprobTracker
from .sampler import BiasedSampler, make_sampler
from .slots import PREFILL_ROWS_PER_STEP, Slots
from .speculative import DraftState, Row, Speculator, draft_limit, kept_positions, priors
from .stop import StopMatcher

__all__ = ["PREFILL_ROWS_PER_STEP", "Batcher", "Chunk", "Sequence", "StepPlan"]

PREFILL, DECODE, DONE, CANCELLED, WAITING = "prefill", "decode", "done", "cancelled", "waiting"
# A cached prefix shorter than this is evaluated again rather than reused (a chat template's common header is
# shorter): the least recently used slot then goes first, keeping the longer caches of the others. Reuse is
# exact, so this changes only speed.
REUSE_MIN_TOKENS = 16


@dataclass
class Progress:
    """How far a sequence's positions are computed: the one record the step, preemption and the draft model read
    and move (positions are indices into the sequence's history)."""

    computed: int = 0  # positions whose keys the cache holds: the next one evaluated (of the prompt; after a
    # preemption, of the history)
    known: int = 0  # evaluating ends here: the prompt, or after a preemption every token but the pending one
    pending: int | None = None  # the sampled token whose forward the next step runs (history[-1]), or None


class Sequence:
    """One request in a Batcher: its sampler, stop strings, constraint and progress.

    `state` is "prefill" (prompt chunks still to evaluate), "decode", "done" (its Done was returned),
    "cancelled" (dropped without Done; `prefilled` says whether its prompt had been evaluated) or "waiting"
    (preempted when the KV pool ran dry: it holds its slot but no blocks, and is evaluated again from its
    longest cached prefix when blocks free up: localrt.engine.preempt)."""

    def __init__(
        self,
        model,
        ids,
        options,
        constraint,
        cancelled,
        load_duration_ns: int,
        *,
        logprobs: int | None = None,
        logit_bias=None,
        cache_scope: str = "",
    ) -> None:
        self.t_start = time.perf_counter_ns()
        opts = options if isinstance(options, Options) else resolve(options)
        prompt = [int(i) for i in ids]
        n_ctx = model.num_ctx
        if isinstance(options, Options) or (options is not None and "num_ctx" in options):
            n_ctx = min(n_ctx, opts.num_ctx)  # a request may ask for less context than was loaded
        if not prompt:
            raise InvalidRequest("the prompt has no tokens")
        if len(prompt) > n_ctx:
            raise ContextLengthExceeded(len(prompt), n_ctx)
        model._check_ids(prompt)  # token ids in range
        sampler = make_sampler(opts)
        if constraint is not None:
            from ..structured import ConstrainedSampler

            sampler = ConstrainedSampler(sampler, constraint)
        if logit_bias:
            sampler = BiasedSampler(sampler, logit_bias, model.config.n_vocab)  # outermost: before a format's mask
        tok = model.tokenizer
        self.options = opts
        self.prompt = prompt
        self.history = list(prompt)  # prompt + generated ids
        self.n_ctx = n_ctx
        self.num_batch = min(opts.num_batch, model.num_batch)
        self.pieces = prompt_pieces(len(prompt), self.num_batch)  # prompt positions evaluated on the BLAS path
        self.cancelled: threading.Event | None = cancelled
        self.load_duration_ns = load_duration_ns
        self.slot = -1
        self.state = PREFILL
        self.n_gen = 0
        self.n_cached = 0  # prompt tokens taken from the slot's cache (not evaluated again)
        self.t_prefill: int | None = None  # when the prompt's last chunk was evaluated
        self.sampler = sampler  # its draws (a draft model's verification shares its RNG: draft_model)
        self._stop = StopMatcher(opts.stop)
        self._decoder = tok.stream_decoder() if tok is not None else None
        self.eog = tok.eog_ids if tok is not None else frozenset()  # the ids that end it
        self.limit = opts.num_predict if opts.num_predict >= 0 else None  # most tokens it makes; None: the context
        self.progress = Progress(known=len(prompt))
        self.preemptions = 0  # times the KV pool ran dry and this sequence gave its blocks back
        self.cache_scope = cache_scope  # whose cached prefixes it may reuse, and under which its own are cached
        # Prompt-lookup drafting (localrt.engine.speculative); None when draft_num_predict is 0.
        self.draft = DraftState(opts.draft_num_predict) if opts.draft_num_predict > 0 else None
        self._logprobs = LogprobTracker(tok, logprobs) if logprobs is not None else None  # None: not asked for

    @property
    def prefilled(self) -> bool:
        return self.t_prefill is not None

    @property
    def finished(self) -> bool:
        return self.state in (DONE, CANCELLED)

    def is_cancelled(self) -> bool:
        return self.cancelled is not None and self.cancelled.is_set()

    def _more(self) -> bool:  # room in the context and in num_predict for another token
        return len(self.history) < self.n_ctx and (self.limit is None or self.n_gen < self.limit)

    def on_logits(self, logits: np.ndarray, choose=None) -> list[Token | Done]:
        """Sample one token from the logits of the last evaluated position (or take `choose(logits)`'s, which
        commits it to the sampler: speculative sampling's accept-or-resample); the events it makes."""
        if not self._more():
            return [self._finish("length", False)]
        if self.is_cancelled():
            self.state = CANCELLED  # the consumer is gone: no Done to send
            return []
        token = int(self.sampler.sample(logits, self.history) if choose is None else choose(logits))
        self.history.append(token)
        self.n_gen += 1
        if token in self.eog:
            return [self._finish("stop", False)]
        piece = self._decoder.add(token) if self._decoder is not None else ""
        emit, hit = self._stop.feed(piece)
        lps = ()
        if self._logprobs is not None:
            self._logprobs.add(logits, token, piece)
            lps = self._logprobs.release(emit)
        events: list[Token | Done] = [Token(token=token, text=emit, logprobs=lps)]
        if hit:
            events.append(self._finish("stop", True))
        elif self._more():  # only then is this token's forward pass needed
            self.progress.pending = token
        else:
            events.append(self._finish("length", False))
        return events

    def _finish(self, reason: str, hit: bool) -> Done:
        t_end = time.perf_counter_ns()
        held = ""
        if not hit:
            # Text a stop string might still have completed, and bytes of an unfinished character.
            held = self._stop.feed(self._decoder.flush() if self._decoder is not None else "")[0] + self._stop.flush()
        lps = self._logprobs.finish(held, hit) if self._logprobs is not None else ()
        self.state = DONE
        return Done(
            done_reason=reason,
            prompt_eval_count=len(self.prompt),  # the whole prompt, as Ollama counts it
            prompt_cached_count=self.n_cached,
            prompt_eval_duration=self.t_prefill - self.t_start,
            eval_count=self.n_gen,
            eval_duration=t_end - self.t_prefill,
            load_duration=self.load_duration_ns,
            total_duration=t_end - self.t_start + self.load_duration_ns,
            text=held,
            context=self.history,
            draft_count=self.draft.drafted_count if self.draft is not None else None,
            draft_accepted_count=self.draft.accepted_count if self.draft is not None else None,
            logprobs=lps,
        )


class Chunk(NamedTuple):
    """Positions start..end - 1 of seq's history evaluated by a prefill (or replay) forward."""

    seq: Sequence
    start: int
    end: int


@dataclass
class StepPlan:
    """What one step runs, decided before any forward and changing nothing (Batcher.plan); Batcher.execute runs it."""

    cancelled: list[Sequence]  # dropped this step: their slots are free again, they get no events
    resumed: list[Sequence]  # back from waiting, oldest first: their next chunks (or replay runs) are in `prefill`
    preempted: list[Sequence]  # give their blocks back, newest first, to make room for this step's rows: waiting then
    decode: list[list[Row]]  # one forward each: the decode rows of its sequences, with their drafts
    prefill: list[Chunk]  # the prompt chunks (or replay runs) evaluated, oldest sequence first


class Batcher:
    """Many sequences over one model, each in its own KV slot, advanced together one `step` at a time.

    Not thread-safe: one thread adds and steps; `cancelled` events may be set from anywhere."""

    def __init__(self, model, n_slots: int | None = None, *, reuse_min: int = REUSE_MIN_TOKENS, drafter=None) -> None:
        n = model.cache.n_slots if n_slots is None else n_slots
        if not 0 < n <= model.cache.n_slots:
            raise ValueError(f"n_slots must be in 1..{model.cache.n_slots} (the model's KV slots), got {n}")
        self.model = model
        self.n_slots = n
        self.reuse_min = max(1, reuse_min)  # shortest cached prefix a prompt reuses
        self.drafter = drafter  # a draft_model.ModelDrafter loaded beside the model, or None (prompt lookup only)
        # Decode rows per forward: at most as many as every device computes with its one-row path.
        devices = layer_devices(model.backend, model.weights)
        self.max_rows = min(getattr(d, "invariant_rows", 1) for d in devices)
        # Rows one sequence may carry (its pending token and a draft) with one-row numerics on every device, and
        # no more than a ring layer of the cache can take back (trim) after a rejected draft.
        max_run = min(
            min(getattr(d, "invariant_run", getattr(d, "invariant_rows", 1)) for d in devices), model.cache.n_batch
        )
        self.max_run = max_run  # also the rows of one forward replaying a preempted sequence's decoded tokens
        self._spec = Speculator(self.max_rows, max_run, priors(model).costs)  # shared by the model's Batchers
        self.slots = Slots(model.cache, n, max_run, self.reuse_min)

    @property
    def sequences(self) -> list[Sequence]:
        """The sequences that hold a slot (prefilling or decoding)."""
        return list(self.slots.held.values())

    @property
    def free_slots(self) -> int:
        return self.n_slots - len(self.slots.held)

    def add(
        self,
        ids,
        options: dict | Options | None = None,
        *,
        constraint=None,
        cancelled: threading.Event | None = None,
        slot: int | None = None,
        load_duration_ns: int = 0,
        logprobs: int | None = None,
        logit_bias=None,
        cache_scope: str = "",
    ) -> Sequence:
        """Validate a request and give it a free slot (`slot`, or the free one whose cache shares the longest
        prefix with the prompt). Raises as `generate` does (ContextLengthExceeded, InvalidRequest) and
        RuntimeError when no slot is free; its events come from the following steps. `logprobs`: None, or how many
        top alternatives each Token's log-probability entry lists; `logit_bias`: {token id: bias} before sampling;
        `cache_scope`: the sequence reuses cached or running prefixes of its own scope only (a client's: what one
        client sent must not speed up, or show in cached_tokens to, another's guess at it), and its prefix is cached
        under it."""
        seq = Sequence(
            self.model,
            ids,
            options,
            constraint,
            cancelled,
            load_duration_ns,
            logprobs=logprobs,
            logit_bias=logit_bias,
            cache_scope=cache_scope,
        )
        if slot is None:
            slot = self.slots.pick(seq)
        elif not 0 <= slot < self.n_slots or slot in self.slots.held:
            raise RuntimeError(f"slot {slot} is not a free slot of 0..{self.n_slots - 1}")
        attach(seq, self.drafter)  # a request naming the draft model drafts with it instead of prompt lookup
        seq.slot = slot
        if seq.draft is not None:
            seq.draft.shared = priors(self.model).evidence
        seq.progress.computed = self.slots.reuse(slot, seq, seq.prompt)
        if seq.draft is not None and seq.draft.source is not None:
            # its own slot: reuse what the draft's cache holds of the prompt, if this client's
            seq.draft.source.start(slot, seq.prompt, seq.num_batch, seq.cache_scope)
        seq.n_cached = seq.progress.computed
        self.slots.held[slot] = seq
        return seq

    def step(self) -> list[tuple[Sequence, list[Token | Done]]]:
        """One step: `plan` what runs, then `execute` it.

        Returns (sequence, events) for every sequence that produced events or left: a cancelled one comes with
        no events (and its slot is free again); a finished one's events end with its Done."""
        return self.execute(self.plan())

    def plan(self) -> StepPlan:
        """Decide this step without running the model or changing anything: the cancelled sequences are dropped,
        waiting ones put back while the pool has room (localrt.engine.preempt), the decode rows and drafts planned
        (Speculator.plan) and the prompt chunks (Slots.prefilling), the newest sequences preempted while the pool
        cannot hold those rows. Where that changes the slots it is done on a copy of them (Slots.copy) by the
        functions `execute` then runs on the real ones."""
        real = self.slots
        cancelled = [seq for seq in real.held.values() if seq.is_cancelled()]
        world = real.copy() if cancelled or any(s.state == WAITING for s in real.held.values()) else real
        for seq in cancelled:
            world.drop(world.mirror(seq))
        resumed = preempt.resume_waiting(world)
        decoding = [s for s in world.held.values() if s.progress.pending is not None]
        groups = self._spec.plan(decoding, [draft_limit(s) for s in decoding])
        prefilling = world.prefilling()
        preempted = []
        if world is not real or not preempt.fits(world, groups, prefilling):
            if world is real:  # preempting changes the slots: on a copy
                world = real.copy()
                groups = [[row._replace(seq=world.mirror(row.seq)) for row in group] for group in groups]
                prefilling = [world.mirror(seq) for seq in prefilling]
            groups, prefilling, preempted = preempt.make_room(world, groups, prefilling)
        real_of = world.origin
        return StepPlan(
            cancelled=cancelled,
            resumed=[real_of(s) for s in resumed],
            preempted=[real_of(s) for s in preempted],
            decode=[[row._replace(seq=real_of(row.seq)) for row in group] for group in groups],
            prefill=[Chunk(real_of(s), s.progress.computed, preempt.chunk_end(s, self.max_run)) for s in prefilling],
        )

    def execute(self, plan: StepPlan) -> list[tuple[Sequence, list[Token | Done]]]:
        """Run a plan (the last one `plan` made; nothing added or stepped since): drop its cancelled, resume and
        preempt its sequences as it says, run each decode group's forward and the prompt chunks' forwards, then sample
        every sequence that got logits (accepting or rejecting its draft: draft_model.check_drafts) and trim the rows
        of rejected draft tokens from the cache; a finished sequence's slot is freed."""
        slots = self.slots
        slots.steps += 1
        for seq in plan.cancelled:
            slots.drop(seq)
        for seq in plan.resumed:
            preempt.resume(slots, seq)
        for seq in plan.preempted:
            preempt.preempt(slots, seq)
        for seq, start, _ in plan.prefill:
            if seq.progress.computed != start or seq.state != PREFILL:
                raise RuntimeError("a stale step plan: the slots changed after it was made")
        out: list[tuple[Sequence, list[Token | Done]]] = [(seq, []) for seq in plan.cancelled]
        # Sequences with the logits (rows, n_vocab) of their pending token and draft, the match size, the draft.
        fresh: list[tuple[Sequence, np.ndarray, int, list[int]]] = []
        for group in plan.decode:
            fresh.extend(self._decode(group))
        for seq, logits in self._prefill(plan.prefill):
            if logits is not None:
                fresh.append((seq, logits[None], 0, []))
        for seq, logits, n, draft in fresh:
            start = len(seq.history) - 1  # the position of the first row (pending token or prompt's last)
            events = check_drafts(seq, logits, n, draft)
            if draft:  # drop the rows whose input was a rejected draft token
                self.model.cache.trim(
                    seq.slot, kept_positions(seq.history, start, seq.history[start : start + 1] + draft)
                )
                if seq.draft.source is not None:
                    seq.draft.source.settle(seq.slot, seq.history)  # and the draft model's, the same way
            if seq.finished:
                slots.release(seq)
            out.append((seq, events))
        return out

    def park(self, seq: Sequence) -> None:
        """seq leaves its slot for another sequence (localrt.engine.preempt.park); it resumes, unchanged, after
        `unpark`. Only a sequence that preempt.parkable allows."""
        if not preempt.parkable(seq) or self.slots.held.get(seq.slot) is not seq:
            raise RuntimeError("only a running sequence without a draft model can be parked")
        preempt.park(self.slots, seq)

    def unpark(self, seq: Sequence) -> None:
        """A parked seq takes a free slot again (RuntimeError when none is free) and resumes where it stopped."""
        preempt.unpark(self.slots, seq)

    def close(self) -> None:
        """Drop every sequence (as if cancelled, no Done), keeping what each slot's cache validly holds."""
        for seq in list(self.slots.held.values()):
            self.slots.drop(seq)

    # -- internals ---------------------------------------------------------------------------------

    def _decode(self, group: list[Row]) -> list[tuple[Sequence, np.ndarray, int, list[int]]]:
        """One forward over each sequence's pending token and draft (a draft model proposes its tokens now), at its
        next positions in its own slot: (sequence, its logits (1 + len(draft), n_vocab), match size, draft) per
        sequence."""
        tokens, positions, slots, rows = [], [], [], []
        for s, n, draft, propose in group:
            draft = s.draft.source.propose(s, propose) if propose else list(draft)
            if s.draft is not None:
                s.draft.ran(len(draft))
            rows.append((s, n, draft))
            start = len(s.history) - 1
            tokens += [s.progress.pending, *draft]
            positions += range(start, start + 1 + len(draft))
            slots += [s.slot] * (1 + len(draft))
            s.progress.pending = None
        batch = Batch(
            tokens=np.array(tokens, np.int64),  # (n_rows,)
            positions=np.array(positions, np.int64),  # (n_rows,)
            slots=np.array(slots, np.int64),  # (n_rows,)
        )
        logits = self._spec.timed_forward(
            lambda: self.model.forward(batch, self.model.cache, output_rows=None), len(batch)
        )
        out, row = [], 0
        for s, n, draft in rows:
            out.append((s, logits[row : row + 1 + len(draft)], n, draft))  # (1 + len(draft), n_vocab)
            row += 1 + len(draft)
        return out

    def _prefill(self, chunks: list[Chunk]) -> list[tuple[Sequence, np.ndarray | None]]:
        """Evaluate each chunk (a sequence's next prompt chunk, cut as `generate` alone cuts it): (sequence, the last
        row's logits if that was the prompt's last chunk, else None) per sequence.

        A chunk with rows on the BLAS path (a piece of 64+ positions, backends.pieces.blas_pieces) is a forward of
        its own, as alone; the chunks whose rows are all per-row (short prompts, replays) share one forward, which
        computes each row as alone (a mixed batch is per-row throughout) and reads the weights once for all of them.
        After a preemption the decoded tokens follow, replayed in runs of at most max_run rows (per-row numerics,
        as their decode steps computed them); then the sequence decodes its pending token again."""
        model = self.model
        alone, shared = [], []
        for c in chunks:
            (alone if blas_pieces(np.arange(c[1], c[2]), np.zeros(c[2] - c[1], np.int64)) else shared).append(c)
        rows: dict[int, np.ndarray] = {}  # id(sequence) -> its last row's logits (n_vocab,)
        for group in [[c] for c in alone] + ([shared] if shared else []):
            batch = Batch(
                tokens=np.concatenate([np.asarray(s.history[a:b], np.int64) for s, a, b in group]),  # (n_rows,)
                positions=np.concatenate([np.arange(a, b, dtype=np.int64) for _, a, b in group]),  # (n_rows,)
                slots=np.concatenate([np.full(b - a, s.slot, np.int64) for s, a, b in group]),  # (n_rows,)
            )
            last = np.cumsum([b - a for _, a, b in group]) - 1  # each chunk's last row
            logits = model.forward(batch, model.cache, output_rows=last)  # (len(group), n_vocab)
            for (s, _, _), row in zip(group, logits):
                rows[id(s)] = row
        return [(seq, self._chunk_done(seq, end, rows[id(seq)])) for seq, _, end in chunks]

    def _chunk_done(self, seq: Sequence, end: int, logits: np.ndarray) -> np.ndarray | None:
        """seq's chunk up to `end` was evaluated (logits: its last row's): its logits if its prompt is complete."""
        seq.progress.computed = end
        if not seq.prefilled:
            sync_prompt(seq)  # a draft model evaluates the same prompt positions in its own slot
        if seq.progress.computed < seq.progress.known:
            return None
        seq.state = DECODE
        if seq.prefilled:  # a preempted sequence is back where it was: its pending token decodes next
            seq.progress.pending = seq.history[-1]
            return None
        seq.t_prefill = time.perf_counter_ns()
        return logits
