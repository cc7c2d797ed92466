"""A harmony (gpt-oss) model through a real daemon and the official clients, with a scripted model that answers in
harmony (in pieces that split the markers): reasoning, answer and tool calls in their own fields on /api/chat,
/api/generate and /v1/chat/completions, whole and streamed; `think` levels reaching Ollama's gpt-oss template; a
replayed tool-call turn's reasoning rendered; the capabilities /api/show reports."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from _daemon_fakes import Script, scripted_daemon

from _testpaths import DATA

OLLAMA_GPT_OSS = (DATA / "templates" / "gpt-oss" / "template.gotmpl").read_text()
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
ANSWER = (
    "<|channel|>analysis<|message|>The user greets me.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello there!"
)  # <|return|> ends it: never in the text
CALL = (
    "<|channel|>analysis<|message|>I need the weather.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
)  # <|call|> ends it
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    script = Script(answer=ANSWER, piece=3)
    with scripted_daemon(tmp_path_factory.mktemp("m"), script, "oss", OLLAMA_GPT_OSS) as (srv, client):
        yield srv, client, script


def test_chat_splits_reasoning_and_answer_whole_and_streamed(daemon):
    _srv, client, script = daemon
    script.answer = ANSWER
    r = client.chat(model="oss", messages=HI)
    assert (r.message.thinking, r.message.content) == ("The user greets me.", "Hello there!")
    assert script.prompts[-1].endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    assert "\nReasoning: medium\n" in script.prompts[-1]  # no think: Ollama sends true, level medium
    parts = list(client.chat(model="oss", messages=HI, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "The user greets me."
    assert "".join(p.message.content for p in parts) == "Hello there!"
    assert not any("<|" in (p.message.thinking or "") + p.message.content for p in parts) and parts[-1].done


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_call_from_the_commentary_channel(daemon, stream):
    _srv, client, script = daemon
    script.answer = CALL
    parts = client.chat(
        model="oss", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, stream=stream
    )
    parts = list(parts) if stream else [parts]
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(p.message.content for p in parts) == ""
    assert "".join(p.message.thinking or "" for p in parts) == "I need the weather."
    assert "type get_weather = " in script.prompts[-1]  # the tools reached Ollama's template


def test_think_levels_reach_the_template_and_false_cannot_switch_reasoning_off(daemon):
    _srv, client, script = daemon
    script.answer = ANSWER
    client.chat(model="oss", messages=HI, think="high")
    assert "\nReasoning: high\n" in script.prompts[-1]
    r = client.chat(model="oss", messages=HI, think=False)
    assert "Reasoning:" not in script.prompts[-1]  # Ollama's template: no line under think false
    assert (r.message.thinking, r.message.content) == ("The user greets me.", "Hello there!")  # still reported


def test_a_replayed_tool_call_turn_keeps_its_reasoning_in_the_prompt(daemon):
    _srv, client, script = daemon
    script.answer = "<|channel|>final<|message|>It is 21 degrees."
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "thinking": "I need the weather.",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": '{"temp_c": 21}', "tool_name": "get_weather"},
    ]
    r = client.chat(model="oss", messages=history, tools=TOOLS)
    assert r.message.content == "It is 21 degrees." and not r.message.thinking
    assert script.prompts[-1].endswith(
        "<|start|>assistant<|channel|>analysis<|message|>I need the weather.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
        '<|start|>functions.get_weather to=assistant<|message|>{"temp_c": 21}<|end|><|start|>assistant'
    )


def test_generate_thinking_and_response(daemon):
    _srv, client, script = daemon
    script.answer = ANSWER
    r = client.generate(model="oss", prompt="Hi", think="low")
    assert (r.thinking, r.response) == ("The user greets me.", "Hello there!")
    assert "\nReasoning: low\n" in script.prompts[-1]
    parts = list(client.generate(model="oss", prompt="Hi", stream=True))
    assert "".join(p.thinking or "" for p in parts) == "The user greets me."
    assert "".join(p.response for p in parts) == "Hello there!"


def test_v1_reasoning_content_and_tool_calls(daemon):
    srv, _client, script = daemon
    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
    script.answer = ANSWER
    r = oa.chat.completions.create(model="oss", messages=HI, reasoning_effort="low")
    msg = r.choices[0].message
    assert msg.content == "Hello there!" and msg.model_extra["reasoning_content"] == "The user greets me."
    assert "\nReasoning: low\n" in script.prompts[-1]
    chunks = list(oa.chat.completions.create(model="oss", messages=HI, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Hello there!"
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "The user greets me."
    script.answer = CALL
    for stream in (False, True):
        got = oa.chat.completions.create(
            model="oss", messages=[{"role": "user", "content": "Paris?"}], tools=TOOLS, stream=stream
        )
        if stream:
            calls = [c for ch in got if ch.choices for c in (ch.choices[0].delta.tool_calls or [])]
        else:
            calls = got.choices[0].message.tool_calls
            assert got.choices[0].finish_reason == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"})
        ]


def test_a_forced_tool_choice_is_refused_by_name(daemon):
    srv = daemon[0]
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={
            "model": "oss",
            "messages": [{"role": "user", "content": "Paris?"}],
            "tools": TOOLS,
            "tool_choice": "required",
        },
    )
    assert r.status_code == 400 and "tool_choice" in r.json()["error"]["message"]


def test_show_reports_thinking_and_tools(daemon):
    client = daemon[1]
    caps = client.show("oss").capabilities
    assert {"completion", "tools", "thinking"} <= set(caps)
