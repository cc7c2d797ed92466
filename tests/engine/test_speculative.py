"""Speculative decoding by prompt lookup (localrt.engine.speculative), on units and a tiny random model.

The draft index and the planner are table-tested. On a tiny random model (drafting forced on: a cost model
in which extra rows are free) seeded sampling gives the same tokens with and without drafts, and the
distribution of the first two sampled tokens matches the exact one computed from the model's logits
(chi-square); a drafted token a grammar forbids ends the accepted run at once. Options: draft_num_predict
is range-checked and draft_model must be a model name (tests/engine/test_draft_model.py drafts with one).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fixtures.decoders import small, write_model
from _sampling_oracle import compare, exact_joint

from localrt import load_model
from localrt.api.options import DRAFT_MAX, resolve
from localrt.engine.batch import Batcher
from localrt.engine.events import Done
from localrt.engine.speculative import (
    CONTEXT,
    LONG,
    LONG_AGREE,
    CostModel,
    DraftState,
    NgramIndex,
    Speculator,
    agreement,
    expected_tokens,
    kept_positions,
    priors,
    verify,
)
from localrt.errors import InvalidRequest


class FlatCosts(CostModel):
    """Every forward costs the same whatever its rows (a wide GPU's picture): drafting always pays."""

    def cost(self, rows: int) -> float:
        return 1.0


# -- draft index -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens,k,expected",
    [
        ([1, 2, 3, 4, 1, 2, 3], 3, (3, [4, 1, 2])),  # the 3-gram (1, 2, 3) occurred before
        ([1, 2, 3, 4, 9, 2, 3], 2, (2, [4, 9])),  # only the 2-gram (2, 3) matches
        ([5, 6, 7, 8, 7], 4, (1, [8, 7])),  # a 1-gram; the continuation runs to the end of the list
        ([1, 2, 3, 4], 3, (0, [])),  # nothing occurred before
        ([1, 2, 1, 5, 1, 2, 1, 6, 1, 2, 1], 1, (3, [6])),  # equal context: the most recent occurrence wins
        # (3, 4, 5) follows (1, 2) at the start and 8 later: the occurrence whose context agrees longest wins
        ([1, 2, 3, 4, 5, 6, 7, 8, 3, 4, 5, 9, 1, 2, 3, 4, 5], 3, (3, [6, 7, 8])),
        ([7, 7, 7, 7], 3, (3, [7])),  # overlapping occurrences
        ([1, 2, 3, 1, 2], 0, (0, [])),
    ],
)
def test_ngram_draft(tokens, k, expected):
    assert NgramIndex().draft(tokens, k) == expected


def test_a_match_with_a_long_agreeing_context_is_its_own_class():
    passage = list(range(10, 10 + LONG_AGREE + 6))
    # the last LONG_AGREE tokens repeat the passage's first ones: a copy under way, whose drafts run on
    assert NgramIndex().draft(passage + [5] + passage[:LONG_AGREE], 3) == (LONG, passage[LONG_AGREE : LONG_AGREE + 3])
    # one token fewer agrees: the 3-gram match it is
    assert NgramIndex().draft(passage + [5] + passage[1:LONG_AGREE], 3) == (3, passage[LONG_AGREE : LONG_AGREE + 3])
    st = DraftState(16)
    assert st.rate(LONG) == 0.9 and st.rate(3) == 0.75  # the priors: measured acceptance of each class
    st.observe(LONG, 8, 2)
    assert st.rate(LONG) < 0.9 and st.rate(3) == 0.75  # evidence is kept per class


def test_agreement_counts_the_context_before_a_match():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 3, 4, 5, 9, 1, 2, 3, 4, 5]
    assert [agreement(tokens, c) for c in (5, 11, 4)] == [5, 3, 0]
    assert agreement([7] * 40, 30) == CONTEXT  # bounded


def test_ngram_index_follows_a_growing_list():
    idx, tokens = NgramIndex(), [1, 2, 3]
    assert idx.draft(tokens, 2) == (0, [])
    tokens += [9, 1, 2]
    assert idx.draft(tokens, 2) == (2, [3, 9])
    tokens += [3]
    assert idx.draft(tokens, 5) == (3, [9, 1, 2, 3])


# -- planning ----------------------------------------------------------------------------------------


