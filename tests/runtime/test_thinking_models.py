"""Issue 44's hard cases on real weights: the built-in SmolLM2 under a template that opens the reasoning block (as
the DeepSeek-R1 distills' templates do), so everything it writes is reasoning until a `</think>` it never writes.
num_predict and a stop string inside the reasoning, logprobs of reasoning tokens, speculative decoding during
reasoning (prompt lookup and a draft model, drafts accepted inside the reasoning), a format that leaves the
reasoning alone; and the constraint that starts after the closing tag, on the real tokenizer."""

from __future__ import annotations

import json

import httpx
import numpy as np
import ollama
import pytest
from _daemon_fakes import real_daemon

from localrt import structured
from localrt.engine import speculative
from localrt.engine.loader import load_model
from localrt.models import builtin_models
from localrt.structured.after import AfterReasoning

OPENED = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ if .Thinking }}<think>{{ .Thinking }}</think>\n{{ end }}"
    "{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n<think>\n"
)
ASK = [{"role": "user", "content": "Why is the sky blue?"}]
COPY = [{"role": "user", "content": "Repeat after me three times: the quick brown fox jumps over the lazy dog."}]
GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with real_daemon(tmp_path_factory.mktemp("models")) as srv:
        c = ollama.Client(host=srv.url)
        c.create(model="opened", from_="smollm2:135m", template=OPENED)
        # SmolLM2 drafting for itself: the draft model shares the tokenizer, and its drafts are the model's own tokens
        r = httpx.post(
            srv.url + "/api/create",
            json={
                "model": "opened-paired",
                "from": "opened",
                "stream": False,
                "parameters": {"draft_model": "smollm2:135m"},
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
        yield srv


@pytest.fixture(scope="module")
def client(daemon):
    return ollama.Client(host=daemon.url)


def _chat(srv, model: str, messages: list, stream: bool = False, **options) -> dict:
    """A native chat as JSON (the ollama client's types drop the draft counts), a stream's chunks merged: the
    reasoning and the answer joined, the rest from the final chunk."""
    body = {"model": model, "messages": messages, "stream": stream, "options": {**GREEDY, **options}}
    r = httpx.post(srv.url + "/api/chat", json=body, timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()
    chunks = [json.loads(line) for line in r.text.splitlines() if line]
    assert chunks[-1]["done"] and all(not c["done"] for c in chunks[:-1])
    return {
        **chunks[-1],
        "message": {k: "".join(c["message"].get(k) or "" for c in chunks) for k in ("thinking", "content")},
    }


def test_num_predict_running_out_inside_the_reasoning(client):
    r = client.chat(model="opened", messages=ASK, options={**GREEDY, "num_predict": 12})
    assert r.done_reason == "length" and r.eval_count == 12
    assert r.message.thinking and r.message.content == ""


def test_a_stop_string_inside_the_reasoning_ends_it_there(client):
    whole = client.chat(model="opened", messages=ASK, options={**GREEDY, "num_predict": 24}).message.thinking
    words = whole.split()
    stop = words[len(words) // 2]
    cut = client.chat(model="opened", messages=ASK, options={**GREEDY, "num_predict": 24, "stop": [stop]})
    assert cut.done_reason == "stop" and cut.message.content == ""
    assert cut.message.thinking == whole[: whole.index(stop)].rstrip()


def test_reasoning_tokens_carry_their_logprobs(client):
    parts = list(
        client.chat(
            model="opened",
            messages=ASK,
            options={**GREEDY, "num_predict": 10},
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
    )
    entries = [e for p in parts for e in (p.logprobs or [])]
    assert len(entries) == 10 and all(len(e.top_logprobs) == 2 for e in entries)
    assert "".join(e.token for e in entries).startswith(parts[0].message.thinking[:3])


@pytest.fixture
def drafts_pay(monkeypatch):
    """Every forward costs the same whatever its rows (a GPU's few extra rows are nearly free): the planner drafts at
    every n-gram match. On this CPU whether a draft pays is measured, and a busy machine can switch drafting off."""
    monkeypatch.setattr(speculative.CostModel, "cost", lambda self, rows: 1.0)


@pytest.mark.parametrize("stream", [False, True])
def test_speculative_decoding_during_reasoning_changes_nothing(daemon, drafts_pay, stream):
    plain = _chat(daemon, "opened", COPY, stream, num_predict=40, draft_num_predict=0)
    assert "draft_count" not in plain  # speculation off: no counts
    drafted = _chat(daemon, "opened", COPY, stream, num_predict=40)
    # everything the model writes under this template is reasoning: the drafts were made and verified inside it
    assert drafted["message"]["content"] == plain["message"]["content"] == ""
    assert drafted["message"]["thinking"] == plain["message"]["thinking"] and "fox" in plain["message"]["thinking"]
    assert drafted["eval_count"] == plain["eval_count"] == 40 and drafted["done_reason"] == "length"
    assert 0 < drafted["draft_accepted_count"] <= drafted["draft_count"]


def test_a_draft_model_drafts_during_reasoning(daemon):
    # Seeded sampling: the draft length follows acceptance only (never timing), so the draft model always drafts;
    # as its own draft, SmolLM2's proposals have the target's probabilities, so they are accepted.
    opts = {"num_predict": 24, "temperature": 0.8, "top_k": 40, "seed": 7}
    runs = [_chat(daemon, "opened-paired", ASK, **opts) for _ in range(2)]
    got = runs[0]
    assert got["message"]["thinking"] and got["message"]["content"] == "" and got["done_reason"] == "length"
    assert got["draft_count"] > 0 and got["draft_accepted_count"] > 0
    assert runs[1]["message"] == got["message"]  # reproducible with the draft model
    streamed = _chat(daemon, "opened-paired", ASK, stream=True, **opts)
    assert {k: got["message"][k] for k in streamed["message"]} == streamed["message"]
    assert streamed["draft_count"] == got["draft_count"]


def test_a_format_leaves_the_reasoning_unconstrained(client):
    free = client.chat(model="opened", messages=ASK, options={**GREEDY, "num_predict": 12})
    formatted = client.chat(model="opened", messages=ASK, format="json", options={**GREEDY, "num_predict": 12})
    assert formatted.message.thinking == free.message.thinking  # the schema waits for the answer


@pytest.fixture(scope="module")
def tokenizer():
    model = load_model(builtin_models.smollm2_path(), num_ctx=256)
    yield model.tokenizer
    model.close()


def _feed(constraint, tokenizer, text: str) -> None:
    for t in tokenizer.encode(text, add_special=False):
        constraint.advance(t)


def test_the_constraint_holds_from_the_closing_tag_on(tokenizer):
    inner_start = structured.compile_format("json", tokenizer).allowed_mask()
    c = AfterReasoning(structured.compile_format("json", tokenizer), b"</think>", b"<think>", opened=False)
    first = c.allowed_mask()  # reasoning may open, or the answer start: nothing else
    assert first[tokenizer.encode("<", add_special=False)[0]] and first[tokenizer.encode("{", add_special=False)[0]]
    assert not first[tokenizer.encode("Hello", add_special=False)[0]]
    _feed(c, tokenizer, '<think>Let me write some JSON: {"a" Hello')
    assert c.allowed_mask().all() and c.done()  # inside the reasoning: anything, and it may end
    _feed(c, tokenizer, "</think>")
    assert np.array_equal(c.allowed_mask(), inner_start) and not c.done()  # the answer must be the JSON
    _feed(c, tokenizer, '{"a": 1}')
    assert c.done()


def test_an_answer_without_reasoning_is_constrained_from_its_start(tokenizer):
    c = AfterReasoning(structured.compile_format("json", tokenizer), b"</think>", b"<think>", opened=False)
    _feed(c, tokenizer, "{")
    assert c.open and not c.allowed_mask()[tokenizer.encode("Hello", add_special=False)[0]]
