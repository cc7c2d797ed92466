"""Continuous batching (localrt.engine.batch): a request's tokens are the same alone or beside others.

Kernel level: the fused kernel over n rows and the attention kernel over n decode rows give bit-identical
rows to n one-row calls. Engine level, on both real models: 8 prompts joining at different steps (different
num_predict, a stop string, a seeded sampled one, one cancelled midway, a long prompt prefilled in chunks
while the others decode) give token for token what each gives alone. Prefix reuse is exact: a follow-up that
reuses the earlier turn, and a prompt that copies a shared prefix from another running slot, give the tokens
and logprobs of a fresh evaluation.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import simd_kernels as sk
from localrt import load_model
from localrt.engine.backends.backend import CPUBackend
from localrt.engine.backends.pieces import BLAS_MIN_TOKENS
from localrt.engine.batch import PREFILL_ROWS_PER_STEP, Batcher
from localrt.engine.events import Done, Token
from _kernel_blocks import ALL_KERNELS, random_weights


# -- kernels -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", ALL_KERNELS)
def test_fused_kernel_rows_equal_one_row_calls(t: int) -> None:
    rng = np.random.default_rng(7 + t)
    w = random_weights(rng, t, 67, 512)  # read-only, as the mmap'd weights are (the variant the engine compiles)
    for n in (2, 3, 4, 5, 8, 17, 64, 65, 130, BLAS_MIN_TOKENS - 1):
        x = rng.standard_normal((n, 512)).astype(np.float32)
        out = np.empty((n, 67), np.float32)
        sk.MUL[t](w, x, out)
        for i in range(n):
            one = np.empty((1, 67), np.float32)
            sk.MUL[t](w, np.ascontiguousarray(x[i : i + 1]), one)
            assert np.array_equal(one[0], out[i]), f"type {t}: row {i} of {n} differs from its one-row call"


@pytest.mark.parametrize("window", [0, 24])
def test_decode_attention_rows_equal_one_row_calls(window: int) -> None:
    rng = np.random.default_rng(window)
    be = CPUBackend()
    n_slots, n_head, n_kv, hd, cap = 8, 6, 2, 32, 600
    k = rng.standard_normal((n_slots, n_kv, cap, hd)).astype(np.float32)  # (n_slots, n_kv, cap, hd)
    v = rng.standard_normal((n_slots, n_kv, cap, hd)).astype(np.float32)
    # Positions from a few keys (the serial kernel alone) to hundreds (the threaded one).
    positions = np.array([0, 3, 20, 40, 90, 200, 450, 599], np.int64)
    slots = rng.permutation(n_slots).astype(np.int64)
    q = rng.standard_normal((n_slots, n_head, hd)).astype(np.float32)
    out = np.empty((n_slots, n_head, hd), np.float32)
    be.attention(q, k, v, positions, slots, window, 0.17, out)
    for i in range(n_slots):
        one = np.empty((1, n_head, hd), np.float32)
        be.attention(
            np.ascontiguousarray(q[i : i + 1]), k, v, positions[i : i + 1], slots[i : i + 1], window, 0.17, one
        )
        assert np.array_equal(one[0], out[i]), f"row {i} (position {positions[i]}) differs from its one-row call"


# -- engine on the real models -----------------------------------------------------------------------

PROMPTS = [
    "Write a short story about a lighthouse keeper. It begins:",
    "List three facts about volcanoes:",
    "The capital of France is",
    "Explain how a bicycle works, step by step.",
    "Once upon a time, in a small village by the sea,",
    "Q: What is 12 times 7?\nA:",
    "Here is a recipe for bread:",
]
PROSE = (
    "The history of the printing press begins in the fifteenth century, when movable metal type made books "
    "cheaper and faster to produce than ever before. Within decades, presses spread across Europe. "
)
NUM_BATCH = 256  # the long prompt's chunks: 256 and 256 rows on the BLAS path, the rest on the fused one
SAMPLED = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 1234}


# Gemma 3's case (45 s cold on two cores) runs with the slow tests: SmolLM2's keeps batch invariance in the README's run
@pytest.fixture(scope="module", params=["smollm2", pytest.param("gemma3", marks=pytest.mark.slow)])
def pair(request):
    """(a model alone, one slot; the same file with 6 slots for the batch)."""
    path = request.getfixturevalue(f"{request.param}_path")
    alone = load_model(path, num_ctx=640, num_batch=NUM_BATCH)
    batched = load_model(path, num_ctx=640, num_batch=NUM_BATCH, n_slots=6)
    return alone, batched


def _alone(model, ids, options) -> list:
    """The events of ids run alone from an empty cache."""
    model.cache.forget_prefixes()
    return list(model.generate(ids, {"temperature": 0, **options}))


def _text(events) -> str:
    return "".join(e.text for e in events)


def _requests(model) -> list[tuple[int, list[int], dict]]:
    """(earliest step to join, prompt ids, options) for 8 requests."""
    ids = [model.tokenize(p) for p in PROMPTS]
    long_ids = model.tokenize(PROSE * 12)[:540]
    free = _alone(model, ids[3], {"num_predict": 24})
    full = _text(free)
    stop = full[len(full) // 3 : len(full) // 3 + 3]  # a stop string the continuation reaches
    return [
        (0, ids[0], {"num_predict": 24}),
        (0, ids[1], {"num_predict": 6}),
        (1, long_ids, {"num_predict": 8}),  # prefilled in 3 chunks while the others decode
        (1, ids[3], {"num_predict": 24, "stop": [stop]}),
        (2, ids[4], {**SAMPLED, "num_predict": 20}),
        (2, ids[5], {"num_predict": 30}),  # cancelled after 5 tokens
        (4, ids[6], {"num_predict": 16}),  # joins when a slot is free again (6 slots, 8 requests)
        (5, ids[2], {"num_predict": 12}),
    ]


CANCEL = 5  # the request cancelled midway, after CANCEL_AFTER tokens
CANCEL_AFTER = 5


def test_eight_requests_batched_equal_each_alone(pair):
    alone, batched = pair
    requests = _requests(alone)
    refs = [_alone(alone, ids, opts) for _, ids, opts in requests]
    assert refs[3][-1].done_reason == "stop", "the stop string must end request 3"

    batcher = Batcher(batched)
    events: dict[int, list] = {i: [] for i in range(len(requests))}
    which: dict[int, int] = {}  # id(sequence) -> request index
    cancel = threading.Event()
    waiting = list(range(len(requests)))
    step = widest = 0
    while waiting or batcher.sequences:
        for i in list(waiting):
            j, ids, opts = requests[i]
            if j <= step and batcher.free_slots:
                seq = batcher.add(ids, {"temperature": 0, **opts}, cancelled=cancel if i == CANCEL else None)
                which[id(seq)] = i
                waiting.remove(i)
        decoding = {id(s) for s in batcher.sequences if s.state == "decode"}
        widest = max(widest, len(decoding))
        out = batcher.step()
        # chunked prefill never stalls a decode: every decoding sequence got its token this step
        assert decoding <= {id(s) for s, _ in out}
        for seq, evs in out:
            events[which[id(seq)]].extend(evs)
        if len(events[CANCEL]) >= CANCEL_AFTER:
            cancel.set()
        step += 1

    for i, (ref, got) in enumerate(zip(refs, events.values())):
        if i == CANCEL:
            assert got and not isinstance(got[-1], Done), "a cancelled request ends without Done"
            assert got == ref[: len(got)]
            continue
        assert [e.token for e in got[:-1]] == [e.token for e in ref[:-1]], f"request {i}: tokens differ"
        assert got[:-1] == ref[:-1], f"request {i}: token texts differ"
        d, r = got[-1], ref[-1]
        assert isinstance(d, Done)
        for field in ("done_reason", "prompt_eval_count", "prompt_cached_count", "eval_count", "text", "context"):
            assert getattr(d, field) == getattr(r, field), f"request {i}: Done.{field}"
        assert d.total_duration >= d.prompt_eval_duration + d.eval_duration > 0
    assert not batcher.sequences and batcher.free_slots == 6
    assert widest >= 5  # the decode forwards really carried several sequences


# -- prefix reuse ------------------------------------------------------------------------------------


def _greedy(model, ids, n: int, fresh: bool) -> tuple[list[int], Done, list]:
    """Greedy tokens, Done and every token's logprob entries (raw-logit log-softmax: bit-equal logits give equal
    entries), from an empty cache when `fresh`, else reusing what the cache holds."""
    if fresh:
        model.cache.forget_prefixes()
    events = list(model.generate(ids, {"temperature": 0, "num_predict": n}, logprobs=4))
    return [e.token for e in events[:-1]], events[-1], [e.logprobs for e in events[:-1]]


def test_prefix_cached_at_a_chunk_boundary_is_exact(smollm2_path):
    model = load_model(smollm2_path, num_ctx=256, num_batch=16)
    shared = model.tokenize(PROSE * 2)[:48]  # three whole chunks
    a = shared + model.tokenize(" Meanwhile, in Asia,")
    b = shared + model.tokenize(" A question: why did")
    assert a[48] != b[48]
    fresh = _greedy(model, b, 16, fresh=True)
    _greedy(model, a, 4, fresh=True)
    cached = _greedy(model, b, 16, fresh=False)
    assert cached[1].prompt_cached_count == 48  # the shared chunks came from the cache
    assert cached[0] == fresh[0] and cached[2] == fresh[2]


@pytest.mark.parametrize("name", ["smollm2", pytest.param("gemma3", marks=pytest.mark.slow)])
# 270 (a BLAS piece and a per-row tail) with SmolLM2 in the README's run; the rest with the slow tests (20-60 s each
# cold on two cores)
@pytest.mark.parametrize(
    "words", [pytest.param(0, marks=pytest.mark.slow), 270, pytest.param(330, marks=pytest.mark.slow)]
)
def test_a_follow_up_that_reuses_the_earlier_turn_is_exact(request, name, words):
    """The cache holds the last turn (prompt chunks + decoded tokens); the follow-up reuses what was computed on
    the path a fresh evaluation of it takes: short prompts are per-row throughout (everything but the new text
    is reused); a 270-token one keeps its first 256-position BLAS piece and its per-row tail (the follow-up's tail
    is per-row too); a 330-token one keeps only the piece (the follow-up's second piece is evaluated whole). Tokens
    and logprobs equal a fresh run's."""
    model = load_model(request.getfixturevalue(f"{name}_path"), num_ctx=1024)
    more = model.tokenize(" Then, suddenly,")[1 if name == "gemma3" else 0 :]  # without gemma's BOS
    for text in PROMPTS[:3]:
        ids = model.tokenize(text + PROSE * 12)[:words] if words else model.tokenize(text)
        out = _greedy(model, ids, 12, fresh=True)[0]
        follow = ids + out + more
        cached = _greedy(model, follow, 12, fresh=False)
        fresh = _greedy(model, follow, 12, fresh=True)
        want = 256 if words > 300 else len(follow) - len(more) - 1  # the first piece / all but the new text
        assert cached[1].prompt_cached_count == want
        assert cached[0] == fresh[0], f"{text!r}: tokens differ"
        assert cached[2] == fresh[2], f"{text!r}: logprobs differ"


def test_a_prefix_copied_from_another_running_slot_is_exact(smollm2_path):
    """A shared system prompt: the second request arrives while the first decodes, copies its prompt's keys from
    the first one's slot, and gives what it gives alone."""
    model = load_model(smollm2_path, num_ctx=1024, n_slots=2)
    system = model.tokenize(PROSE * 12)[:300]
    a, b = system + model.tokenize(" Summary:"), system + model.tokenize(" In one word:")
    alone = _greedy(model, b, 12, fresh=True)
    model.cache.forget_prefixes()
    batcher = Batcher(model)
    first = batcher.add(a, {"temperature": 0, "num_predict": 40})
    for _ in range(3):  # a's prompt (two chunks) and its first decode step
        batcher.step()
    second = batcher.add(b, {"temperature": 0, "num_predict": 12}, logprobs=4)
    assert second.slot != first.slot and second.n_cached == 300  # a's first BLAS piece and per-row tail, copied
    got = []
    while not second.finished:
        got += [e for s, events in batcher.step() if s is second for e in events]
    assert [e.token for e in got[:-1]] == alone[0]
    assert [e.logprobs for e in got[:-1]] == alone[2]
    assert got[-1].prompt_cached_count == 300 and got[-1].prompt_eval_count == len(b)


def test_a_prompt_evaluates_the_same_whatever_its_chunks(smollm2_path):
    """num_batch only changes speed within its multiples: 768 tokens in chunks of 256 or 512 give the same logits,
    and an 80-token prompt (one piece) the same with either."""
    small = load_model(smollm2_path, num_ctx=1024, num_batch=256)
    big = load_model(smollm2_path, num_ctx=1024, num_batch=512)
    for n in (768, 80):
        ids = small.tokenize(PROSE * 20)[:n]
        assert np.array_equal(small.logits(ids)[-3:], big.logits(ids)[-3:]), n


def test_short_prompts_that_arrive_together_start_in_one_step(smollm2_path):
    """Three short prompts added at once all get their first token from the first step (their chunks fit
    PREFILL_ROWS_PER_STEP); a long prompt behind a short one waits for the next step, and a short one behind the
    long one does not pass it. Each gives what it gives alone."""
    model = load_model(smollm2_path, num_ctx=1024, n_slots=5)
    short = [model.tokenize(p) for p in PROMPTS[:3]]
    long_ids = model.tokenize(PROSE * 12)[: PREFILL_ROWS_PER_STEP + 40]
    late = model.tokenize(PROMPTS[4])
    refs = [_greedy(model, ids, 4, fresh=True)[0] for ids in (*short, long_ids, late)]
    batcher = Batcher(model)
    seqs = [batcher.add(ids, {"temperature": 0, "num_predict": 4}) for ids in (*short, long_ids, late)]
    got = {id(s): [] for s in seqs}

    def step():
        out = batcher.step()
        for s, events in out:
            got[id(s)] += [e.token for e in events if isinstance(e, Token)]
        return {id(s) for s, events in out if any(isinstance(e, Token) for e in events)}

    assert step() == {id(s) for s in seqs[:3]}
    assert [s.state for s in seqs[3:]] == ["prefill", "prefill"]
    assert seqs[3].progress.computed == seqs[4].progress.computed == 0
    while batcher.sequences:
        step()
    assert [got[id(s)] for s in seqs] == refs
