"""Replayed requests of the clients people use with Ollama (litellm, langchain-ollama, llm-ollama, pydantic-ai,
openai-python), sent as those clients send them to a real daemon (scripted model: the answer's text does not
matter here). Each must be served (200), its reply must parse with the official `ollama` / `openai` types, and
the one warning line must name exactly the keys the daemon ignored."""

from __future__ import annotations

import json
import logging

import httpx
import ollama
import openai
import pydantic
import pytest

from _client_bodies import CASES, MODEL, TOOLS_MODEL, Case
from _daemon_fakes import fake_daemon

HERMES = (
    "{{- if .Tools }}<|im_start|>system\nTools:\n{{- range .Tools }}\n{{ json .Function }}{{ end }}<|im_end|>\n{{ end }}"
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
    "{{- if .ToolCalls }}{{ range .ToolCalls }}\n<tool_call>\n"
    '{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}\n</tool_call>{{ end }}'
    "{{- else }}\n{{ .Content }}{{ end }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with fake_daemon(tmp_path_factory.mktemp("models")) as (srv, _lab):
        ollama.Client(host=srv.url).create(model=TOOLS_MODEL, from_=MODEL, template=HERMES)
        yield srv


def _native_replies(r: httpx.Response, case: Case) -> list:
    kind = ollama.ChatResponse if case.path == "/api/chat" else ollama.GenerateResponse
    items = [json.loads(line) for line in r.text.splitlines() if line] if case.stream else [r.json()]
    assert all("error" not in i for i in items), items
    return [kind.model_validate(i) for i in items]


def _openai_replies(r: httpx.Response, case: Case) -> list:
    chat = case.path == "/v1/chat/completions"
    if not case.stream:
        return [(openai.types.chat.ChatCompletion if chat else openai.types.Completion).model_validate(r.json())]
    data = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    kind = openai.types.chat.ChatCompletionChunk if chat else openai.types.Completion
    return [kind.model_validate(json.loads(d)) for d in data[:-1]]


def _responses_reply(r: httpx.Response, case: Case):
    """The response object: the whole reply, or the one the last event of the stream carries (every event parsed)."""
    if not case.stream:
        return openai.types.responses.Response.model_validate(r.json())
    frames = [f for f in r.text.split("\n\n") if f]
    event = pydantic.TypeAdapter(openai.types.responses.ResponseStreamEvent)
    events = [event.validate_python(json.loads(f.split("\ndata: ", 1)[1])) for f in frames]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events[-1].response


@pytest.mark.parametrize("case", CASES, ids=[c.client for c in CASES])
def test_client_request_is_served_and_parses(daemon, case, caplog):
    caplog.set_level(logging.WARNING, logger="localrt.server")
    r = httpx.post(daemon.url + case.path, json=case.body, headers=case.headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"]
    if case.path.startswith("/api/"):
        replies = _native_replies(r, case)
        assert replies[-1].done and replies[-1].prompt_eval_count > 0
    elif case.path == "/v1/responses":
        final = _responses_reply(r, case)
        assert final.status in ("completed", "incomplete") and final.usage.input_tokens > 0
    else:
        replies = _openai_replies(r, case)
        finished = [c for x in replies for c in x.choices if c.finish_reason]
        assert finished and finished[-1].finish_reason in ("stop", "length", "tool_calls")
        usage = [x.usage for x in replies if x.usage]
        if usage:
            assert usage[-1].prompt_tokens > 0 and usage[-1].prompt_tokens_details.cached_tokens >= 0
    lines = [
        rec.getMessage() for rec in caplog.records if rec.name == "localrt.server" and rec.levelno == logging.WARNING
    ]
    if not case.ignored:
        assert lines == []
        return
    assert len(lines) == 1, lines
    named = lines[0].split("ignored unknown field(s): ", 1)[1].split(", ")
    assert sorted(named) == sorted(case.ignored)


def test_openai_client_sends_these_bodies_unchanged(daemon):
    """The replayed openai-python body is what the client itself puts on the wire (extra fields included)."""
    case = next(c for c in CASES if c.client.startswith("openai-python"))
    seen: list[dict] = []

    def capture(request: httpx.Request) -> None:
        seen.append(json.loads(request.content))

    c = openai.OpenAI(
        base_url=daemon.url + "/v1", api_key="unused", http_client=httpx.Client(event_hooks={"request": [capture]})
    )
    body = dict(case.body)
    r = c.chat.completions.create(**{k: v for k, v in body.items() if k != "functions"}, extra_body={"functions": None})
    assert r.choices[0].message.role == "assistant"
    assert seen[-1] == body
