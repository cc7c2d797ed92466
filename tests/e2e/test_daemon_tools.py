"""Tool calls and structured outputs through the real daemon and the official clients.

Tool calling: a model answers with a scripted text (the 135M model does not open tool calls by itself; the
engine-level round trip with real weights is in test_toolcalls_models.py), so these tests pin what the daemon
does with a Hermes-style answer: parse it into `tool_calls` (native objects, OpenAI JSON strings with ids and
`finish_reason: tool_calls`, streamed deltas), keep unparseable text as content, refuse tools for a template
without them. Structured outputs run on the real SmolLM2 weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import ollama
import openai
import pytest

from localrt import config as cfg
from localrt.serve.daemon import BackgroundServer, free_port
from localrt.runtime.service import Service
from _daemon_fakes import Script, scripted_daemon

HERMES = (
    "{{- if .Tools }}<|im_start|>system\nTools:\n{{- range .Tools }}\n{{ json .Function }}{{ end }}<|im_end|>\n{{ end }}"
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
    "{{- if .ToolCalls }}{{ range .ToolCalls }}\n<tool_call>\n"
    '{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}\n</tool_call>{{ end }}'
    "{{- else }}\n{{ .Content }}{{ end }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    script = Script(answer=CALL)
    with scripted_daemon(tmp_path_factory.mktemp("m"), script, "tooly", HERMES) as (srv, client):
        yield srv, client, script


def test_native_tool_calls_whole_and_streamed(scripted):
    srv, client, script = scripted
    script.answer = CALL
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat(model="tooly", messages=msgs, tools=TOOLS)
    assert "get_weather" in script.prompts[-1]  # the tools went through the template
    assert r.message.content == "Let me check."
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    parts = list(client.chat(model="tooly", messages=msgs, tools=TOOLS, stream=True))
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function.arguments for c in calls] == [{"city": "Paris"}] and parts[-1].done
    assert "<tool_call>" not in "".join(p.message.content for p in parts)


def test_tool_result_is_fed_back_through_the_template(scripted):
    srv, client, script = scripted
    script.answer = "It is sunny."
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"},
    ]
    r = client.chat(model="tooly", messages=msgs, tools=TOOLS)
    assert r.message.content == "It is sunny." and not r.message.tool_calls
    assert '"arguments": {"city":"Paris"}' in script.prompts[-1] and "18 C, sunny" in script.prompts[-1]


def test_unparseable_call_stays_content(scripted):
    srv, client, script = scripted
    script.answer = "<tool_call>\n{not json at all\n</tool_call>"
    r = client.chat(model="tooly", messages=[{"role": "user", "content": "x"}], tools=TOOLS)
    assert not r.message.tool_calls and r.message.content == script.answer


def test_openai_tool_calls_and_streamed_deltas(scripted):
    srv, client, script = scripted
    script.answer = CALL
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = c.chat.completions.create(model="tooly", messages=msgs, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(c.chat.completions.create(model="tooly", messages=msgs, tools=TOOLS, stream=True))
    deltas = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas] == ["get_weather"] and deltas[0].index == 0
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the assistant's call and a tool result, as an OpenAI client sends them back
    script.answer = "Sunny."
    back = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C"},
    ]
    assert c.chat.completions.create(model="tooly", messages=back, tools=TOOLS).choices[0].message.content == "Sunny."


def test_tools_refused_for_a_template_without_them(scripted):
    srv, client, script = scripted
    client.create(model="plain", from_="smollm2:135m", template="{{ .Prompt }}")  # no .Tools in it
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="plain", messages=[{"role": "user", "content": "x"}], tools=TOOLS)
    assert e.value.status_code == 400 and "does not support tools" in e.value.error


def test_bad_schema_is_a_400_naming_the_keyword(scripted):
    srv, client, script = scripted
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(
            model="tooly",
            messages=[{"role": "user", "content": "x"}],
            format={"type": "object", "properties": {"a": {"type": "string", "contentSchema": {}}}},
        )
    assert e.value.status_code == 400 and "contentSchema" in e.value.error


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    conf = dataclasses.replace(cfg.load({}), port=free_port(), models_dir=Path(tmp_path_factory.mktemp("r")))
    service = Service(conf)
    with BackgroundServer(service, conf) as srv:
        yield srv
    service.close()


def test_structured_outputs_on_real_weights(real):
    client = ollama.Client(host=real.url)
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    for seed in range(3):
        r = client.chat(
            model="smollm2:135m",
            messages=msgs,
            format=SCHEMA,
            options={"temperature": 0.9, "seed": seed, "num_predict": 80},
        )
        jsonschema.validate(json.loads(r.message.content), SCHEMA)
    small = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 12}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    g = client.generate(
        model="smollm2:135m",
        prompt="The capital of France, as JSON:",
        format=small,
        options={"temperature": 0.7, "seed": 1, "num_predict": 60},
    )
    assert g.done_reason == "stop"  # a bounded schema must finish: EOS is allowed only once the document is whole
    jsonschema.validate(json.loads(g.response), small)
    c = openai.OpenAI(base_url=real.url + "/v1", api_key="unused")
    o = c.chat.completions.create(
        model="smollm2:135m",
        messages=msgs,
        seed=5,
        max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    )
    jsonschema.validate(json.loads(o.choices[0].message.content), SCHEMA)
