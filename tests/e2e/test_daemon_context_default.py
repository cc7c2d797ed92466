"""Issue 47 against a real daemon serving the built-in SmolLM2 (trained context 8192): the context chosen when
nobody chooses one, Open WebUI's first message (36 tools attached, about 6,100 tokens), the oldest turns dropped to
fit, and OpenAI's `context_length_exceeded` as the openai SDK, langchain-openai and litellm see it.

The daemon is told it has 16 GiB of memory, all available, so the choice does not depend on this machine."""

from __future__ import annotations

import json
import logging
import re

import httpx
import openai
import pytest
from _daemon_fakes import real_daemon
from _testpaths import FIXTURES

MODEL = "smollm2:135m"
GIB = 1 << 30
WEBUI = FIXTURES / "open_webui_first_message.json"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    memory = {"scheduler_kw": {"available_fn": lambda: 16 * GIB}, "total_memory_fn": lambda: 16 * GIB}
    with real_daemon(tmp_path_factory.mktemp("models"), service_kw=memory) as srv:
        yield srv


@pytest.fixture(scope="module")
def oai(daemon):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


def _webui_request() -> dict:
    return {k: v for k, v in json.loads(WEBUI.read_text()).items() if not k.startswith("_")}


@pytest.mark.slow  # about 6,100 prompt tokens: 45 s on two cores (CI runs the slow tests too)
def test_open_webui_first_message_is_answered_with_the_default_configuration(daemon):
    body = _webui_request()
    assert len(body["tools"]) == 36 and "options" not in body and body["stream"] is True
    with httpx.stream("POST", daemon.url + "/api/chat", json={**body, "options": {"num_predict": 4}}, timeout=600) as r:
        assert r.status_code == 200, r.read()
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert all("error" not in x for x in lines), lines[-1]
    last = lines[-1]
    assert last["done"] and 4096 < last["prompt_eval_count"] <= 8192
    ps = httpx.get(daemon.url + "/api/ps", timeout=30).json()["models"]
    assert [m["context_length"] for m in ps if m["name"] == MODEL] == [8192]  # the trained length, as chosen


def test_the_oldest_turns_are_dropped_to_fit_and_usage_says_what_was_kept(oai, caplog):
    system = {"role": "system", "content": "You answer in one word."}
    old = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "lorem ipsum " * 40}
        for i in range(12)
    ]  # about 12 x 200 tokens: more than the 1024 asked for
    last = {"role": "user", "content": "What is 2+2?"}
    small = {"options": {"num_ctx": 1024}}  # served by the loaded 8192 instance, fitted to 1024
    with caplog.at_level(logging.WARNING, logger="localrt.service"):
        r = oai.chat.completions.create(
            model=MODEL, messages=[system, *old, last], max_tokens=2, temperature=0, extra_body=small
        )
    kept = r.usage.prompt_tokens
    assert 1024 - 250 < kept <= 1024  # whole turns go: at most one turn's worth below the limit
    alone = oai.chat.completions.create(model=MODEL, messages=[system, last], max_tokens=2, temperature=0)
    assert alone.usage.prompt_tokens < 100
    assert any("truncating input messages" in rec.getMessage() for rec in caplog.records)


def test_a_last_message_that_cannot_fit_is_context_length_exceeded_on_v1(oai):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "lorem ipsum " * 5000}]
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
    err = info.value
    assert err.code == "context_length_exceeded" and err.type == "invalid_request_error"
    assert "maximum context length is 8192 tokens" in err.message
    assert int(re.search(r"too long: (\d+) tokens", err.message).group(1)) > 20000  # counted whole
    with pytest.raises(openai.BadRequestError) as info:  # /v1/completions never cuts a prompt either, as OpenAI
        oai.completions.create(model=MODEL, prompt="lorem ipsum " * 5000, max_tokens=2)
    assert info.value.code == "context_length_exceeded" and "maximum context length is 8192" in info.value.message


def test_native_context_error_names_both_numbers(daemon):
    r = httpx.post(
        daemon.url + "/api/chat",
        timeout=120,
        json={"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "lorem ipsum " * 5000}]},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert re.fullmatch(r"the prompt has 2\d{4} tokens, more than the context length of 8192 tokens", error)


def test_embeddings_longer_than_the_context_v1_refuses_native_truncates(daemon, oai):
    text = "lorem ipsum " * 5000
    with pytest.raises(openai.BadRequestError) as info:
        oai.embeddings.create(model=MODEL, input=text)
    assert info.value.code == "context_length_exceeded"
    small = {"num_ctx": 256}  # Ollama's rule at a context that is quick to embed
    native = httpx.post(daemon.url + "/api/embed", json={"model": MODEL, "input": text, "options": small}, timeout=120)
    assert native.status_code == 200 and native.json()["prompt_eval_count"] == 256
    refused = httpx.post(
        daemon.url + "/api/embed",
        timeout=120,
        json={"model": MODEL, "input": text, "truncate": False, "options": small},
    )
    assert refused.status_code == 400 and "context length" in refused.json()["error"]


def test_responses_input_tokens_counts_the_prompt_the_responses_api_runs(oai):
    counted = oai.responses.input_tokens.count(model=MODEL, input="What is 2+2?", instructions="Be brief.")
    assert counted.object == "response.input_tokens"
    ran = oai.responses.create(
        model=MODEL, input="What is 2+2?", instructions="Be brief.", max_output_tokens=16, temperature=0
    )
    assert counted.input_tokens == ran.usage.input_tokens > 5


def test_langchain_and_litellm_see_a_context_overflow(daemon, monkeypatch):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.exceptions import ContextOverflowError

    llm = langchain_openai.ChatOpenAI(model=MODEL, base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(ContextOverflowError):
        llm.invoke("lorem ipsum " * 5000)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map fetched from the network
    litellm = pytest.importorskip("litellm")
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(
            model="openai/" + MODEL,
            api_base=daemon.url + "/v1",
            api_key="unused",
            num_retries=0,
            messages=[{"role": "user", "content": "lorem ipsum " * 5000}],
        )
