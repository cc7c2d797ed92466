"""Speculative decoding on both real models: the same tokens with and without drafts, token for token.

Copy-heavy prompts (repeat a paragraph with one change, quote a JSON object) make prompt lookup draft and
accept; the planner is given a flat cost model (every forward costs the same, as on a wide GPU) so that it
drafts wherever a match exists whatever the load of the machine running the tests. Checked: greedy output,
a seeded sampled one, a stop string inside the copied passage, a JSON schema constraint, and the first
precondition of all, that a verify forward's rows are bit-identical to one-token decode steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from localrt import load_model
from localrt.engine.speculative import CostModel, priors

PARAGRAPH = (
    "The committee met on Tuesday to review the budget. After a long discussion, the members agreed to "
    "increase funding for the library by ten percent and to postpone the decision on the new parking lot."
)
ASK = f"Repeat this paragraph exactly, changing Tuesday to Friday:\n\n{PARAGRAPH}"
REPEAT = "Say it again: " + "the red fox jumps over the lazy brown dog, " * 4
JSON_ASK = 'Copy this JSON object exactly: {"name": "Alice Smith", "city": "Lisbon", "age": 31, "tags": ["a", "b"]}'
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "city": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "city", "age"],
}


class FlatCosts(CostModel):
    def cost(self, rows: int) -> float:
        return 1.0


def _chat(name: str, text: str) -> str:
    if name == "smollm2":
        return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    m = load_model(request.getfixturevalue(f"{request.param}_path"), num_ctx=512, num_batch=64)
    priors(m).costs = FlatCosts()
    m.name = request.param
    return m


def _run(model, text: str, options: dict, constraint=None) -> list:
    model.cache.forget_prefixes()
    return list(model.generate(model.tokenize(_chat(model.name, text)), options, constraint=constraint))


def _same(a: list, b: list) -> None:
    assert [e.token for e in a[:-1]] == [e.token for e in b[:-1]]
    assert [e.text for e in a[:-1]] == [e.text for e in b[:-1]]
    for field in ("done_reason", "eval_count", "text", "context"):
        assert getattr(a[-1], field) == getattr(b[-1], field), field


def test_verify_rows_equal_one_token_decode(model):
    """The precondition: k + 1 rows of one sequence in one forward give each row's one-token-step logits."""
    ids = model.tokenize(_chat(model.name, ASK))
    cache = model.cache
    cache.clear(0)
    logits = model.forward(model.batch(ids, 0), cache, output_rows=np.array([len(ids) - 1]))[0]
    steps, rows = [], []
    for i in range(model_rows := 15):  # the most rows one sequence carries (CPUBackend.invariant_run)
        t = int(np.argmax(logits))
        steps.append(t)
        logits = model.forward(model.batch([t], len(ids) + i), cache)[0]
        rows.append(logits)
    cache.trim(0, len(ids))
    verified = model.forward(model.batch(steps, len(ids)), cache)  # (15, n_vocab)
    for i in range(model_rows):
        assert np.array_equal(verified[i], rows[i]), f"row {i}"
    model.cache.forget_prefixes()


def test_greedy_identical_and_drafts_accepted(model):
    spec = _run(model, ASK, {"temperature": 0, "num_predict": 40})
    plain = _run(model, ASK, {"temperature": 0, "num_predict": 40, "draft_num_predict": 0})
    _same(spec, plain)
    done = spec[-1]
    assert done.draft_accepted_count >= 20 and done.draft_count >= done.draft_accepted_count
    assert plain[-1].draft_count is None


def test_seeded_sampling_identical(model):
    # A text both models repeat when sampled (Gemma 3, a base model, paraphrases the paragraph of ASK at this
    # temperature, and the model's acceptance record then rightly stops it drafting).
    opts = {"temperature": 0.3, "top_k": 40, "top_p": 0.95, "seed": 42, "num_predict": 32}
    spec = _run(model, REPEAT, opts)
    _same(spec, _run(model, REPEAT, {**opts, "draft_num_predict": 0}))
    assert spec[-1].draft_accepted_count > 0


def test_stop_string_inside_the_copied_passage(model):
    opts = {"temperature": 0, "num_predict": 60, "stop": ["ten percent"]}
    spec = _run(model, ASK, opts)
    _same(spec, _run(model, ASK, {**opts, "draft_num_predict": 0}))
    assert spec[-1].done_reason == "stop" and "ten percent" not in "".join(e.text for e in spec)


def test_json_schema_constraint(model):
    from localrt.structured import compile_format

    opts = {"temperature": 0, "num_predict": 32}
    spec = _run(model, JSON_ASK, opts, compile_format(SCHEMA, model.tokenizer))
    plain = _run(model, JSON_ASK, {**opts, "draft_num_predict": 0}, compile_format(SCHEMA, model.tokenizer))
    _same(spec, plain)
    assert spec[-1].draft_count > 0
