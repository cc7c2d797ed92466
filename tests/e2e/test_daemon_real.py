"""End to end: a real daemon on a free port with a temporary store, the built-in SmolLM2 from PyPI, driven by the
official `ollama` and `openai` clients as a user would."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest
from _daemon_fakes import real_daemon

MODEL = "smollm2:135m"
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 8}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with real_daemon(tmp_path_factory.mktemp("models")) as srv:
        yield srv


@pytest.fixture
def client(daemon):
    return ollama.Client(host=daemon.url)


def test_generate_raw_greedy_matches_llamacpp(client, llamacpp_reference):
    # The first tokens of llama.cpp's greedy continuation, through the whole daemon path; exact token-for-token
    # agreement over long continuations is the engine's golden test.
    entry = llamacpp_reference["models"]["smollm2"]["entries"][0]
    r = client.generate(model=MODEL, prompt=entry["prompt"], raw=True, options={**GREEDY, "num_predict": 4})
    assert r.done and r.done_reason == "length" and r.eval_count == 4
    assert entry["greedy_text"].startswith(r.response) and len(r.response) >= 7
    assert r.context is None or r.context == []  # raw replies carry no context
    assert r.prompt_eval_count == len(entry["prompt_ids"]) and r.total_duration > r.eval_duration > 0


def test_chat_stream_and_whole_agree(client):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    parts = list(client.chat(model=MODEL, messages=msgs, options=GREEDY, stream=True))
    whole = client.chat(model=MODEL, messages=msgs, options=GREEDY)
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and whole.eval_count == parts[-1].eval_count > 0


def test_generate_context_round_trip(client):
    first = client.generate(model=MODEL, prompt="Say hi.", options=GREEDY)
    assert first.context and all(isinstance(t, int) for t in first.context)
    second = client.generate(model=MODEL, prompt="Again.", context=first.context, options=GREEDY)
    assert second.prompt_eval_count > len(first.context)


def test_embed_normalised_and_dimensions(client):
    r = client.embed(model=MODEL, input=["hello world", "bonjour"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576
    assert abs(sum(x * x for x in r.embeddings[0]) - 1.0) < 1e-4
    cut = client.embed(model=MODEL, input="hello world", dimensions=16)
    assert len(cut.embeddings[0]) == 16 and abs(sum(x * x for x in cut.embeddings[0]) - 1.0) < 1e-4
    legacy = client.embeddings(model=MODEL, prompt="hello world")
    assert len(legacy.embedding) == 576


def test_the_builtin_chat_model_takes_tools(client):
    """What a UI that attaches tools to every chat (Open WebUI) sends first: no 400, a real answer."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "description": "The current time",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    r = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello!"}],
        tools=tools,
        options={"num_predict": 8, "temperature": 0},
    )
    assert r.message.role == "assistant" and (r.message.content or r.message.tool_calls)


def test_models_list_show_copy_create_delete_ps(client):
    client.pull(MODEL)  # a built-in is created from its package on pull (show never creates)
    names = [m.model for m in client.list().models]
    assert MODEL in names
    info = client.show(MODEL)
    assert info.modelinfo["general.architecture"] == "llama" and {"completion", "tools"} <= set(info.capabilities)
    assert "<|im_end|>" in info.parameters and "FROM " in info.modelfile
    client.copy(MODEL, "mine:copy")
    client.create(model="pirate", from_=MODEL, system="You are a pirate.", parameters={"temperature": 0.2})
    shown = client.show("pirate")
    assert "SYSTEM You are a pirate." in shown.modelfile and "temperature" in shown.parameters
    client.delete("pirate")
    client.delete("mine:copy")
    assert {"pirate:latest", "mine:copy"}.isdisjoint(m.model for m in client.list().models)
    client.generate(model=MODEL, prompt="")  # load only
    assert any(m.model == MODEL and m.context_length > 0 for m in client.ps().models)
    assert client.generate(model=MODEL, keep_alive=0).done_reason == "unload"


