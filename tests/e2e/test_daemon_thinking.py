"""Issue 44's `think` through a real daemon and the official clients, with a scripted model (the answer text is what
the test says; the engine-level cases with real weights are in test_thinking_models.py): the reasoning in its own
field on /api/generate and /api/chat, `reasoning_content` on /v1, tool calls parsed from the answer only, `think`
false, and the 400s."""

from __future__ import annotations

import httpx
import openai
import pytest

from _daemon_fakes import Script, scripted_daemon

# the shape of Ollama's qwen3 template: reasoning rendered for assistant turns, an empty block under think false
QWEN3 = (
    "{{- if .Tools }}<|im_start|>system\n# Tools\n{{ range .Tools }}{{ json .Function }}\n{{ end }}<|im_end|>\n"
    "{{ end }}"
    "{{- range $i, $_ := .Messages }}<|im_start|>{{ .Role }}\n"
    '{{- if and .Thinking (eq .Role "assistant") }}\n<think>{{ .Thinking }}</think>\n{{ end }}'
    "{{- if .ToolCalls }}{{ range .ToolCalls }}\n<tool_call>\n"
    '{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}\n</tool_call>{{ end }}'
    "{{- else }}\n{{ .Content }}{{ end }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
    "{{- if and .IsThinkSet (not .Think) }}\n<think>\n\n</think>\n\n{{ end }}"
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
REASONED = "<think>\nThe user greets me.\n</think>\n\nHello there!"
CALL = (
    '<think>I need the weather. <tool_call>{"name": "nope", "arguments": {}}</tool_call> is wrong.</think>'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    script = Script(answer=REASONED, piece=3)
    with scripted_daemon(tmp_path_factory.mktemp("m"), script, "thinker", QWEN3) as (srv, client):
        yield srv, client, script


def test_chat_reasoning_is_its_own_field_whole_and_streamed(daemon):
    srv, client, script = daemon
    script.answer = REASONED
    msgs = [{"role": "user", "content": "Hi"}]
    r = client.chat(model="thinker", messages=msgs)  # no think sent: a thinking model thinks
    assert r.message.thinking == "The user greets me." and r.message.content == "Hello there!"
    parts = list(client.chat(model="thinker", messages=msgs, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "The user greets me."
    assert "".join(p.message.content for p in parts) == "Hello there!"
    assert all("think>" not in p.message.content for p in parts) and parts[-1].done


def test_generate_reasoning_and_levels(daemon):
    srv, client, script = daemon
    script.answer = REASONED
    r = client.generate(model="thinker", prompt="Hi", think="high")
    assert r.thinking == "The user greets me." and r.response == "Hello there!"
    streamed = list(client.generate(model="thinker", prompt="Hi", stream=True))
    assert "".join(p.thinking or "" for p in streamed) == "The user greets me."


def test_think_false_renders_no_reasoning_and_drops_what_comes(daemon):
    srv, client, script = daemon
    script.answer = REASONED
    r = client.chat(model="thinker", messages=[{"role": "user", "content": "Hi"}], think=False)
    assert script.prompts[-1].endswith("<think>\n\n</think>\n\n")  # the template switched it off
    assert r.message.content == "Hello there!" and not r.message.thinking


def test_a_replayed_turn_carries_its_reasoning_into_the_template(daemon):
    srv, client, script = daemon
    script.answer = "ok"
    client.chat(
        model="thinker",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "thinking": "Be nice."},
            {"role": "user", "content": "Bye"},
        ],
    )
    assert "<think>Be nice.</think>" in script.prompts[-1]


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning", "thinking"])
def test_v1_replayed_reasoning_renders_as_the_native_replay_does(daemon, key):
    """/v1/chat/completions takes an assistant turn's reasoning under each name clients send it (DeepSeek/vLLM's
    `reasoning_content`, Ollama's `reasoning`, the native `thinking`): the template renders it, and the prompt the
    model sees is byte for byte the one of the same history on /api/chat."""
    srv, client, script = daemon
    script.answer = "ok"
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "thinking": "Be nice."},
        {"role": "user", "content": "Bye"},
    ]
    client.chat(model="thinker", messages=turns)
    native = script.prompts[-1]
    assert "<|im_start|>assistant\n<think>Be nice.</think>\n\nHello!<|im_end|>" in native
    v1 = [turns[0], {"role": "assistant", "content": "Hello!", key: "Be nice."}, turns[2]]
    r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "thinker", "messages": v1}, timeout=30)
    assert r.status_code == 200, r.text
    assert script.prompts[-1] == native
    # without the reasoning the block is gone: it was the replayed field that put it there
    httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": "thinker", "messages": [turns[0], {"role": "assistant", "content": "Hello!"}, turns[2]]},
        timeout=30,
    ).raise_for_status()
    assert "<think>" not in script.prompts[-1] and "<|im_start|>assistant\nHello!<|im_end|>" in script.prompts[-1]


