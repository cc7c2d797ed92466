"""Speculative decoding with a draft model: a second, smaller model of the same vocabulary proposes the tokens.

A `ModelDrafter` holds the draft model beside the target, with KV slots of its own that mirror the target's:
slot s of the draft holds keys for a prefix of what slot s of the target holds. It evaluates every prompt chunk
the target evaluates (`sync_prompt`), proposes up to k tokens autoregressively before the target's verify
forward (`propose`: it first evaluates what it has not seen of the history, then one token per forward), and
is trimmed back after a rejected draft to the positions whose input was the sequence's own token (`settle`),
exactly as the target's cache is. A request drafts with it when its `draft_model` option names it (`attach`):
the draft model then replaces prompt lookup for that request, and the planner (speculative.Speculator) counts
the draft forwards of a draft in the cost of its step (`draft_costs`: the catch-up forward over what the draft has
not seen, then one a token), so the draft model switches itself off where it does not pay, as prompt lookup does.

Verification (`check_drafts`):
- Greedy (temperature <= 0): the draft proposes its argmax, and the target's own argmax decides, as for
  prompt lookup (speculative.verify): the output is identical with and without the draft model.
- Sampling: standard speculative sampling. The draft draws d_i from its own distribution q (the request's
  sampler chain applied to the draft's logits, penalties included, from the sequence's RNG); the target
  accepts d_i with probability min(1, p(d_i) / q(d_i)) (p: the target's distribution after its whole chain,
  a format's mask and a logit_bias included), and on a rejection draws from norm(max(0, p - q)). Each emitted
  token is then distributed as p, so the output distribution is the target's. A seeded request is
  reproducible (its draft length follows acceptance only, never timing: DraftState.fixed) but its tokens
  differ from the same seed without the draft model, which takes other draws from the RNG.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ..errors import DraftModelMismatch, InvalidRequest
from .backends.pieces import BLAS_MIN_TOKENS, exact_reuse, prefill_end, prompt_pieces
from .events import Done
from .sampler import Sampler
from .speculative import priors, verify

MODEL = 0  # the match class a draft model's drafts count under in DraftState (n-gram matches: 1..speculative.LONG)


def check_tokenizers(target, draft, target_name: str = "the model", draft_name: str = "the draft model") -> None:
    """Raise DraftModelMismatch unless both tokenizers have the same tokens with the same ids, kinds and types,
    and the same BOS/EOS/EOT ids, BOS/EOS insertion and end-of-generation set."""
    if target is None or draft is None:
        raise DraftModelMismatch(f"draft_model {draft_name!r}: both models need a tokenizer in the file")
    a, b = target.vocab, draft.vocab
    why = ""
    if (a.kind, a.model) != (b.kind, b.model):
        why = f"tokenizer {b.model!r} ({b.kind}), the model's is {a.model!r} ({a.kind})"
    elif len(a.tokens) != len(b.tokens):
        why = f"{len(b.tokens)} tokens, the model has {len(a.tokens)}"
    elif a.tokens != b.tokens or a.attrs != b.attrs:
        i = next(i for i in range(len(a.tokens)) if a.tokens[i] != b.tokens[i] or a.attrs[i] != b.attrs[i])
        why = f"token {i} is {b.tokens[i]!r}, the model's is {a.tokens[i]!r} (or their types differ)"
    else:
        for what, x, y in (
            ("BOS id", a.ids.get("bos"), b.ids.get("bos")),
            ("EOS id", a.ids.get("eos"), b.ids.get("eos")),
            ("EOT id", a.ids.get("eot"), b.ids.get("eot")),
            ("add_bos", a.add_bos, b.add_bos),
            ("add_eos", a.add_eos, b.add_eos),
            ("end-of-generation ids", sorted(a.eog_ids), sorted(b.eog_ids)),
            ("pre-tokenizer", a.pre, b.pre),
        ):
            if x != y:
                why = f"its {what} is {y!r}, the model's is {x!r}"
                break
    if why:
        raise DraftModelMismatch(f"draft_model {draft_name!r} does not share the tokenizer of {target_name}: {why}")


def weight_bytes(model) -> int:
    source = getattr(model, "_source", None)
    return int(sum(t.nbytes for t in source.tensors.values())) if source is not None else 0


class ModelDrafter:
    """A draft model beside a target model (`name`: what a request's draft_model says to use it)."""

    def __init__(self, target, draft, name: str, *, target_name: str = "the model") -> None:
        check_tokenizers(target.tokenizer, draft.tokenizer, target_name, name)
        if draft.config.n_vocab != target.config.n_vocab:
            raise DraftModelMismatch(
                f"draft_model {name!r} has {draft.config.n_vocab} output rows, the model {target.config.n_vocab}"
            )
        if draft.cache.n_slots < target.cache.n_slots:
            raise ValueError(f"the draft model has {draft.cache.n_slots} KV slots, the model {target.cache.n_slots}")
        self.model = draft
        self.name = name
        self.cached: dict[int, list[int]] = {}  # slot -> the ids whose keys the draft's cache holds, in order
        self.scopes: dict[int, str] = {}  # slot -> the cache scope of the sequence that left those keys
        self.pieces: dict[int, list[tuple[int, int]]] = {}  # slot -> its prompt positions computed on the BLAS path
        tb, db = weight_bytes(target), weight_bytes(draft)
        # Until a draft forward is measured, it is guessed to cost its share of the weights a target row reads.
        self.ratio = db / tb if tb and db else 0.5

    def close(self) -> None:
        self.model.close()

    def draft_costs(self, seq, target_costs) -> tuple[float, float]:
        """Seconds of the draft forwards a draft for seq takes (the target's relative units until the draft's one-token
        forward is measured): (the first, which evaluates what the draft has not seen of the history, the pending
        token at least; each further one-token forward). A draft of k tokens costs first + (k - 1) * each.

        The first forward is its own price: a sequence that drafted last step has the draft's last token and the
        target's bonus token to catch up on (measured, Gemma 3 270M Q4_K_M: 13.5 ms for those 2 rows, 12.1 for 1),
        one that did not, every token since."""
        lag = max(1, len(seq.history) - len(self.cached.get(seq.slot, ())))  # the cache holds a prefix (settle)
        own = priors(self.model).costs
        if 1 in own.measured() and target_costs.measured():
            return own.cost(lag), own.cost(1)
        return target_costs.cost(lag) * self.ratio, target_costs.cost(1) * self.ratio

    def start(self, slot: int, prompt: list[int], num_batch: int, scope: str = "") -> None:
        """A new sequence in slot: keep the longest prefix of the prompt the draft's cache holds exactly (computed on
        the path a fresh evaluation takes: pieces.exact_reuse; one token at least is left to evaluate), else clear
        it. The target's chunks (num_batch) and the draft's own cut its prompt evaluation. Only a sequence of the
        slot's last cache scope (a client's, as the target's prefix cache scopes it) reuses what it left: another
        client's draft would otherwise evaluate a guessed secret faster."""
        cache = self.model.cache
        have = self.cached.get(slot, []) if self.scopes.get(slot, "") == scope else []
        self.scopes[slot] = scope
        keep = 0
        for a, b in zip(have[: min(len(prompt) - 1, int(cache.lengths[slot]))], prompt):
            if a != b:
                break
            keep += 1
        fresh = prompt_pieces(len(prompt), num_batch, self.model.num_batch)
        keep = exact_reuse(keep, self.pieces.get(slot, []), fresh)
        self.pieces[slot] = fresh
        if keep and cache.can_trim(slot, keep):
            cache.trim(slot, keep)
        else:
            cache.clear(slot)
            keep = 0
        self.cached[slot] = list(have[:keep])

    def settle(self, slot: int, history: list[int]) -> None:
        """Trim the draft's cache to the positions whose input is the token the sequence holds there."""
        have = self.cached.setdefault(slot, [])
        j = 0
        while j < len(have) and j < len(history) and have[j] == history[j]:
            j += 1
        if j < len(have):
            if self.model.cache.can_trim(slot, j):
                self.model.cache.trim(slot, j)
            else:  # a sliding-window ring overwrote what j needs: evaluate again from the start
                self.model.cache.clear(slot)
                j = 0
            del have[j:]

    def evaluate(self, slot: int, tokens: list[int], per_row: bool = False) -> np.ndarray | None:
        """Evaluate tokens after the cached ones, in chunks ending at multiples of num_batch positions (`per_row`:
        of fewer rows than a BLAS piece, as decoded tokens are); the last one's logits (n_vocab,)."""
        model, have = self.model, self.cached.setdefault(slot, [])
        logits = None
        i = 0
        while i < len(tokens):
            end = len(have) + (
                min(len(tokens) - i, BLAS_MIN_TOKENS - 1)
                if per_row
                else prefill_end(len(have), len(have) + len(tokens) - i, model.num_batch) - len(have)
            )
            chunk = tokens[i : i + end - len(have)]
            i += len(chunk)
            batch = model.batch(chunk, len(have), slot)
            t0 = time.perf_counter()
            logits = model.forward(batch, model.cache, output_rows=np.array([len(chunk) - 1]))[0]  # (n_vocab,)
            if per_row:  # a draft's forwards, what the planner prices (a prompt's BLAS pieces are not)
                priors(model).costs.record(len(chunk), time.perf_counter() - t0)
            have.extend(chunk)
        return logits

    def propose(self, seq, k: int) -> list[int]:
        """Up to k tokens the draft model continues seq.history with (its last token is the pending one); stops
        after an end-of-generation token or where the draft's context ends. Records what each was drawn from."""
        state, history = seq.draft, seq.history
        state.pending_q = []
        k = min(k, self.model.num_ctx - len(history) + 1)  # positions up to len(history) + k - 2 are written
        if k <= 0:
            return []
        self.settle(seq.slot, history)
        have = self.cached[seq.slot]
        if len(have) == len(history):  # the logits of the last token are needed again
            self.model.cache.trim(seq.slot, len(have) - 1)
            del have[-1]
        logits = self.evaluate(seq.slot, history[len(have) :], per_row=True)  # decoded tokens: per-row numerics
        out: list[int] = []
        for i in range(k):
            if state.q_sampler is None:
                token = int(np.argmax(logits))
            else:
                ids, probs = state.q_sampler.distribution(logits, history + out)
                token = int(ids[_pick(probs, state.q_sampler.rng.uniform())])
                state.pending_q.append((ids, probs))
            out.append(token)
            if token in seq.eog or i == k - 1:
                break
            logits = self.evaluate(seq.slot, [token], per_row=True)
        return out


def attach(seq, drafter) -> None:
    """Give seq the draft model its draft_model option names (InvalidRequest if it is not the one loaded)."""
    name = seq.options.draft_model
    if not name:
        return
    if drafter is None or drafter.name != name:
        raise InvalidRequest(f"draft_model {name!r} is not loaded beside this model")
    state = seq.draft
    if state is None:  # draft_num_predict 0: speculation is off for this request
        return
    state.source = drafter
    if seq.options.temperature > 0:
        state.q_sampler = Sampler(seq.options, _base(seq.sampler).rng)  # the same RNG stream as the sequence's
        state.fixed = seq.options.seed != -1


def sync_prompt(seq) -> None:
    """After a target prefill chunk: the draft model evaluates the same prompt positions."""
    if seq.draft is not None and seq.draft.source is not None:
        src = seq.draft.source
        src.settle(seq.slot, seq.prompt)
        have = src.cached[seq.slot]
        upto = min(seq.progress.computed, src.model.num_ctx)  # a prompt beyond the draft's context is never drafted
        if len(have) < upto:
            src.evaluate(seq.slot, seq.prompt[len(have) : upto])


def check_drafts(seq, logits: np.ndarray, n: int, draft: list[int]) -> list:
    """Seq's events from the rows of (pending, *draft): speculative sampling for a sampled draft model's
    draft, else the identical-draws walk of speculative.verify."""
    state = seq.draft
    if not draft or state is None or state.source is None or state.q_sampler is None:
        return verify(seq, logits, n, draft)
    events: list = []
    accepted = 0
    sampler = seq.sampler
    rng = _base(sampler).rng
    for i in range(len(draft) + 1):
        before = len(seq.history)
        if i == len(draft):  # every draft accepted: the last row is a plain sample
            events.extend(seq.on_logits(logits[i]))
            break
        q = state.pending_q[i]
        events.extend(
            seq.on_logits(logits[i], choose=lambda lg, d=draft[i], q=q: _accept(sampler, rng, lg, seq.history, d, q))
        )
        if len(seq.history) == before or seq.history[before] != draft[i]:
            break
        accepted += 1
        if seq.finished:
            break
    state.observe(n, len(draft), accepted)
    if events and isinstance(events[-1], Done):  # built before this draft was counted
        events[-1] = replace(events[-1], draft_count=state.drafted_count, draft_accepted_count=state.accepted_count)
    return events


def _accept(sampler, rng, logits: np.ndarray, history: list[int], d: int, q: tuple) -> int:
    """d (drawn from q) with probability min(1, p(d) / q(d)), else a draw from norm(max(0, p - q)); committed."""
    ids, p = sampler.distribution(np.asarray(logits, np.float32), history)  # (m,), (m,)
    q_ids, q_p = q
    pd = float(p[ids == d].sum())
    qd = float(q_p[q_ids == d].sum())  # > 0: d was drawn from q
    if rng.uniform() * qd < pd:
        token = d
    else:
        order = np.argsort(q_ids)
        pos = np.minimum(np.searchsorted(q_ids[order], ids), len(q_ids) - 1)  # (m,)
        on = q_ids[order][pos] == ids
        qv = np.where(on, q_p[order][pos], 0.0)  # (m,) q on p's ids
        r = np.maximum(p - qv, 0.0)
        if not r.sum() > 0:  # p == q up to rounding: a rejection is then all but impossible; draw from p
            r = p
        token = int(ids[_pick(r, rng.uniform())])
    sampler.commit(token)
    return token


def _pick(weights: np.ndarray, u: float) -> int:
    """The first index whose running sum reaches u * sum(weights)."""
    cum = np.cumsum(weights, dtype=np.float64)
    return min(int(np.searchsorted(cum, u * cum[-1], side="left")), len(weights) - 1)


def _base(sampler):
    """The engine Sampler inside a BiasedSampler / ConstrainedSampler (its RNG is the sequence's)."""
    while not isinstance(sampler, Sampler):
        sampler = getattr(sampler, "inner", None) or sampler.sampler
    return sampler
