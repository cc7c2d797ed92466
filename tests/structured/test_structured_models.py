"""Constrained sampling on both real models (temperature > 0, several seeds): every finished output parses
and validates. Driven by a small loop over the model's forward + KV cache (tests/_structured_helpers.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest

import localrt
from localrt.api.options import resolve
from localrt.engine.sampler import make_sampler
from localrt.structured import ConstrainedSampler, compile_format
from localrt.templates.toolcalls import parse_tool_calls, tool_call_schema

from _structured_helpers import constrained_generate

SMALL = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "count": {"type": "integer", "minimum": 0, "maximum": 20},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["ok", "count", "color"],
    "additionalProperties": False,
}
RICH = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
        "scores": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
        "note": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/short"}]},
    },
    "required": ["name", "code", "scores", "note"],
    "additionalProperties": False,
    "$defs": {"short": {"type": "string", "maxLength": 6}},
}

CHAT = {
    "llama": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    m = localrt.load_model(request.getfixturevalue(f"{request.param}_path"), num_ctx=256)
    yield m
    m.close()


def _prompt(model, text: str) -> list[int]:
    return model.tokenize(CHAT[model.config.arch].format(text))


def _run(model, fmt, prompt: str, seed: int, max_tokens: int, temperature: float = 0.9):
    c = compile_format(fmt, model.tokenizer)
    sampler = make_sampler(resolve({"temperature": temperature, "seed": seed, "top_k": 0, "top_p": 1.0}))
    ids, finished = constrained_generate(model, _prompt(model, prompt), ConstrainedSampler(sampler, c), max_tokens)
    text = model.detokenize(ids)
    assert text.encode() == bytes(c.text)
    return text, finished, c


def test_small_schema_many_seeds(model):
    for seed in range(4):
        text, finished, _ = _run(model, SMALL, "Give me a JSON object with ok, count and color.", seed, 40, 0.7)
        assert finished, text
        jsonschema.validate(json.loads(text), SMALL)


def test_rich_schema(model):
    text, finished, _ = _run(model, RICH, "Describe a product as JSON.", 11, 120, temperature=0.7)
    assert finished, text
    jsonschema.validate(json.loads(text), RICH)


def test_json_format_prefix_always_valid(model):
    text, finished, c = _run(model, "json", "Reply in JSON: what is 2+2?", 3, 40, temperature=0.7)
    if finished:
        assert isinstance(json.loads(text), dict)
    else:  # cut by the token budget: still a prefix the automaton accepts, and it started an object
        assert text.lstrip().startswith("{")


def test_tool_call_constrained_round_trip(model):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 20},
                        "unit": {"enum": ["celsius", "fahrenheit"]},
                    },
                    "required": ["city", "unit"],
                },
            },
        }
    ]
    text, finished, _ = _run(
        model, tool_call_schema(tools), "What is the weather in Paris? Call get_weather.", 5, 60, 0.5
    )
    assert finished, text
    parsed = parse_tool_calls("<tool_call>\n" + text + "\n</tool_call>", "<tool_call>", tools)
    assert parsed.content == "" and len(parsed.calls) == 1
    call = parsed.calls[0]
    assert call.name == "get_weather" and set(call.arguments) == {"city", "unit"}
