"""Speculative decoding by prompt lookup: draft from the context's own n-grams, verify in the decode forward.

A decoding sequence's next step normally runs one row (its pending token). With a draft d_1..d_k it runs k+1
rows at the next k+1 positions (pending, d_1, ..., d_k) in the same batched forward, and the sequence samples
from those rows in order, exactly as it would one step at a time: row i's logits are the ones single-token
decode would give once d_1..d_i are the tokens sampled (decode rows are batch-invariant, see batch.py), so
the walk goes on while the sampled token equals the drafted one and ends with the first one that differs
(the model's own token, which becomes the pending one). The cache is trimmed to the positions whose input
was the sampled token. Greedy output is therefore identical with and without drafts, token for token.

Sampling: sampling row i with the sequence's own sampler and accepting d_i iff the draw equals it is
speculative sampling for a point-mass draft: d_i is accepted with probability p(d_i) (p: the distribution
after the sampler's whole chain, penalties and a grammar's mask included), and on rejection the token is a
draw from p with d_i removed and renormalised. It also takes exactly one uniform per emitted token from
the sequence's RNG, as plain decoding does, so a seeded request gives the same tokens with and without
drafts. Grammar and stop strings hold for the same reason: every emitted token went through the same
`Sequence.on_logits`, and a draft the grammar forbids can never be the draw, which ends the run there.

Drafts (`NgramIndex`): the longest suffix of prompt + output (n from 3 down to 1) that occurred before;
the draft is what followed the occurrence whose preceding tokens agree longest with the sequence's (ties: the
most recent). A match counts under its size n, or under LONG where LONG_AGREE tokens agree (a passage being
copied), each class with its own acceptance evidence. Whether to draft, and how long, is decided per step
from the measured cost of a forward by its row count (`CostModel`; on a CPU extra rows cost most of a one-row
forward, on a GPU little) and the acceptance rate the sequence has shown for matches of that class
(`DraftState`): a step drafts only when the expected tokens per second beat the plain step's by a margin,
so free writing, where matches rarely continue, turns drafting off by itself; stale evidence decays back to
the prior, so an occasional probe notices when a sequence starts copying.

A request whose draft_model option names the draft model loaded beside the model drafts from it instead of the
index (`DraftState.source`, localrt.engine.draft_model): its drafts count under match class 0, the draft forwards a
draft takes (the first catching up on what the draft model has not seen) add to the planned step's cost, and
sampling verifies them by speculative sampling.
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from .events import Done

N_MAX, N_MIN = 3, 1  # n-gram sizes the lookup tries, longest first
# A match whose occurrence's preceding tokens agree with the sequence's over at least LONG_AGREE tokens (its own
# n-gram included) counts as its own class, LONG: the sequence is copying a passage there, and such drafts run on
# (their tokens are accepted far more often than a short match's: docs/measurements.md), so its evidence is kept
# apart from the short matches'.
LONG_AGREE = 8
LONG = N_MAX + 1
CLASSES = LONG + 1  # 0 (a draft model's drafts), 1..N_MAX (n-gram sizes), LONG
SCAN = 16  # the most recent occurrences of the matching n-gram whose context is compared
CONTEXT = 16  # tokens of context compared (the n-gram's own included)
PRIOR_ACCEPT, PRIOR_REJECT = 3.0, 1.0  # pseudo-counts: a new n-gram match is trusted at 0.75 per token
# ... and a LONG match at 0.9 (near the acceptance measured for it). With it the planner drafts longer where a
# passage is copied, which pays there and costs free writing nothing (replayed on greedy replies at measured forward
# costs: docs/measurements.md).
LONG_PRIOR_ACCEPT = 9.0
PRIOR = np.array([PRIOR_ACCEPT] * LONG + [LONG_PRIOR_ACCEPT])  # (CLASSES,) accepted pseudo-counts per class
# The model's own record across requests (`Evidence`) replaces those priors as a sequence's prior once drafts were
# verified: a 64-token reply is too short to unlearn an optimistic prior on its own, and at 8 sequences a
# rejected draft row costs most of a token (docs/measurements.md).
SHARED_DECAY = 0.98  # per verified draft: the model's record of ~35 drafts ago counts half
SHARED_FLOOR = 0.05  # the shared prior never falls below this, so a sequence that copies can still show it
DECAY = 0.97  # per decode step: evidence of ~23 steps ago counts half
MARGIN = 1.05  # a draft must promise this much more throughput than the plain step
# Until a row count is measured, its forward is guessed from the measured ones: between two, on the line through them;
# past the largest below it, on the slope from the smallest measured count to that one, or GUESS_SLOPE one-row
# forwards a row where that is less. Optimistic for a CPU, so that drafting gets tried and the real cost measured
# (what an extra row measured: docs/measurements.md).
GUESS_SLOPE = 0.2
SAMPLES = 15  # forwards kept per row count; the median is the estimate (robust to a busy machine)
HORIZON = 256  # forwards after which a sample expires (a few seconds of decode): a busy spell is soon forgotten


class NgramIndex:
    """Where each n-gram (n = N_MIN..N_MAX) of a token list occurred with a continuation.

    `sync(tokens)` indexes what was appended since the last call (the list only grows: drafts never enter
    it); `draft(tokens, k)` is (class, up to k tokens) for the longest matching suffix: what followed the one of
    its last SCAN occurrences whose preceding tokens agree longest with the list's own (ties: the most recent),
    the class being the suffix's size n, or LONG where LONG_AGREE tokens agree; or (0, []). A model that copies a
    passage with a change in it (a renamed identifier) comes back to a 1-2 token suffix that also occurs
    elsewhere; the agreeing context finds the place in the passage it is copying."""

    def __init__(self) -> None:
        # n -> n-gram -> starts of its continuations, oldest first
        self._at: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(N_MAX + 1)]
        self._seen = 0  # tokens indexed so far

    def sync(self, tokens: list[int]) -> None:
        for j in range(max(self._seen, 1), len(tokens)):
            for n in range(N_MIN, min(N_MAX, j) + 1):
                # the n-gram ending before j goes on with tokens[j]
                self._at[n].setdefault(tuple(tokens[j - n : j]), []).append(j)
        self._seen = len(tokens)

    def draft(self, tokens: list[int], k: int) -> tuple[int, list[int]]:
        self.sync(tokens)
        if k <= 0:
            return 0, []
        for n in range(min(N_MAX, len(tokens)), N_MIN - 1, -1):
            starts = self._at[n].get(tuple(tokens[len(tokens) - n :]))
            if starts:
                start = max(reversed(starts[-SCAN:]), key=lambda c: agreement(tokens, c))  # max: the first best
                return (LONG if agreement(tokens, start) >= LONG_AGREE else n), tokens[start : start + k]
        return 0, []


def agreement(tokens: list[int], start: int) -> int:
    """How many tokens (up to CONTEXT) before `start` equal the last ones of the list."""
    end, n = len(tokens), 0
    while n < CONTEXT and n < start and tokens[start - 1 - n] == tokens[end - 1 - n]:
        n += 1
    return n


class Evidence:
    """A model's acceptance record per match class over every sequence's verified drafts, decayed per draft."""

    def __init__(self) -> None:
        self.accepted = np.zeros(CLASSES)  # (CLASSES,) decayed accepted drafted tokens, per match class
        self.rejected = np.zeros(CLASSES)  # (CLASSES,) decayed first rejections, per match class

    def rate(self, n: int) -> float:
        a, r = self.accepted[n], self.rejected[n]
        return max(SHARED_FLOOR, (a + PRIOR[n]) / (a + r + PRIOR[n] + PRIOR_REJECT))

    def observe(self, n: int, drafted: int, accepted: int) -> None:
        self.accepted *= SHARED_DECAY
        self.rejected *= SHARED_DECAY
        self.accepted[n] += accepted
        self.rejected[n] += accepted < drafted


class DraftState:
    """One sequence's drafting: its n-gram index, acceptance evidence per match size, counts for Done.

    `shared`: the model's `Evidence` (priors(model).evidence), the prior of this sequence's own (None: the fixed
    0.75 prior)."""

    def __init__(self, max_draft: int, shared: Evidence | None = None) -> None:
        self.max_draft = max_draft  # the request's draft_num_predict (the backend may allow fewer)
        self.shared = shared
        self.index = NgramIndex()
        self.accepted = np.zeros(CLASSES)  # (CLASSES,) decayed drafted tokens that were accepted, per match class
        self.rejected = np.zeros(CLASSES)  # (CLASSES,) decayed first rejections, per match class
        self.length = 4  # draft cap: doubles on a full accept or a step without a draft; accepted + 1 on a reject
        self.drafted_count = 0
        self.accepted_count = 0
        # A draft model (draft_model.attach) instead of the n-gram index: its drafts count under match size 0.
        self.source = None  # draft_model.ModelDrafter
        self.q_sampler = None  # the draft's own sampler (temperature > 0), drawing from the sequence's RNG
        self.fixed = False  # seeded sampling: the draft length follows acceptance only, never timing
        self.pending_q: list = []  # (ids, probs) the drafted tokens were drawn from, for speculative sampling

    def rate(self, n: int, decay: float = 1.0) -> float:
        """Estimated probability that a drafted token from a match of class n is accepted (with the evidence decayed
        by `decay` first: what the rate is after a step's `ran`)."""
        a, r = self.accepted[n] * decay, self.rejected[n] * decay
        weight = PRIOR[n] + PRIOR_REJECT
        prior = self.shared.rate(n) if self.shared is not None else PRIOR[n] / weight
        return (a + weight * prior) / (a + r + weight)

    def ran(self, drafted: int) -> None:
        """A decode step of this sequence ran with `drafted` tokens: its evidence decays a step. A step without a
        draft relaxes the cap a rejection set (`length`): below the shortest draft that pays (on a CPU 3 tokens, a
        4-row forward) the sequence would never draft, so never raise it again (seen in a rename:
        docs/measurements.md). A fixed draft length follows acceptance only."""
        self.accepted *= DECAY
        self.rejected *= DECAY
        if not drafted and not self.fixed:
            self.length = min(2 * self.length, self.max_draft)

    def observe(self, n: int, drafted: int, accepted: int) -> None:
        """A verified draft of `drafted` tokens from a size-n match; the first `accepted` were sampled."""
        self.drafted_count += drafted
        self.accepted_count += accepted
        if self.shared is not None:
            self.shared.observe(n, drafted, accepted)
        self.accepted[n] += accepted
        if accepted < drafted:
            self.rejected[n] += 1.0
            self.length = max(1, accepted + 1)
        else:
            self.length = min(2 * self.length, self.max_draft)


class CostModel:
    """Seconds per decode forward by its row count: the median of the last SAMPLES forwards of each count.

    A sample expires after HORIZON forwards of any count: a count that stopped being run (because it measured
    slow, on a machine that was busy then) falls back to the optimistic guess and is measured again."""

    def __init__(self) -> None:
        self._samples: dict[int, collections.deque] = {}  # rows -> (forward index, seconds)
        self._n = 0  # forwards recorded
        self._known: dict[int, float] | None = None  # measured(), until the next record

    def record(self, rows: int, seconds: float) -> None:
        self._n += 1
        self._samples.setdefault(rows, collections.deque(maxlen=SAMPLES)).append((self._n, seconds))
        self._known = None

    def measured(self) -> dict[int, float]:
        """The current estimate of every row count with unexpired samples."""
        if self._known is None:
            out = {}
            for rows, got in list(self._samples.items()):
                fresh = sorted(t for i, t in got if i > self._n - HORIZON)
                if fresh:
                    out[rows] = statistics.median(fresh)
            self._known = out
        return self._known

    def cost(self, rows: int) -> float:
        """Estimated seconds of a forward with `rows` rows (relative units until something is measured)."""
        known = self.measured()
        if rows in known:
            return known[rows]
        if not known:
            return 1.0 + GUESS_SLOPE * (rows - 1)  # relative units
        first = min(known)
        row = GUESS_SLOPE * known[first] / (1.0 + GUESS_SLOPE * (first - 1))  # a row's guessed seconds
        below = [r for r in known if r < rows]
        if not below:
            return known[first] - row * (first - rows)
        lo = max(below)
        above = [r for r in known if r > rows]
        if above:  # between two measured counts: on their line, never below the smaller's (no cheaper with rows)
            hi = min(above)
            return known[lo] + max(0.0, known[hi] - known[lo]) * (rows - lo) / (hi - lo)
        if lo > first:  # the measured slope where it is the smaller
            row = min(row, max(0.0, (known[lo] - known[first]) / (lo - first)))
        return known[lo] + row * (rows - lo)


@dataclass
class Priors:
    """What every Batcher of one loaded model measures and learns, shared by all of them (the BatchDriver's and
    engine.generate's one-off ones): `costs`, decode forwards' seconds by row count, which prices every Batcher's
    drafts (and a draft model's own forwards: draft_model.ModelDrafter); `evidence`, every sequence's verified
    drafts, the prior of a new sequence's drafting (DraftState.shared). Replace a field to change what every
    Batcher created after it uses (tests force drafting on with a flat CostModel)."""

    costs: CostModel = field(default_factory=CostModel)
    evidence: Evidence = field(default_factory=Evidence)


# model -> its Priors. Kept here rather than on Model: they are the speculative planner's bookkeeping, which the
# model's weights, cache and forward never read. A weak key lets them go with the model, and the model needs no
# attribute for them (any weak-referenceable object can be a key: a Batcher's model is one, and so is a draft
# model). The lock makes the first use from two threads (the BatchDriver's and a one-off generate) create one.
_PRIORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PRIORS_LOCK = threading.Lock()


def priors(model) -> Priors:
    """model's Priors, created on first use and shared by every later caller while the model lives."""
    with _PRIORS_LOCK:
        got = _PRIORS.get(model)
        if got is None:
            got = _PRIORS[model] = Priors()
        return got


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a verify step of k drafted tokens emits on average: 1 + rate + ... + rate**k."""
    return float(sum(rate**i for i in range(k + 1)))


class Row(NamedTuple):
    """One sequence's rows in a decode forward: its pending token, then `draft` (prompt lookup's tokens, from a
    match of class `match`) or `propose` tokens its draft model proposes when the step runs."""

    seq: object
    match: int = 0
    draft: tuple[int, ...] = ()
    propose: int = 0


class Speculator:
    """A Batcher's drafting: plans each step's drafts over its decoding sequences, times its forwards.

    `max_run`: the most rows one sequence may carry in a forward with its numerics unchanged (the backends'
    `invariant_run`); `max_rows`: the most rows one forward may carry (the Batcher's group size)."""

    def __init__(self, max_rows: int, max_run: int, costs: CostModel | None = None) -> None:
        self.max_rows = max_rows
        self.max_run = max_run
        self.costs = costs if costs is not None else CostModel()  # priors(model).costs: shared with its other Batchers

    def plan(self, seqs: list, limits: list[int]) -> list[list[Row]]:
        """The step's forwards: groups of Rows, at most max_rows rows per group and limits[i] drafted tokens for
        seqs[i] (0 where it has no room or does not draft). Changes nothing: `ran` records a planned row once its
        forward is run (a draft model proposes its tokens then: draft_model.ModelDrafter.propose).

        Sequences are taken in order; each gets the draft length that maximises the expected tokens per second
        of its group's forward (the rows already planned, and the pending rows of the sequences after it that fit,
        included) if that beats the forward without it by MARGIN: at 8 sequences a draft row must pay for a row
        of a forward that already yields 8 tokens, not of a one-row forward (drafting on the rows planned so far
        alone lost throughput to no drafts at all: docs/measurements.md). A sequence whose rows would
        not fit drafts less; one whose pending row does not fit starts a group."""
        groups: list[list[Row]] = []
        rows, tokens, extra = self.max_rows, 0.0, 0.0  # the current group's rows, expected tokens, draft seconds
        for i, (seq, limit) in enumerate(zip(seqs, limits)):
            state = seq.draft
            fixed = state is not None and state.fixed
            k_fixed = min(limit, state.length, state.max_draft, self.max_run - 1, self.max_rows - 1) if fixed else 0
            if rows + 1 + k_fixed > self.max_rows:  # a fixed draft length is never cut by the rows of others
                groups.append([])
                rows, tokens, extra = 0, 0.0, 0.0
            n, draft, best_k, first, each = 0, [], 0, 0.0, 0.0
            if state is not None:
                after = min(len(seqs) - i - 1, self.max_rows - rows - 1)  # the later pending rows this group takes
                k_max = min(limit, state.length, state.max_draft, self.max_run - 1, self.max_rows - rows - 1 - after)
                if state.source is None:
                    n, draft = state.index.draft(seq.history, k_max)
                else:  # a draft model proposes any length; k drafted tokens cost first + (k - 1) * each of its seconds
                    first, each = state.source.draft_costs(seq, self.costs)
                    draft = [None] * k_max
                plain = self.costs.cost(rows + 1 + after)
                best = (tokens + 1.0 + after) / (plain + extra) * MARGIN
                rate = state.rate(n, DECAY) if draft else 0.0  # this step's decay (DraftState.ran) counted in
                for k in range(1, len(draft) + 1):
                    # never cheaper than the forward without the draft: medians of a busy machine can say so
                    value = (tokens + expected_tokens(rate, k) + after) / (
                        max(plain, self.costs.cost(rows + 1 + after + k)) + extra + first + (k - 1) * each
                    )
                    if value > best:
                        best_k, best = k, value
                if fixed:
                    best_k = k_fixed
            if state is not None and state.source is not None:
                groups[-1].append(Row(seq, 0, (), best_k))
            else:
                groups[-1].append(Row(seq, n, tuple(draft[:best_k])))
            rows += 1 + best_k
            extra += first + (best_k - 1) * each if best_k else 0.0
            tokens += expected_tokens(state.rate(n, DECAY), best_k) if best_k else 1.0
        return groups

    def timed_forward(self, forward, rows: int):
        """forward() timed into the cost model under its row count."""
        t0 = time.perf_counter()
        out = forward()
        self.costs.record(rows, time.perf_counter() - t0)
        return out


def draft_limit(seq) -> int:
    """The most tokens seq can usefully draft now: verification of k drafts yields up to k + 1 tokens, and the
    sequence may emit only as many as its context and num_predict leave."""
    room = seq.n_ctx - len(seq.history)
    if seq.limit is not None:
        room = min(room, seq.limit - seq.n_gen)
    return max(0, room - 1)


def verify(seq, logits: np.ndarray, n: int, draft: list[int]) -> list:
    """Sample seq from the rows of (pending, *draft) in order while the draws equal the draft; its events.

    logits (1 + len(draft), n_vocab); n: the size of the match the draft came from. A drafted token counts as
    accepted when it is the token sampled (also when that token ends the sequence). The caller trims the
    cache (`kept_positions`)."""
    events: list = []
    accepted = 0
    for i in range(len(draft) + 1):
        before = len(seq.history)
        events.extend(seq.on_logits(logits[i]))
        if i == len(draft) or len(seq.history) == before or seq.history[before] != draft[i]:
            break
        accepted += 1
        if seq.finished:
            break
    if draft:
        seq.draft.observe(n, len(draft), accepted)
        if events and isinstance(events[-1], Done):  # built before this draft was counted
            events[-1] = replace(
                events[-1], draft_count=seq.draft.drafted_count, draft_accepted_count=seq.draft.accepted_count
            )
    return events


def kept_positions(history: list[int], start: int, inputs: list[int]) -> int:
    """How many cache positions are valid after rows `inputs` ran at positions start.. : the prefix of start
    plus the rows whose input is the token the sequence holds at that position."""
    j = 0
    while j < len(inputs) and start + j < len(history) and history[start + j] == inputs[j]:
        j += 1
    return start + j