def test_bad_requests_get_clear_errors_and_daemon_keeps_serving(daemon, client):
    cases = [
        ({"model": "no-such-model", "prompt": "x"}, 404, "not found"),
        ({"model": "../../etc/passwd", "prompt": "x"}, 400, "invalid"),
        ({"model": MODEL, "prompt": "x", "options": {"temperature": -1}}, 400, "temperature"),
        ({"model": MODEL, "prompt": "x", "options": {"num_ctx": -5}}, 400, "num_ctx"),
        ({"model": MODEL, "prompt": "x", "options": {"top_k": "many"}}, 400, "top_k"),
        ({"model": MODEL, "prompt": "x", "keep_alive": "forever-ish"}, 400, "keep_alive"),
        (
            {"model": MODEL, "prompt": "word " * 400, "truncate": False, "options": {"num_ctx": 64}},
            400,
            "context length",
        ),
    ]
    for body, status, text in cases:
        r = httpx.post(daemon.url + "/api/generate", json={**body, "stream": False}, timeout=120)
        assert r.status_code == status, (body, r.text)
        assert text in r.json()["error"].lower(), (body, r.text)
    assert client.generate(model=MODEL, prompt="Hi", options=GREEDY).done


def test_a_prompt_past_the_context_is_cut_as_ollama_cuts_it(daemon):
    """/api/generate's `truncate` (Ollama's default true): num_keep first tokens and the newest ones, half of the rest
    of the context (prompt_fit); a 7 MB text is cut in about a second, its tail tokenized from the end only."""
    for prompt, n_ctx, keep in [("Tell me more. " * 500_000, 2048, 4), ("word " * 400 + "The end.", 256, 10)]:
        r = httpx.post(
            daemon.url + "/api/generate",
            timeout=120,
            json={
                "model": MODEL,
                "prompt": prompt,
                "raw": True,
                "stream": False,
                "options": {"num_ctx": n_ctx, "num_keep": keep, "num_predict": 1, "temperature": 0},
            },
        )
        assert r.status_code == 200, r.text[:300]
        assert r.json()["prompt_eval_count"] == keep + (n_ctx - keep) // 2
        assert r.elapsed.total_seconds() < 30


def test_disconnect_mid_stream_frees_the_worker(daemon, client):
    with httpx.stream(
        "POST",
        daemon.url + "/api/generate",
        timeout=120,
        json={"model": MODEL, "prompt": "Tell me a long story.", "options": {"num_predict": 200}},
    ) as r:
        lines = r.iter_lines()
        for _ in range(2):
            assert "response" in json.loads(next(lines))
    r = client.generate(model=MODEL, prompt="Hi", options=GREEDY)
    assert r.done and r.eval_count <= 8


def test_openai_client_chat_completions_embeddings_models(daemon):
    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=8, seed=3)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 8
    chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=msgs, temperature=0, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    comp = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert comp.choices[0].text.strip()
    emb = c.embeddings.create(model=MODEL, input="hello")
    assert len(emb.data[0].embedding) == 576
    assert MODEL in [m.id for m in c.models.list().data]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/api/generate", {"prompt": "Tell me more. " * 500_000, "raw": True, "truncate": False}),  # 7 MB, 2M tokens
        ("/api/chat", {"messages": [{"role": "user", "content": "Tell me more. " * 500_000}]}),
    ],
)
def test_a_prompt_far_past_the_context_is_refused_without_tokenizing_it_all(daemon, path, body):
    """Tokenizing stops once the count passes the context (Tokenizer.encode's limit): a 400 in about a second here,
    not after the whole text (35 s for 8 MB before); the bound is loose for a loaded runner."""
    httpx.post(
        daemon.url + "/api/generate", json={"model": MODEL, "prompt": "hi", "options": {"num_predict": 1}}, timeout=120
    )  # loaded first
    r = httpx.post(
        daemon.url + path, json={"model": MODEL, "stream": False, "options": {"num_ctx": 2048}, **body}, timeout=120
    )
    assert r.status_code == 400 and "more than 2048 tokens" in r.json()["error"], r.text[:300]
    assert r.elapsed.total_seconds() < 10  # a second or so here, however long the text
