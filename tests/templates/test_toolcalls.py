"""Tool-call parsing: the three template formats, streaming hold-back, and raw text kept on failure."""

from __future__ import annotations

import json
import random
import re

import pytest

from localrt.templates.toolcalls import (
    HERMES,
    JSON_START,
    MISTRAL,
    ToolCallParser,
    parse_tool_calls,
    tag_for_template,
    tool_call_schema,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
]


def _calls(parsed):
    return [(c.name, c.arguments) for c in parsed.calls]


@pytest.mark.parametrize(
    "tag, text, content, calls",
    [
        (
            HERMES,
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>',
            "",
            [("get_weather", {"city": "Tokyo"})],
        ),
        (
            HERMES,
            'Let me check.\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>',
            "Let me check.\n\n",
            [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Lima"})],
        ),
        (HERMES, '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>', "", [("add", {"a": 1})]),
        (
            HERMES,
            '<tool_call>{"type": "function", "function": {"name": "add", "arguments": {}}}</tool_call>',
            "",
            [("add", {})],
        ),
        (
            MISTRAL,
            '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]',
            "",
            [("add", {"a": 1}), ("get_weather", {"city": "Oslo"})],
        ),
        (MISTRAL, '[TOOL_CALLS]add[ARGS]{"a": 5}', "", [("add", {"a": 5})]),
        (
            JSON_START,
            '  {"name": "get_weather", "parameters": {"city": "Rome"}}',
            "",
            [("get_weather", {"city": "Rome"})],
        ),
        (
            "<|python_tag|>",
            '<|python_tag|>{"name": "add", "parameters": {"x": [1, "}"]}}',
            "",
            [("add", {"x": [1, "}"]})],
        ),
    ],
)
def test_formats(tag, text, content, calls):
    parsed = parse_tool_calls(text, tag, TOOLS)
    assert parsed.content == content
    assert _calls(parsed) == calls
    assert [c.index for c in parsed.calls] == list(range(len(calls)))


@pytest.mark.parametrize(
    "tag, text",
    [
        (HERMES, '<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>'),  # unbalanced
        (HERMES, '<tool_call>{"name": "add", "arguments": {"a": 1},}</tool_call>'),  # invalid JSON
        (HERMES, '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'),  # tool not offered
        (HERMES, '<tool_call>{"name": "add", "arguments": [1]}</tool_call>'),  # arguments not an object
        (HERMES, '<tool_call>{"name": "add"}</tool_call>'),  # no arguments
        (HERMES, '<tool_call>{"name": "add", "arguments": {"a": '),  # cut off by the end of output
        (HERMES, "<tool_call>just words</tool_call>"),
        (MISTRAL, "[TOOL_CALLS] not json"),
        (JSON_START, '{"answer": 4}'),  # JSON, but not a call
        (JSON_START, 'The answer: {"name": "add", "parameters": {}}'),  # JSON calls only at the start
    ],
)
def test_failures_keep_raw_text(tag, text):
    parsed = parse_tool_calls(text, tag, TOOLS)
    assert parsed.calls == []
    assert parsed.content == text


@pytest.mark.parametrize(
    "tag, text",
    [
        (
            HERMES,
            'Sure <tool_ca> thing. <tool_call>{"name": "add", "arguments": {"s": "</tool_call>"}}</tool_call> done <tool',
        ),
        (MISTRAL, 'x [TOOL_CALLS] [{"name": "add", "arguments": {"a": "[TOOL_CALLS]"}}]'),
        (JSON_START, ' \n{"name": "add", "arguments": {"q": "{\\"}"}}'),
        (HERMES, '<tool_call>{"name": "add", "arguments": {"a": 1}'),
    ],
)
def test_streaming_matches_whole_text(tag, text):
    whole = parse_tool_calls(text, tag, TOOLS)
    rng = random.Random(0)
    for _ in range(20):
        p = ToolCallParser(tag, TOOLS)
        content, calls, i = "", [], 0
        while i < len(text):
            n = rng.randint(1, 6)
            out = p.feed(text[i : i + n])
            content += out.content
            calls += out.calls
            i += n
        out = p.flush()
        assert content + out.content == whole.content
        assert [(c.name, c.arguments) for c in calls + out.calls] == _calls(whole)


def test_holds_back_only_what_may_be_a_tag():
    p = ToolCallParser(HERMES, TOOLS)
    assert p.feed("Hello <tool").content == "Hello "
    assert p.feed("s are fun").content == "<tools are fun"
    out = p.feed('<tool_call>{"name": "add", "arguments": {}}')
    assert out.content == "" and out.calls == []  # the closing tag may still come
    out = p.feed("</tool_call>")
    assert _calls(out) == [("add", {})]
    assert p.flush().content == ""


def test_call_shapes():
    call = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"b": 2, "a": 1}}</tool_call>').calls[0]
    assert re.fullmatch(r"call_[a-z0-9]{8}", call.id)
    assert call.native() == {"id": call.id, "function": {"index": 0, "name": "add", "arguments": {"b": 2, "a": 1}}}
    oa = call.openai()
    assert oa["type"] == "function" and oa["index"] == 0 and json.loads(oa["function"]["arguments"]) == {"b": 2, "a": 1}
    assert list(json.loads(oa["function"]["arguments"])) == ["b", "a"]  # key order kept


def test_tag_for_template():
    from localrt.templates import GoChatTemplate, JinjaChatTemplate

    hermes_go = (
        "{{- if .Tools }}<tools>{{ range .Tools }}{{ . }}{{ end }}</tools>{{ end }}"
        "{{- range .Messages }}{{ if .ToolCalls }}<tool_call>\n{{ range .ToolCalls }}{{ .Function.Name }}{{ end }}"
        "</tool_call>{{ else }}{{ .Content }}{{ end }}{{ end }}"
    )
    assert tag_for_template(GoChatTemplate(hermes_go)) == HERMES
    assert tag_for_template(GoChatTemplate("{{ .Prompt }}")) == JSON_START
    jinja = "{% for m in messages %}{{ m.content }}{% if tools %}<tool_call>{% endif %}{% endfor %}"
    assert tag_for_template(JinjaChatTemplate(jinja)) == HERMES
    assert tag_for_template(JinjaChatTemplate("{{ messages }} [TOOL_CALLS]")) == MISTRAL


def test_tool_call_schema():
    schema = tool_call_schema(
        [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                },
            }
        ]
    )
    assert schema["properties"]["name"] == {"const": "f"}
    assert "anyOf" in tool_call_schema(TOOLS)