def _cpu_costs() -> CostModel:
    """Costs measured on a 2-core CPU (SmolLM2): an extra row costs most of a one-row forward."""
    costs = CostModel()
    for rows, ms in {1: 8.1, 2: 13.2, 3: 18.6, 4: 17.8, 5: 24.0, 6: 28.8, 7: 33.0, 8: 34.4}.items():
        costs.record(rows, ms / 1e3)
    return costs


def _seq(history, max_draft=16):
    return SimpleNamespace(history=list(history), draft=DraftState(max_draft))


COPY = list(range(10, 40)) + [5] + list(range(10, 20))  # the suffix continues an earlier passage


def _step(spec, seq, limit=100):
    """Plan one sequence's step and record that it ran (as Batcher.execute does): its one Row."""
    [[row]] = spec.plan([seq], [limit])
    seq.draft.ran(len(row.draft) or row.propose)
    return row


def test_plan_drafts_where_it_pays_and_stops_where_it_does_not():
    spec = Speculator(max_rows=254, max_run=15, costs=_cpu_costs())
    seq = _seq(COPY)
    assert spec.plan([seq], [100]) == spec.plan([seq], [100])  # planning changes nothing
    _, n, draft, _ = _step(spec, seq)
    assert n == LONG and draft == tuple(range(20, 20 + len(draft))) and len(draft) >= 3  # 10 tokens agree
    for _ in range(3):  # the sequence stops copying: every draft is rejected at once
        seq.draft.observe(LONG, 4, 0)
    assert _step(spec, seq).draft == ()  # not worth a verify row any more
    for _ in range(200):  # no drafting for a long while: the evidence decays, and a probe is made
        seq.draft.ran(0)
    assert _step(spec, seq).draft


def test_a_step_without_a_draft_relaxes_the_cap_a_rejection_set():
    # After a draft of 4 with 1 accepted the cap is 2 and the rate 2/3: at CPU costs one or two drafted tokens
    # (2-3 rows) do not pay, three (a 4-row forward) do. The step without a draft raises the cap, so the
    # sequence drafts three the step after instead of never drafting again.
    spec = Speculator(max_rows=254, max_run=15, costs=_cpu_costs())
    seq = _seq(COPY[:30] + [5] + COPY[-LONG_AGREE + 1 :])  # a 3-gram match: fewer than LONG_AGREE tokens agree
    seq.draft.observe(3, 4, 1)
    assert seq.draft.length == 2
    assert _step(spec, seq).draft == () and seq.draft.length == 4
    _, n, draft, _ = _step(spec, seq)
    assert n == 3 and draft == (20, 21, 22)
    assert seq.draft.length == 4  # a step that drafts leaves the cap to the verification (observe)


def test_plan_respects_limits_and_row_budgets():
    spec = Speculator(max_rows=6, max_run=4, costs=FlatCosts())
    seqs = [_seq(COPY) for _ in range(3)]
    groups = spec.plan(seqs, [100, 1, 100])
    # seq 0: 1 + 3 rows (max_run), leaving the pending rows of seqs 1 and 2 room in the same forward, so they
    # draft nothing rather than push a sequence into a second forward
    assert [[len(r.draft) for r in g] for g in groups] == [[3, 0, 0]]
    assert sum(1 + len(r.draft) for r in groups[0]) <= 6
    groups = Speculator(max_rows=6, max_run=4, costs=FlatCosts()).plan(seqs[:2], [100, 1])
    assert [[len(r.draft) for r in g] for g in groups] == [[3, 1]]  # seq 1: its limit
    assert _step(spec, _seq(COPY), limit=0).draft == ()  # no room left in the context or num_predict


def test_draft_length_adapts():
    st = DraftState(max_draft=10)
    assert st.length == 4
    st.observe(3, 4, 4)
    assert st.length == 8
    st.observe(3, 8, 8)
    assert st.length == 10
    st.observe(3, 10, 2)
    assert st.length == 3 and (st.drafted_count, st.accepted_count) == (22, 14)
    assert st.rate(3) > st.rate(1) == 0.75  # evidence for 3-gram matches only


def test_cost_model_median_and_guesses():
    c = CostModel()
    assert c.cost(1) == 1.0 and c.cost(3) > c.cost(2) > 1.0
    for s in (0.010, 0.011, 0.5, 0.009):  # one outlier of a busy machine
        c.record(1, s)
    assert c.cost(1) == pytest.approx(0.0105)
    c.record(4, 0.030)
    assert c.cost(4) == 0.030 and c.cost(6) >= 0.030
    assert expected_tokens(1.0, 3) == 4.0 and expected_tokens(0.5, 2) == 1.75


