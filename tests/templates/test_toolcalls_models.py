"""Tool-call round trip on SmolLM2 without the server: tools rendered through a Hermes-style Go template,
the call body generated under the tool's schema, streamed text parsed into calls, and the call plus a
`tool` result fed back through the template."""

from __future__ import annotations

import pytest

import localrt
from localrt.api.options import resolve
from localrt.engine.sampler import make_sampler
from localrt.structured import ConstrainedSampler, compile_format
from localrt.templates import GoChatTemplate
from localrt.templates.toolcalls import ToolCallParser, tag_for_template, tool_call_schema

from _structured_helpers import constrained_generate

HERMES_TEMPLATE = (
    "{{- if .Tools }}<|im_start|>system\nYou can call functions. Tools:\n<tools>\n"
    "{{- range .Tools }}\n{{ json .Function }}{{ end }}\n</tools>\n"
    'Answer a call as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n{{ end }}'
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
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 24},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    m = localrt.load_model(smollm2_path, num_ctx=512)
    yield m
    m.close()


def test_round_trip(smollm2):
    template = GoChatTemplate(HERMES_TEMPLATE)
    assert template.supports_tools and tag_for_template(template) == "<tool_call>"
    messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    prompt = template.render(messages, TOOLS)
    assert "get_weather" in prompt and prompt.endswith("<|im_start|>assistant\n")
    # The model is too small to open a call by itself: the prompt opens it, the schema shapes the body.
    ids = smollm2.tokenize(prompt + "<tool_call>\n")
    c = compile_format(tool_call_schema(TOOLS), smollm2.tokenizer)
    sampler = ConstrainedSampler(make_sampler(resolve({"temperature": 0.6, "seed": 3})), c)
    out, finished = constrained_generate(smollm2, ids, sampler, 60)
    assert finished

    parser = ToolCallParser(tag_for_template(template), TOOLS)
    decoder = smollm2.tokenizer.stream_decoder()
    content, calls = "", []
    for piece in ["<tool_call>\n"] + [decoder.add(t) for t in out] + [decoder.flush(), "\n</tool_call>"]:
        got = parser.feed(piece)
        content += got.content
        calls += got.calls
    rest = parser.flush()
    assert content + rest.content == "" and len(calls + rest.calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and call.arguments["unit"] in ("celsius", "fahrenheit")

    history = messages + [
        {"role": "assistant", "content": "", "tool_calls": [call.native()]},
        {"role": "tool", "content": "18 degrees, sunny", "tool_name": "get_weather"},
    ]
    again = template.render(history, TOOLS)
    assert '"name": "get_weather"' in again and "18 degrees, sunny" in again
