"""Issue 47's last /v1 gaps, with the real openai SDK against a real daemon serving the built-in SmolLM2: prompts as
a list or as token ids on /v1/completions, tool_choice "allowed_tools", the legacy functions / function_call fields
and the function role, nameless tools, and max_tool_calls on /v1/responses."""

from __future__ import annotations

import json

import openai
import pytest

from localrt.serve.openai_responses import ResponsesOpts
from localrt.serve.openai_responses_reply import ResponsesStream

MODEL = "smollm2:135m"
GREEDY = {"temperature": 0, "max_tokens": 4}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two small numbers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 9},
                "b": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["a", "b"],
        },
    },
}
ASK = [{"role": "user", "content": "What is 2 plus 3?"}]


@pytest.fixture(scope="module")
def oai(shared_daemon):  # this module only reads (conftest.py)
    return openai.OpenAI(base_url=shared_daemon.url + "/v1", api_key="unused", max_retries=0)


def test_completions_take_a_list_of_prompts_numbered_prompt_by_prompt(oai):
    prompts = ["The capital of France is", "One, two, three,"]
    alone = [oai.completions.create(model=MODEL, prompt=p, **GREEDY) for p in prompts]
    both = oai.completions.create(model=MODEL, prompt=prompts, n=2, **GREEDY)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    texts = [c.text for c in sorted(both.choices, key=lambda c: c.index)]
    assert texts == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2  # greedy: n choices agree
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    echoed = oai.completions.create(model=MODEL, prompt=prompts, echo=True, **GREEDY)
    assert [c.text for c in echoed.choices] == [p + a.choices[0].text for p, a in zip(prompts, alone)]


def test_completions_take_token_ids_as_given(oai, llamacpp_reference):
    entry = llamacpp_reference["models"]["smollm2"]["entries"][0]
    r = oai.completions.create(model=MODEL, prompt=entry["prompt_ids"], **GREEDY)
    assert entry["greedy_text"].startswith(r.choices[0].text) and len(r.choices[0].text) >= 5
    assert r.usage.prompt_tokens == len(entry["prompt_ids"])
    two = oai.completions.create(model=MODEL, prompt=[entry["prompt_ids"], entry["prompt_ids"][:3]], **GREEDY)
    assert two.choices[0].text == r.choices[0].text and len(two.choices) == 2
    with pytest.raises(openai.BadRequestError, match="token id out of range"):
        oai.completions.create(model=MODEL, prompt=[1, 2, 10**9], **GREEDY)
    with pytest.raises(openai.BadRequestError, match="echo"):
        oai.completions.create(model=MODEL, prompt=[1, 2, 3], echo=True, **GREEDY)
    with pytest.raises(openai.BadRequestError, match="suffix"):
        oai.completions.create(model=MODEL, prompt=[1, 2, 3], suffix="end", **GREEDY)


def test_allowed_tools_limits_what_the_model_may_call(oai):
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "add"}}]},
    }
    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, ADD], tool_choice=choice, temperature=0, max_tokens=60
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add" and set(json.loads(call.function.arguments)) == {"a", "b"}
    bad = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "nope"}}]},
    }
    with pytest.raises(openai.BadRequestError, match="nope"):
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, ADD], tool_choice=bad)
    auto = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "add"}}]},
    }  # the other tools never reach the prompt
    usage = [
        oai.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=1, **kw).usage
        for kw in ({"tools": [WEATHER, ADD], "tool_choice": auto}, {"tools": [ADD]}, {"tools": [WEATHER, ADD]})
    ]
    assert usage[0].prompt_tokens == usage[1].prompt_tokens < usage[2].prompt_tokens
    resp = oai.responses.create(
        model=MODEL,
        input="What is 2 plus 3?",
        max_output_tokens=60,
        temperature=0,
        tools=[{"type": "function", **ADD["function"]}, {"type": "function", **WEATHER["function"]}],
        tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "add"}]},
    )
    assert [o.name for o in resp.output if o.type == "function_call"] == ["add"]


def test_legacy_functions_are_tools_and_the_function_role_a_tool_turn(oai):
    r = oai.chat.completions.create(
        model=MODEL,
        messages=ASK,
        temperature=0,
        max_tokens=60,
        functions=[ADD["function"], WEATHER["function"]],
        function_call={"name": "add"},
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add"
    history = [
        *ASK,
        {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"role": "function", "name": "add", "content": "5"},
    ]
    answer = oai.chat.completions.create(
        model=MODEL, messages=history, functions=[ADD["function"]], function_call="none", temperature=0, max_tokens=8
    )
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError, match="cannot be combined"):
        oai.chat.completions.create(model=MODEL, messages=ASK, functions=[ADD["function"]], tools=[ADD])


@pytest.mark.parametrize("tool", [{"type": "function"}, {"type": "function", "function": {}}, {"type": "custom"}])
def test_a_tool_without_a_name_is_a_400_naming_the_field(oai, tool):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=[tool], max_tokens=2)
    assert "tools[0]" in info.value.message


def test_max_tool_calls_leaves_later_calls_out_and_is_echoed():
    stream = ResponsesStream(MODEL, ResponsesOpts(max_tool_calls=1))
    calls = [{"function": {"name": n, "arguments": {"a": 1, "b": 2}}} for n in ("add", "add")]
    out = stream.whole(
        [{"message": {"role": "assistant", "content": "", "tool_calls": calls}, "done": True, "done_reason": "stop"}]
    )
    assert [o["type"] for o in out["output"]] == ["function_call"] and out["max_tool_calls"] == 1


def test_max_tool_calls_zero_hides_the_tools(oai):
    resp = oai.responses.create(
        model=MODEL,
        input="What is 2 plus 3?",
        max_output_tokens=8,
        temperature=0,
        tools=[{"type": "function", **ADD["function"]}],
        max_tool_calls=0,
    )
    assert not [o for o in resp.output if o.type == "function_call"] and resp.max_tool_calls == 0