def test_cost_model_guesses_from_the_measured_counts():
    """An unmeasured count lies on the measured counts' line: a CPU whose extra rows cost 0.15 forwards is expected to
    run 4 rows in 1.45 forwards, not GUESS_SLOPE's 1.6, so drafts of that length get tried and measured."""
    from localrt.engine import speculative

    c = CostModel()
    for rows, s in ((1, 0.010), (2, 0.0115), (3, 0.013)):
        c.record(rows, s)
    assert c.cost(4) == pytest.approx(0.0145) and c.cost(6) == pytest.approx(0.0175)
    c.record(8, 0.021)
    assert c.cost(5) == pytest.approx(0.013 + 0.008 * 2 / 5)  # between 3 and 8 on their line
    steep = CostModel()
    for rows, s in ((1, 0.010), (2, 0.018)):
        steep.record(rows, s)
    assert steep.cost(3) == pytest.approx(0.018 + 0.010 * speculative.GUESS_SLOPE)  # the optimistic slope, not 0.8


class _Drafter:
    """What the planner reads of a draft model (draft_model.ModelDrafter.draft_costs and propose), at given costs: its
    drafts are the sequence's own continuation, so every one would be accepted."""

    def __init__(self, first: float, each: float) -> None:
        self.first, self.each = first, each

    def draft_costs(self, seq, costs):
        return self.first, self.each

    def propose(self, seq, k):
        return list(range(k))


def test_a_draft_model_drafts_only_where_its_forwards_pay():
    """A draft model whose forwards cost about what the target's do never pays on a CPU, however often it is right.
    The figures are a Q8_0 Gemma 3 270M's and its Q4_K_M draft's, measured as it ran (ms): the target's 2-row median
    below its 1-row one, the draft's one-token forward 13.3, its 2-row catch-up 14.6. Before the catch-up was priced
    and the target's costs kept from falling with rows, the planner drafted there: 20 of 64 tokens, at 0.83x. A
    draft at a tenth of the cost pays."""
    costs = CostModel()
    for rows, ms in ((1, 14.9), (2, 14.8), (3, 16.5)):  # the 2-row median below the 1-row one
        costs.record(rows, ms / 1e3)
    seq = _seq(COPY)
    seq.draft.accepted[0] = 50.0  # the draft has been right 50 times in a row
    for first, each, drafts in ((0.0146, 0.0133, False), (0.0015, 0.0013, True)):
        seq.draft.source = _Drafter(first, each)
        [[row]] = Speculator(max_rows=16, max_run=15, costs=costs).plan([seq], [100])
        assert row.draft == () and bool(row.propose) == drafts, (first, each, row)  # proposed as the step runs


def test_the_draft_models_first_forward_catches_up(tmp_path):
    """draft_costs prices the draft's first forward at the rows it has not evaluated: the pending token at least."""
    from localrt.engine.draft_model import ModelDrafter

    write_model(tmp_path / "m.gguf", small(seed=3))
    target, draft = load_model(tmp_path / "m.gguf", num_ctx=64), load_model(tmp_path / "m.gguf", num_ctx=64)
    drafter = ModelDrafter(target, draft, "m")
    for rows, s in ((1, 0.010), (2, 0.012), (4, 0.016)):
        priors(draft).costs.record(rows, s)
        priors(target).costs.record(rows, s)
    seq = SimpleNamespace(slot=0, history=[1, 2, 3, 4, 5])
    drafter.cached[0] = [1, 2, 3, 4, 5]  # all seen: the pending token's logits are evaluated again
    assert drafter.draft_costs(seq, priors(target).costs) == (0.010, 0.010)
    drafter.cached[0] = [1, 2, 3]
    assert drafter.draft_costs(seq, priors(target).costs) == (0.012, 0.010)
    drafter.cached[0] = [1]
    assert drafter.draft_costs(seq, priors(target).costs) == (0.016, 0.010)
    drafter.close()
    target.close()


def test_kept_positions():
    history = [1, 2, 3, 4, 5]
    assert kept_positions(history, 2, [3, 4, 9]) == 4  # rows at 2, 3 hold history's tokens; 4 was a rejected draft
    assert kept_positions(history, 4, [5, 6, 7]) == 5  # the last token's row, drafts past the end of history
    assert kept_positions(history, 2, [3]) == 3


