"""/v1/responses: the request translation and the reply's events on their own (no model), then the official
`openai` client (`responses.create`, `responses.stream`, `stream=True`) against a daemon on the built-in SmolLM2."""

from __future__ import annotations

import json
import typing

import httpx
import jsonschema
import openai
import pydantic
import pytest

from localrt.errors import InvalidRequest
from localrt.serve.openai_responses import responses_request
from localrt.serve.openai_responses_reply import ResponsesStream

MODEL = "smollm2:135m"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
COLOR = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "blue"]}},
    "required": ["color"],
    "additionalProperties": False,
}


# ---- the request, without a model ------------------------------------------------------------------------------


def test_a_string_input_with_instructions_is_a_system_and_a_user_turn():
    req, opts = responses_request(
        {
            "model": MODEL,
            "input": "hi",
            "instructions": "Be brief.",
            "max_output_tokens": 5,
            "temperature": 0.5,
            "seed": 3,
            "store": False,
            "service_tier": "auto",
        }
    )
    assert [(m.role, m.content) for m in req.messages] == [("system", "Be brief."), ("user", "hi")]
    assert req.options["num_predict"] == 5 and req.options["temperature"] == 0.5 and req.options["seed"] == 3
    assert opts.instructions == "Be brief." and opts.max_output_tokens == 5 and not opts.stream
    assert req.ignored == ["service_tier", "store"]  # unknown here: ignored, and named in the warning line


def test_replayed_items_become_the_chat_history():
    body = {
        "model": MODEL,
        "tools": [WEATHER],
        "input": [
            {"role": "developer", "content": "Use tools."},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "call it"}]},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "sunny"}]},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
            },
        ],
    }
    req, _ = responses_request(body)
    roles = [m.role for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    call = req.messages[2]
    assert call.thinking == "call it"
    assert call.tool_calls == [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}, "id": "call_1"}]
    assert (req.messages[3].content, req.messages[3].tool_call_id, req.messages[3].tool_name) == (
        "sunny",
        "call_1",
        "get_weather",
    )
    assert req.messages[1].content == "Weather in Paris?" and req.messages[4].content == "It is sunny."
    assert req.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": WEATHER["parameters"],
            },
        }
    ]
    assert req.ignored == []


