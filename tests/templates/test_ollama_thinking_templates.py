"""Ollama's own Go templates for qwen3 and deepseek-r1 (issue 44's proof, the Go side), rendered by our Go engine
as Ollama's template.Execute renders them: system, tools, a prior reasoning turn, and `think` true, false and unset.

The fixtures are the registry's template blobs byte for byte (what `ollama show --template qwen3:8b` and
`ollama show --template deepseek-r1:8b` print); their sha256 is the blob's digest, checked below:
  tests/fixtures/ollama_qwen3.gotmpl        sha256:ae370d884f10...  (qwen3:0.6b ... qwen3:235b; 1723 bytes, it
                                            starts with a newline that the first `{{-` trims)
  tests/fixtures/ollama_deepseek_r1.gotmpl  sha256:c5ad996bda6e...  (deepseek-r1:8b and the 2025-05-28 update's
                                            tags: the template that reads `.Thinking` and `$.IsThinkSet`)
Both texts were taken from `/api/show` "template" fields quoted verbatim in public repositories, and the digests
match the blob names Ollama's pull prints, so the bytes are the published ones.

Each expected string is worked out from Go's text/template semantics (`{{-`/`-}}` trim all adjacent whitespace;
`and`/`or` return an operand; `slice`/`len`/`eq`/`gt` as in Go) and Ollama's Execute: all system messages are
joined into `.System` but stay in `.Messages` too; `.Think` is the request's think as a bool, `.IsThinkSet`
whether it was sent at all.

`{{ .Function }}` in qwen3's tools block prints the function as JSON: json.Marshal of
{"name","description","parameters":{"type","$defs"?,"items"?,"required"?,"properties"}}, HTML characters escaped
(\\u0026 \\u003c \\u003e), the properties map with sorted keys, each property in ToolProperty field order (anyOf,
type, items, description, enum, properties, required). That is what api.ToolFunction.String() printed up to
Ollama 0.13 and what ollama/ollama#18391 restores; Ollama 0.14+ prints Go struct syntax there instead
(`{get_weather Weather ... {object <nil> <nil> [city] ...}}`, ollama/ollama#14601, a known open bug), which we do
not copy. Tool-call arguments print as JSON with sorted keys (a Go map), in every Ollama version.
"""

from __future__ import annotations

import hashlib

import pytest

from localrt.templates import chat_prompt, load_template, thinking_tags
from localrt.templates.capabilities import capabilities
from _testpaths import FIXTURES

QWEN3_SRC = (FIXTURES / "ollama_qwen3.gotmpl").read_bytes()
R1_SRC = (FIXTURES / "ollama_deepseek_r1.gotmpl").read_bytes()

SYSTEM = {"role": "system", "content": "You are helpful."}
USER = {"role": "user", "content": "Hi"}
ANSWER = {"role": "assistant", "content": "Hello.", "thinking": "Greet."}
USER2 = {"role": "user", "content": "And?"}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather & <wind>",
        "parameters": {
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["c", "f"]},
                "city": {"type": "string", "description": "City"},
            },
            "required": ["city"],
        },
    },
}
TOOL_JSON = (
    '{"name":"get_weather","description":"Weather \\u0026 \\u003cwind\\u003e","parameters":'
    '{"type":"object","required":["city"],"properties":{"city":{"type":"string","description":"City"},'
    '"unit":{"type":"string","enum":["c","f"]}}}}'
)
CALL = {
    "role": "assistant",
    "content": "",
    "thinking": "Need weather.",
    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"unit": "c", "city": "Oslo"}}}],
}
RESULT = {"role": "tool", "content": "3 C", "tool_name": "get_weather"}

NO_THINK_BLOCK = "<think>\n\n</think>\n\n"
UNSET, ON, OFF = None, True, False


@pytest.fixture(scope="module")
def qwen3():
    return load_template(QWEN3_SRC.decode(), "go")


@pytest.fixture(scope="module")
def r1():
    return load_template(R1_SRC.decode(), "go")


def test_fixtures_are_the_registry_blobs() -> None:
    assert hashlib.sha256(QWEN3_SRC).hexdigest() == "ae370d884f108d16e7cc8fd5259ebc5773a0afa6e078b11f4ed7e39a27e0dfc4"
    assert hashlib.sha256(R1_SRC).hexdigest() == "c5ad996bda6eed4df6e3b605a9869647624851ac248209d22fd5e2c0cc1121d3"
    assert len(QWEN3_SRC) == 1723 and len(R1_SRC) == 556


def test_both_templates_are_thinking_templates(qwen3, r1) -> None:
    # Ollama lists `thinking` for a template that prints `.Thinking`, with the text around it as the tags.
    assert thinking_tags(qwen3) == ("<think>", "</think>")
    assert thinking_tags(r1) == ("<think>", "</think>")
    assert capabilities(qwen3.template) == {"completion", "tools"}
    assert capabilities(r1.template) == {"completion"}


# --- qwen3 -----------------------------------------------------------------------------------------------------

# `<|im_start|>system\n{{ if .System }}\n{{ .System }}{{- end }}`: the published template leaves a blank line
# after "system" (the Jinja one does not).
Q_SYSTEM = "<|im_start|>system\n\nYou are helpful.<|im_end|>\n"