# -- options -----------------------------------------------------------------------------------------


def test_draft_options():
    assert resolve().draft_num_predict == 16 and resolve({"draft_num_predict": 0}).draft_num_predict == 0
    assert resolve({"draft_num_predict": DRAFT_MAX}).draft_num_predict == DRAFT_MAX
    for bad in (-1, DRAFT_MAX + 1, 2.5, "4", True):
        with pytest.raises(InvalidRequest, match="draft_num_predict"):
            resolve({"draft_num_predict": bad})
    assert resolve({"draft_model": ""}).draft_model == ""
    assert resolve({"draft_model": "smollm2:135m"}).draft_model == "smollm2:135m"
    assert resolve({"draft_model": "smollm2"}).load_options()["draft_model"] == "smollm2"  # loaded beside the model
    for bad in ("two words", "x" * 513, "tab\there"):
        with pytest.raises(InvalidRequest, match="draft_model"):
            resolve({"draft_model": bad})
    with pytest.raises(InvalidRequest, match="draft_model"):
        resolve({"draft_model": 3})


def test_modelfile_draft_parameters():
    import modelfile

    m = modelfile.parse("FROM x\nPARAMETER draft_num_predict 8\nPARAMETER draft_model tiny\n")
    assert m.parameters == {"draft_num_predict": 8, "draft_model": "tiny"}


# -- a tiny random model -----------------------------------------------------------------------------


def test_a_models_batchers_share_its_priors_which_go_with_it(tmp_path):
    """priors(model): one cost model and one acceptance record per loaded model, for every Batcher of it, not kept
    on the model and not keeping it alive."""
    import gc
    import weakref

    write_model(tmp_path / "m.gguf", small(seed=3))
    model, other = load_model(tmp_path / "m.gguf", num_ctx=64), load_model(tmp_path / "m.gguf", num_ctx=64)
    assert not hasattr(model, "forward_costs") and not hasattr(model, "draft_evidence")
    mine = priors(model)
    assert priors(model) is mine and priors(other) is not mine
    first, second = Batcher(model), Batcher(model)
    assert first._spec.costs is mine.costs and second._spec.costs is mine.costs
    assert first.add([40, 41, 42], {"temperature": 0}).draft.shared is mine.evidence
    gone = weakref.ref(mine)
    del first, second, mine
    model.close()
    del model
    gc.collect()
    assert gone() is None and priors(other).costs is not None
    other.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "tiny.gguf"
    write_model(path, small(seed=3))
    model = load_model(path, num_ctx=128, num_batch=32, n_slots=4)
    priors(model).costs = FlatCosts()  # drafting forced on wherever a match exists
    return model


# The tiny model's logits are far apart (its tied embedding favours repeating the last token): a high
# temperature over the top 2 gives every step two likely tokens.
SAMPLED = {"temperature": 15.0, "top_k": 2, "top_p": 1.0, "repeat_penalty": 1.0}
PROMPT = [40, 40, 41, 40, 40]  # after a sampled 40 the 1-gram (40,) drafts 40, accepted or not


def _run(model, ids, options) -> list:
    model.cache.forget_prefixes()
    return list(model.generate(ids, options))


def _many(model, ids, options: list[dict]) -> list[list]:
    """The events of one request per options, stepped through one Batcher as slots free up."""
    b, waiting, out = Batcher(model), list(range(len(options))), [[] for _ in options]
    which: dict[int, int] = {}
    while waiting or b.sequences:
        while waiting and b.free_slots:
            i = waiting.pop(0)
            which[id(b.add(ids, options[i]))] = i
        for seq, evs in b.step():
            out[which[id(seq)]].extend(evs)
    return out


def test_seeded_sampling_equals_plain_decoding(tiny):
    runs = [{**SAMPLED, "seed": seed, "num_predict": 8} for seed in range(24)]
    spec = _many(tiny, PROMPT, runs)
    plain = _many(tiny, PROMPT, [{**r, "draft_num_predict": 0} for r in runs])
    for s, p in zip(spec, plain):
        assert [e.token for e in s[:-1]] == [e.token for e in p[:-1]]
        assert p[-1].draft_count is None
    assert sum(s[-1].draft_accepted_count for s in spec) > 24


