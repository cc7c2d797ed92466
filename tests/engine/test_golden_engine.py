"""Golden: the engine on the two real models against llama.cpp's own outputs (tests/data/llamacpp_reference.json).

Teacher-forced: every prompt + greedy continuation of a model goes through ONE mixed-sequence batch (one
cache slot per entry). Top-1 must equal llama.cpp's at >= 95% of positions, and every miss must be a
near-tie in llama.cpp's own logits (top-2 within 0.5). Greedy generation must reproduce llama.cpp's
continuation token for token, except that it may diverge where llama.cpp's own top-2 gap at the first
divergent position is a near-tie: which near-ties flip depends on the CPU's and the BLAS kernel's rounding,
so no count of exact matches is asserted.
"""

from __future__ import annotations

import numpy as np
import pytest

from localrt import load_model

pytestmark = pytest.mark.golden
NEAR_TIE = 0.5


def _model(request, name):
    return load_model(request.getfixturevalue(f"{name}_path"), num_ctx=1024, n_slots=4)


def _teacher_forced(model, entries) -> list[np.ndarray]:
    """Logits (n_tok, n_vocab) per entry, all entries in one batch, entry i in cache slot i."""
    seqs = [e["prompt_ids"] + e["greedy_ids"] for e in entries]
    for s in range(len(seqs)):
        model.cache.clear(s)
    batch = type(model.batch([0], 0))(
        tokens=np.concatenate([np.asarray(s, np.int64) for s in seqs]),
        positions=np.concatenate([np.arange(len(s), dtype=np.int64) for s in seqs]),
        slots=np.concatenate([np.full(len(s), i, np.int64) for i, s in enumerate(seqs)]),
    )
    logits = model.forward(batch, model.cache)
    return np.split(logits, np.cumsum([len(s) for s in seqs])[:-1])


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_teacher_forced_top1_agrees_with_llamacpp(request, llamacpp_reference, name):
    entries = llamacpp_reference["models"][name]["entries"]
    model = _model(request, name)
    agree = total = 0
    diffs = []
    for e, logits in zip(entries, _teacher_forced(model, entries)):
        for pos, top in enumerate(e["top_logits"]):
            ids = [t for t, _ in top]
            ref = np.array([v for _, v in top])
            total += 1
            if int(np.argmax(logits[pos])) == ids[0]:
                agree += 1
            else:
                assert ref[0] - ref[1] <= NEAR_TIE, f"{e['prompt']!r} position {pos}: a clear miss"
            diffs.extend(np.abs(logits[pos, ids] - ref))
    print(
        f"{name}: top-1 {agree}/{total}, |logit diff| over llama.cpp's top-8: max {max(diffs):.3f} mean {np.mean(diffs):.3f}"
    )
    assert agree / total >= 0.95


def test_greedy_generation_reproduces_llamacpp(request, llamacpp_reference):
    matches = 0
    for name in ("smollm2", "gemma3"):
        model = load_model(request.getfixturevalue(f"{name}_path"), num_ctx=1024)
        for e in llamacpp_reference["models"][name]["entries"]:
            events = list(model.generate(e["prompt_ids"], {"temperature": 0, "num_predict": len(e["greedy_ids"])}))
            done = events[-1]
            got = done.context[len(e["prompt_ids"]) :]
            if got == e["greedy_ids"]:
                matches += 1
                if done.done_reason == "length":  # an end-of-turn token is not part of the text
                    assert "".join(ev.text for ev in events[:-1]) + done.text == e["greedy_text"]
                continue
            # a shorter output stopped (end of turn) where llama.cpp went on: it diverges at its end
            first = next((i for i, (a, b) in enumerate(zip(got, e["greedy_ids"])) if a != b), len(got))
            top = e["top_logits"][len(e["prompt_ids"]) - 1 + first]
            gap = top[0][1] - top[1][1]
            assert gap < NEAR_TIE, f"{name} {e['prompt']!r}: diverges at {first} where llama.cpp's gap is {gap:.3f}"
    print(f"greedy reproduced exactly for {matches} of 8 prompts; every other diverges at a near-tie")