@pytest.mark.parametrize(
    "think, user_suffix, tail",
    [
        (UNSET, "", ""),
        (ON, " /think", ""),
        (OFF, " /no_think", NO_THINK_BLOCK),
    ],
)
def test_qwen3_system_and_think(qwen3, think, user_suffix, tail) -> None:
    got = chat_prompt(qwen3, [SYSTEM, USER], think=think).text
    assert got == Q_SYSTEM + f"<|im_start|>user\nHi{user_suffix}<|im_end|>\n<|im_start|>assistant\n{tail}"


@pytest.mark.parametrize(
    "think, user_suffix, tail",
    [
        (UNSET, "", ""),
        (ON, " /think", ""),
        (OFF, " /no_think", NO_THINK_BLOCK),
    ],
)
def test_qwen3_drops_reasoning_before_the_last_user_turn(qwen3, think, user_suffix, tail) -> None:
    # The answered turn (index 2) comes before the last user message (index 3): its thinking is not shown, and only
    # the last user message gets the /think or /no_think switch.
    got = chat_prompt(qwen3, [SYSTEM, USER, ANSWER, USER2], think=think).text
    assert got == (
        Q_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
        f"<|im_start|>user\nAnd?{user_suffix}<|im_end|>\n<|im_start|>assistant\n{tail}"
    )


@pytest.mark.parametrize(
    "think, user_suffix, reasoning",
    [
        (UNSET, "", ""),  # IsThinkSet false: no reasoning replayed at all
        (ON, " /think", "<think>Greet.</think>\n"),
        (OFF, " /no_think", "<think>Greet.</think>\n"),  # the condition is IsThinkSet, not Think
    ],
)
def test_qwen3_keeps_reasoning_after_the_last_user_turn(qwen3, think, user_suffix, reasoning) -> None:
    # A last assistant message is a prefill: no <|im_end|>, no new assistant header, no empty think block.
    got = chat_prompt(qwen3, [USER, ANSWER], think=think).text
    assert got == f"<|im_start|>user\nHi{user_suffix}<|im_end|>\n<|im_start|>assistant\n{reasoning}Hello."


TOOLS_BLOCK = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": ' + TOOL_JSON + "}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def test_qwen3_tools_without_system(qwen3) -> None:
    got = chat_prompt(qwen3, [USER], tools=[TOOL]).text
    assert got == "<|im_start|>system\n" + TOOLS_BLOCK + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "think, user_suffix, reasoning, tail",
    [
        (UNSET, "", "", ""),
        (ON, " /think", "<think>Need weather.</think>\n", ""),
        (OFF, " /no_think", "<think>Need weather.</think>\n", NO_THINK_BLOCK),
    ],
)
def test_qwen3_tool_call_after_reasoning_and_its_result(qwen3, think, user_suffix, reasoning, tail) -> None:
    # The tool-calling turn (index 2) follows the last user message (index 1), so its reasoning is replayed when
    # think was sent; the tool result is rendered as a user turn; the arguments print with sorted keys.
    got = chat_prompt(qwen3, [SYSTEM, USER, CALL, RESULT], tools=[TOOL], think=think).text
    assert got == (
        "<|im_start|>system\n\nYou are helpful."
        + TOOLS_BLOCK
        + f"<|im_start|>user\nHi{user_suffix}<|im_end|>\n<|im_start|>assistant\n{reasoning}"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo","unit":"c"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n3 C\n</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\n{tail}"
    )


def test_qwen3_think_level_counts_as_think_on(qwen3) -> None:
    # A level string is a set, true think value (ThinkValue.Bool()).
    got = chat_prompt(qwen3, [USER], think="high").text
    assert got == "<|im_start|>user\nHi /think<|im_end|>\n<|im_start|>assistant\n"


# --- deepseek-r1 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("think, tail", [(UNSET, ""), (ON, ""), (OFF, NO_THINK_BLOCK)])
def test_r1_system_and_think(r1, think, tail) -> None:
    # `.System` is printed bare, before the first turn; the system message itself prints nothing in the range.
    got = chat_prompt(r1, [SYSTEM, USER], think=think).text
    assert got == "You are helpful.<｜User｜>Hi<｜Assistant｜>" + tail


@pytest.mark.parametrize("think, tail", [(UNSET, ""), (ON, ""), (OFF, NO_THINK_BLOCK)])
def test_r1_drops_reasoning_of_earlier_turns(r1, think, tail) -> None:
    got = chat_prompt(r1, [SYSTEM, USER, ANSWER, USER2], think=think).text
    assert got == (
        "You are helpful.<｜User｜>Hi<｜Assistant｜>Hello.<｜end▁of▁sentence｜><｜User｜>And?<｜Assistant｜>" + tail
    )


@pytest.mark.parametrize(
    "think, reasoning",
    [
        (UNSET, ""),
        (ON, "<think>\nGreet.\n</think>"),  # `{{- end }}` eats the newline after </think>
        (OFF, "<think>\nGreet.\n</think>"),
    ],
)
def test_r1_replays_reasoning_only_on_the_last_assistant_turn(r1, think, reasoning) -> None:
    got = chat_prompt(r1, [USER, ANSWER], think=think).text
    assert got == "<｜User｜>Hi<｜Assistant｜>" + reasoning + "Hello."


def test_r1_without_system(r1) -> None:
    assert chat_prompt(r1, [USER], think=False).text == "<｜User｜>Hi<｜Assistant｜>" + NO_THINK_BLOCK
