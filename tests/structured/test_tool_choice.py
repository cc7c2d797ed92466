"""OpenAI's tool_choice "required" and a named function, through constrained decoding on the real built-in
SmolLM2: the reply is a call of an offered tool whose arguments validate against that tool's parameters (what
pydantic-ai's default structured output and langchain's with_structured_output(method="function_calling")
rely on)."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import openai
import pytest

from localrt import config as cfg
from localrt.runtime.service import Service
from localrt.serve.daemon import BackgroundServer, free_port
from localrt.structured import Framed
from localrt.templates.toolcalls import HERMES, forced_call_format

MODEL = "smollm2:135m"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
            "required": ["city"],
            "additionalProperties": False,
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
            "additionalProperties": False,
        },
    },
}


def test_a_forced_hermes_call_is_framed_by_its_tags():
    fmt = forced_call_format(HERMES, [WEATHER])
    assert isinstance(fmt, Framed) and fmt.prefix == "<tool_call>\n" and fmt.suffix == "\n</tool_call>"
    assert (
        forced_call_format("{", [WEATHER]).prefix == ""
        and forced_call_format("[TOOL_CALLS]", [ADD]).prefix == "[TOOL_CALLS]"
    )


@pytest.fixture(scope="module")
def v1(tmp_path_factory):
    conf = dataclasses.replace(
        cfg.load({}),
        port=free_port(),
        models_dir=tmp_path_factory.mktemp("models"),
        data_dir=tmp_path_factory.mktemp("data"),
        readonly_models_dirs=(),
        api_key=None,
    )
    service = Service(conf)
    with BackgroundServer(service, conf) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
    service.close()


def _args_valid(call, tool) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_tool_choice_required_makes_a_valid_call(v1):
    r = v1.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello there!"}],
        tools=[WEATHER, ADD],
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not (choice.message.content or "").strip()
    (call,) = choice.message.tool_calls
    tool = {"get_weather": WEATHER, "add": ADD}[call.function.name]
    _args_valid(call, tool)


def test_a_named_tool_choice_calls_that_tool(v1):
    r = v1.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather?"}],
        tools=[WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
        temperature=0,
        max_tokens=60,
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add"
    args = _args_valid(call, ADD)
    assert set(args) == {"a", "b"}


def test_a_named_tool_that_is_not_offered_is_a_400(v1):
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        v1.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