@pytest.mark.parametrize(
    "body, named",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "web_search"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "not among the tools"),
        ({"tool_choice": "required"}, "no tools"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]}, "input_image"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"truncation": "middle"}, "truncation"),
        ({"include": ["nonsense"]}, "include"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(body, named):
    with pytest.raises(InvalidRequest, match=named):
        responses_request({"model": MODEL, "input": "hi", **body})


def test_text_format_and_tool_choice_map_onto_the_chat_request():
    req, opts = responses_request(
        {
            "model": MODEL,
            "input": "x",
            "text": {"format": {"type": "json_schema", "name": "c", "schema": COLOR, "strict": True}},
        }
    )
    assert req.format == COLOR and opts.text_format["name"] == "c"
    assert (
        responses_request({"model": MODEL, "input": "x", "text": {"format": {"type": "json_object"}}})[0].format
        == "json"
    )
    req, _ = responses_request(
        {"model": MODEL, "input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}}
    )
    assert req.tool_choice == "get_weather"
    req, _ = responses_request({"model": MODEL, "input": "x", "tools": [WEATHER], "tool_choice": "none"})
    assert req.tools == [] and req.tool_choice is None
    req, _ = responses_request(
        {
            "model": MODEL,
            "input": "x",
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "truncation": "auto",
        }
    )
    assert req.logprobs and req.top_logprobs == 2 and req.truncate


# ---- the reply, from native items ------------------------------------------------------------------------------

_EVENT = pydantic.TypeAdapter(openai.types.responses.ResponseStreamEvent)


def _events(raw: bytes) -> list[dict]:
    """SSE frames -> event dicts, each named in its `event:` line and valid as the openai package's event type."""
    out = []
    for frame in raw.decode().split("\n\n"):
        if frame:
            head, data = frame.split("\n")
            obj = json.loads(data.removeprefix("data: "))
            assert head == "event: " + obj["type"]
            _EVENT.validate_python(obj)
            out.append(obj)
    return out


def _done(reason="stop", **extra):
    return {
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": reason,
        "prompt_eval_count": 7,
        "eval_count": 3,
        "_prompt_cached_count": 4,
        **extra,
    }


def test_text_then_a_call_closes_the_message_before_the_function_call_item():
    _, opts = responses_request({"model": MODEL, "input": "x"})
    s = ResponsesStream(MODEL, opts)
    items = [
        {"message": {"content": "Let me check."}, "done": False},
        {
            "message": {
                "content": "\n",
                "tool_calls": [{"id": "call_9", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            "done": False,
        },
        _done(),
    ]
    evs = _events(b"".join(s.chunk(i) for i in items))
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert [e["type"] for e in evs] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = evs[-1]["response"]
    msg, call = final["output"]
    assert msg["content"][0]["text"] == "Let me check." and msg["status"] == "completed"
    assert (call["call_id"], call["name"], json.loads(call["arguments"])) == (
        "call_9",
        "get_weather",
        {"city": "Paris"},
    )
    assert final["usage"] == {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 10,
    }
    assert ResponsesStream(MODEL, opts).whole(items)["output"][1]["name"] == "get_weather"


def test_a_reply_cut_by_the_token_limit_is_incomplete():
    _, opts = responses_request({"model": MODEL, "input": "x", "max_output_tokens": 3})
    evs = _events(
        b"".join(
            ResponsesStream(MODEL, opts).chunk(i)
            for i in [{"message": {"content": "abc"}, "done": False}, _done("length")]
        )
    )
    assert evs[-1]["type"] == "response.incomplete"
    r = evs[-1]["response"]
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"][0]["status"] == "incomplete" and r["max_output_tokens"] == 3


def test_a_failure_after_the_first_byte_is_response_failed():
    _, opts = responses_request({"model": MODEL, "input": "x"})
    s = ResponsesStream(MODEL, opts)
    s.chunk({"message": {"content": "a"}, "done": False})
    (ev,) = _events(s.error("boom"))
    assert ev["type"] == "response.failed" and ev["response"]["error"]["message"] == "boom"
    assert ev["response"]["status"] == "failed"


# ---- through the openai client, on the real model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(shared_daemon):
    return shared_daemon  # this module only reads (conftest.py)


@pytest.fixture(scope="module")
def client(daemon):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")


def test_create_gives_a_response_object(client):
    r = client.responses.create(
        model=MODEL, input="Say hi.", instructions="Answer in English.", max_output_tokens=4, temperature=0
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.output_text.strip()
    assert r.usage.output_tokens == 4 and r.usage.total_tokens == r.usage.input_tokens + 4
    assert r.instructions == "Answer in English."
    # streamed: the deltas are the text of the final response's message
    deltas, last = [], None
    for ev in client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, temperature=0, stream=True):
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        last = ev
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    assert "".join(deltas) == last.response.output[0].content[0].text and len(deltas) == 4


def test_the_stream_helper_parses_a_json_schema_reply(client):
    with client.responses.stream(
        model=MODEL,
        input="Pick a color.",
        temperature=0,
        text={"format": {"type": "json_schema", "name": "c", "schema": COLOR}},
    ) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    jsonschema.validate(json.loads(final.output_text), COLOR)
    assert final.status == "completed" and final.text.format.type == "json_schema"


def test_a_required_tool_choice_gives_a_function_call_item_and_its_output_replays(client):
    r = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_output_tokens=40,
    )
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    follow = client.responses.create(
        model=MODEL,
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=3,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
    )
    assert follow.output[0].type == "message" and follow.usage.input_tokens > r.usage.input_tokens


def test_errors_have_the_openai_shape(client, daemon):
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")
    body = httpx.post(
        daemon.url + "/v1/responses", json={"model": MODEL, "input": "hi", "tools": [{"type": "file_search"}]}
    ).json()
    assert body["error"]["type"] == "invalid_request_error" and "file_search" in body["error"]["message"]


def test_parse_with_a_pydantic_text_format_and_logprobs(client):
    import pydantic

    class Pick(pydantic.BaseModel):
        color: typing.Literal["red", "blue"]

    r = client.responses.parse(
        model=MODEL,
        input="Pick a color.",
        temperature=0,
        text_format=Pick,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    assert isinstance(r.output_parsed, Pick)
    part = r.output[0].content[0]
    assert "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)


def test_cache_salt_reaches_the_chat_request():
    req, _ = responses_request({"model": MODEL, "input": "hi", "cache_salt": "team-a"})
    assert req.cache_salt == "team-a" and "cache_salt" not in req.ignored
    with pytest.raises(InvalidRequest, match="cache_salt"):
        responses_request({"model": MODEL, "input": "hi", "cache_salt": "x" * 300})