def test_v1_replayed_reasoning_before_a_tool_call_renders_with_the_call(daemon):
    srv, client, script = daemon
    script.answer = "ok"
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    oai.chat.completions.create(
        model="thinker",
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "I need the weather.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    )
    assert (
        "<|im_start|>assistant\n<think>I need the weather.</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call><|im_end|>' in script.prompts[-1]
    )


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_from_the_answer_never_the_reasoning(daemon, stream):
    srv, client, script = daemon
    script.answer = CALL
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    parts = (
        list(client.chat(model="thinker", messages=msgs, tools=TOOLS, stream=True))
        if stream
        else [client.chat(model="thinker", messages=msgs, tools=TOOLS)]
    )
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    thinking = "".join(p.message.thinking or "" for p in parts)
    assert thinking.startswith("I need the weather.") and '"nope"' in thinking
    assert "".join(p.message.content for p in parts) == ""


def test_a_reasoning_block_that_never_closes_is_reasoning(daemon):
    srv, client, script = daemon
    script.answer = "<think>I keep thinking and"
    r = client.chat(model="thinker", messages=[{"role": "user", "content": "Hi"}])
    assert r.message.thinking == "I keep thinking and" and r.message.content == ""


def test_openai_reasoning_content_and_effort(daemon):
    srv, client, script = daemon
    script.answer = REASONED
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Hi"}]
    r = oai.chat.completions.create(model="thinker", messages=msgs, reasoning_effort="low")
    msg = r.choices[0].message
    assert msg.content == "Hello there!" and msg.model_extra["reasoning_content"] == "The user greets me."
    chunks = list(oai.chat.completions.create(model="thinker", messages=msgs, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "The user greets me."
    assert "".join(d.content or "" for d in deltas) == "Hello there!"
    oai.chat.completions.create(model="thinker", messages=msgs, reasoning_effort="none")
    assert script.prompts[-1].endswith("<think>\n\n</think>\n\n")


def test_show_lists_thinking_only_for_a_template_with_reasoning(daemon):
    srv, client, script = daemon
    assert "thinking" in client.show("thinker").capabilities
    assert "thinking" not in client.show("smollm2:135m").capabilities


@pytest.mark.parametrize(
    "path, body, named",
    [
        ("/api/chat", {"model": "smollm2:135m", "think": True}, "think True"),
        ("/api/chat", {"model": "thinker", "think": "max"}, "invalid think value"),
        ("/api/generate", {"model": "smollm2:135m", "think": "high", "prompt": "Hi"}, "think 'high'"),
        ("/v1/chat/completions", {"model": "smollm2:135m", "reasoning_effort": "high"}, "reasoning_effort 'high'"),
        ("/v1/chat/completions", {"model": "thinker", "reasoning_effort": "huge"}, "reasoning_effort must be"),
    ],
)
def test_bad_thinking_requests_are_400s_naming_the_field(daemon, path, body, named):
    srv, client, script = daemon
    if "prompt" not in body:
        body = {**body, "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(srv.url + path, json={**body, "stream": False}, timeout=30)
    assert r.status_code == 400, r.text
    assert named in r.text


def test_responses_api_gives_a_reasoning_item_before_the_answer(daemon):
    srv, client, script = daemon
    script.answer = REASONED
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    r = oai.responses.create(model="thinker", input="Hi", reasoning={"effort": "medium"})
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"] and r.output_text == "Hello there!"
    assert r.output[0].content[0].text == "The user greets me."
    events = list(oai.responses.create(model="thinker", input="Hi", stream=True))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == "The user greets me."
    follow = oai.responses.create(
        model="thinker",
        input=[
            {"role": "user", "content": "Hi"},
            r.output[0].model_dump(exclude_none=True),
            {"role": "assistant", "content": "Hello there!"},
            {"role": "user", "content": "Bye"},
        ],
    )
    assert follow.status == "completed" and "<think>The user greets me.</think>" in script.prompts[-1]


def test_run_shows_the_reasoning_set_apart_or_hides_it(daemon):
    from typer.testing import CliRunner

    from cli import _bare_think, app

    srv, client, script = daemon
    script.answer = REASONED
    env = {"LOCALRT_HOST": srv.url.removeprefix("http://"), "LOCALRT_API_KEY": ""}
    args = _bare_think(["run", "thinker", "Hi", "--think"])  # as the `localrt` entry point reads its argv
    shown = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert "Thinking...\nThe user greets me.\n...done thinking.\n\nHello there!" in shown.stdout
    hidden = CliRunner().invoke(app, ["run", "thinker", "Hi", "--think=high", "--hidethinking"], env=env)
    assert hidden.exit_code == 0 and "greets" not in hidden.stdout and "Hello there!" in hidden.stdout
    bad = CliRunner().invoke(app, ["run", "thinker", "Hi", "--think=max"], env=env)
    assert bad.exit_code != 0 and "--think" in bad.stderr


def test_repl_set_think_and_nothink(capsys):
    from localrt.cli.repl import Repl

    repl = Repl(None, "thinker")
    repl._set(["think", "high"])
    assert repl.think == "high"
    repl._set(["nothink"])
    assert repl.think is False
    repl._set(["think"])
    assert repl.think is True
    repl._set(["think", "max"])
    assert repl.think is True and "Invalid think level" in capsys.readouterr().out
