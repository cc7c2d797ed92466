"""The engine's pieces of logprobs and logit_bias, without a model: which events carry which tokens' entries around
a stop string, and the bias stage of the sampler (greedy included, ids and values checked)."""

from __future__ import annotations

import numpy as np
import pytest

from localrt.engine.logprobs import LogprobTracker
from localrt.engine.sampler import BiasedSampler, make_sampler
from localrt.engine.stop import StopMatcher
from localrt.errors import InvalidRequest

PIECES = {0: b"Hi", 1: b" th", 2: b"ere", 3: b" ST", 4: b"OP", 5: b"!", 6: b"\xc2", 7: b"\xb0"}


class _Tok:
    def token_to_piece(self, i: int, special: bool = False) -> bytes:
        return PIECES[i]


def _run(tokens, stop, top_n=0):
    """Feed tokens as batch.Sequence does; returns (shown text, entry ids per event, the last event's ids)."""
    tracker = LogprobTracker(_Tok(), top_n)
    matcher = StopMatcher(stop)
    logits = np.linspace(0, 1, 8, dtype=np.float32)  # (8,) token 7 most likely
    shown, per_event = "", []
    for t in tokens:
        piece = PIECES[t].decode("utf-8", "replace") if t < 6 else ("" if t == 6 else "°")
        tracker.add(logits, t, piece)
        emit, hit = matcher.feed(piece)
        shown += emit
        per_event.append([e.token.id for e in tracker.release(emit)])
        if hit:
            return shown, per_event, [e.token.id for e in tracker.finish("", True)]
    held = matcher.flush()
    return shown + held, per_event, [e.token.id for e in tracker.finish(held, False)]


def test_entries_travel_with_their_text_and_stop_string_tokens_are_dropped():
    shown, events, last = _run([0, 1, 2, 3, 4, 5], [" STOP"])
    assert shown == "Hi there"
    assert events == [[0], [1], [2], [], []] and last == []  # " ST" was held, then it was the stop string


def test_held_text_that_was_no_stop_string_releases_its_tokens():
    shown, events, last = _run([0, 3, 5], [" STOP"])
    assert shown == "Hi ST!" and events == [[0], [], [3, 5]] and last == []
    shown, events, last = _run([0, 3], [" STOP"])  # the end comes while " ST" is held
    assert shown == "Hi ST" and events == [[0], []] and last == [3]


def test_a_token_cut_by_a_stop_string_keeps_its_entry():
    shown, events, last = _run([0, 1, 2], ["her"])
    assert shown == "Hi t" and events == [[0], [1], []] and last == []  # " th" is partly shown; "ere" is in "her"


def test_a_character_split_over_two_tokens_comes_with_both():
    shown, events, last = _run([0, 6, 7, 5], [])
    assert shown == "Hi°!" and events == [[0], [], [6, 7], [5]] and last == []


def test_top_entries_are_the_most_likely_and_exact():
    tracker = LogprobTracker(_Tok(), 3)
    logits = np.array([0, 3, 1, 2, -1, 0, 0, 0], dtype=np.float32)  # (8,)
    tracker.add(logits, 2, "ere")
    (e,) = tracker.finish("", False)
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    assert e.token.id == 2 and e.token.text == "ere" and e.token.bytes == b"ere"
    assert [t.id for t in e.top] == [1, 3, 2] and np.allclose([t.logprob for t in e.top], ref[[1, 3, 2]], atol=1e-6)
    assert abs(e.token.logprob - ref[2]) < 1e-6
    with pytest.raises(ValueError):
        LogprobTracker(_Tok(), 21)


def test_logit_bias_moves_a_greedy_pick_and_is_checked():
    logits = np.array([0.0, 5.0, 4.0, 1.0], dtype=np.float32)  # (4,)
    greedy = make_sampler({"temperature": 0})
    assert greedy.sample(logits) == 1
    assert BiasedSampler(greedy, {1: -100.0}, 4).sample(logits) == 2
    assert BiasedSampler(greedy, {0: 100.0}, 4).sample(logits) == 0
    assert BiasedSampler(greedy, {3: 3.5}, 4).sample(logits) == 1  # 4.5 < 5: a bias is added, not a ban
    seeded = make_sampler({"temperature": 1.0, "seed": 3, "top_k": 0, "top_p": 1.0, "repeat_penalty": 1.0})
    assert all(BiasedSampler(seeded, {1: -100.0, 2: -100.0, 3: -100.0}, 4).sample(logits) == 0 for _ in range(20))
    assert list(logits) == [0.0, 5.0, 4.0, 1.0]  # the caller's logits are untouched
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        BiasedSampler(greedy, {4: 1.0}, 4)
    with pytest.raises(InvalidRequest, match="between -100 and 100"):
        BiasedSampler(greedy, {1: float("nan")}, 4)