def test_sampled_distribution_is_the_models(tiny):
    """Joint distribution of three sampled tokens (the last two from a verify step): exact, from the model's
    logits, vs 1000 seeded runs."""

    exact = exact_joint(tiny, PROMPT, 3, SAMPLED["temperature"])  # the chain of SAMPLED: top 2, then softmax
    n = 1000
    runs = _many(tiny, PROMPT, [{**SAMPLED, "seed": 10_000 + i, "num_predict": 3} for i in range(n)])
    chi2, tv, counts = compare([tuple(e.token for e in ev[:-1]) for ev in runs], exact)
    accepted = sum(ev[-1].draft_accepted_count > 0 for ev in runs)
    rejected = sum(ev[-1].draft_count > ev[-1].draft_accepted_count for ev in runs)
    assert accepted > n // 4 and rejected > n // 10  # both branches of the acceptance test ran
    # 7 degrees of freedom: P(chi2 > 35) is about 1e-5. The seeds are fixed, so the test is deterministic.
    assert chi2 < 35, (chi2, counts, exact)
    assert tv < 0.06


def test_several_sequences_draft_in_one_forward(tiny):
    ids = [40, 41, 42, 43, 40, 41, 42]
    prompts = [ids, ids[1:] + ids, ids + ids]
    refs = [
        [e.token for e in _run(tiny, p, {"temperature": 0, "num_predict": 12, "draft_num_predict": 0})[:-1]]
        for p in prompts
    ]
    rows_per_forward: list[tuple[int, int]] = []  # (rows, distinct slots) of each decode forward
    forward = tiny.forward

    def counting(batch, cache, output_rows=None):
        if output_rows is None:
            rows_per_forward.append((len(batch), len(set(batch.slots.tolist()))))
        return forward(batch, cache, output_rows)

    tiny.forward = counting
    try:
        b = Batcher(tiny)
        seqs = [b.add(p, {"temperature": 0, "num_predict": 12}) for p in prompts]
        events = {id(s): [] for s in seqs}
        while b.sequences:
            for s, evs in b.step():
                events[id(s)].extend(evs)
    finally:
        del tiny.forward
    for s, ref in zip(seqs, refs):
        assert [e.token for e in events[id(s)][:-1]] == ref
        assert isinstance(events[id(s)][-1], Done)
    assert any(slots >= 2 and rows > slots for rows, slots in rows_per_forward), rows_per_forward


def test_a_draft_the_grammar_forbids_ends_the_run(tiny):
    from localrt.structured import compile_format

    seq = Batcher(tiny).add(
        [40, 41, 42], {"temperature": 0}, constraint=compile_format({"type": "object"}, tiny.tokenizer)
    )
    brace = tiny.tokenizer.encode("{", add_special=False)[0]
    x = 120  # "x": no JSON document starts with it
    logits = np.zeros((3, tiny.config.n_vocab), np.float32)  # (pending + 2 drafts, n_vocab)
    logits[:, x] = 10.0  # the model's favourite is the drafted x ...
    logits[:, brace] = 5.0  # ... the grammar allows "{"
    events = verify(seq, logits, 3, [x, x])
    assert [e.token for e in events] == [brace]
    assert (seq.draft.drafted_count, seq.draft.accepted_count) == (2, 0)
    assert seq.progress.pending == brace


def test_cost_samples_expire():
    from localrt.engine import speculative

    c = CostModel()
    c.record(4, 5.0)  # measured while the machine was busy
    for _ in range(speculative.HORIZON):
        c.record(1, 0.01)
    assert c.cost(4) == pytest.approx(0.01 * (1 + 3 * speculative.GUESS_SLOPE))  # guessed again: re-measured


def test_final_reply_and_verbose_output_carry_the_draft_counts():
    from localrt.cli.cli_format import verbose_stats
    from localrt.runtime.sampling_extras import metrics as _metrics

    on = _metrics(Done("stop", eval_count=30, eval_duration=10, draft_count=24, draft_accepted_count=18), 0)
    assert (on["draft_count"], on["draft_accepted_count"]) == (24, 18)
    assert on["eval_count"] == 30 and on["done_reason"] == "stop"  # Ollama's fields as they were
    off = _metrics(Done("stop", eval_count=30, eval_duration=10), 0)
    assert "draft_count" not in off and "draft_accepted_count" not in off
    text = verbose_stats(on)
    assert "draft count:          24 token(s)" in text and "draft accepted:       18 token(s) (75.0%)" in text
    assert "draft" not in verbose_stats(off)
