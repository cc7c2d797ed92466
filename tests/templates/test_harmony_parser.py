"""The harmony (gpt-oss) output parser: channels to reasoning, answer and tool calls, whole and in pieces of every
size, tolerant of a missing <|start|>assistant or <|end|>, of unknown channels and of output cut off anywhere."""

from __future__ import annotations

import pytest

from localrt.errors import InvalidRequest
from localrt.templates.harmony import (
    HarmonyParser,
    Header,
    is_harmony_source,
    parse_header,
    parse_output,
    reasoning_effort,
    render_think,
)

PROMPT = "<|start|>user<|message|>Hi<|end|><|start|>assistant"
ANSWER = (
    "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!"
)
CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris", "days": [1, 2]}<|call|>'
)


def streamed(text: str, n: int, prompt: str = PROMPT):
    """(thinking, content, calls) of `text` fed in pieces of n characters."""
    p = HarmonyParser.for_prompt(prompt)
    thinking = content = ""
    calls = []
    for i in range(0, len(text), n):
        got = p.feed(text[i : i + n])
        thinking, content, calls = thinking + got.thinking, content + got.content, calls + got.calls
    got = p.flush()
    return thinking + got.thinking, content + got.content, calls + got.calls


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 11, 1000])
def test_reasoning_then_answer_in_pieces_of_any_size(n):
    thinking, content, calls = streamed(ANSWER + "<|return|>", n)
    assert (thinking, content, calls) == ("The user greets me.", "Hello there!", [])


@pytest.mark.parametrize("n", [1, 3, 8, 1000])
def test_a_tool_call_on_the_commentary_channel(n):
    thinking, content, calls = streamed(CALL, n)
    assert thinking == "Need the weather." and content == ""
    assert [(c.name, c.arguments, c.index) for c in calls] == [("get_weather", {"city": "Paris", "days": [1, 2]}, 0)]
    assert calls[0].id.startswith("call_")


def test_a_call_ends_with_the_output_too():
    # <|call|> ends the generation (an end-of-generation token): the text usually stops before it
    assert streamed(CALL[: -len("<|call|>")], 4)[2][0].arguments == {"city": "Paris", "days": [1, 2]}


def test_recipient_before_the_channel_and_the_hf_templates_spelling():
    out = parse_output(' to=functions.lookup<|channel|>commentary json<|message|>{"q": "x"}<|call|>')
    assert [(c.name, c.arguments) for c in out.calls] == [("lookup", {"q": "x"})]


def test_a_call_on_the_analysis_channel_and_a_builtin_tool_keep_their_names():
    out = parse_output('<|channel|>analysis to=browser.search<|message|>{"query": "gpt-oss"}<|call|>')
    assert [(c.name, c.arguments) for c in out.calls] == [("browser.search", {"query": "gpt-oss"})]
    assert out.thinking == "" and out.content == ""


def test_several_calls_are_numbered():
    one = '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": %d}<|call|>'
    out = parse_output((one % 1)[len("<|start|>assistant") :] + one % 2)
    assert [(c.arguments, c.index) for c in out.calls] == [({"a": 1}, 0), ({"a": 2}, 1)]


def test_call_arguments_that_are_not_an_object_are_given_back_as_text():
    out = parse_output('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1<|call|>')
    assert out.calls == [] and out.content == '{"a": 1'
    assert parse_output("<|channel|>commentary to=functions.f<|message|>[1, 2]").content == "[1, 2]"


def test_arguments_past_the_bound_are_given_back_as_text():
    from localrt.templates.toolcalls import MAX_CALL_CHARS

    body = '{"a": "' + "x" * MAX_CALL_CHARS + '"}'
    _, content, calls = streamed("<|channel|>commentary to=functions.f<|message|>" + body + "<|call|>", 4096)
    assert calls == [] and content == body


def test_commentary_without_a_recipient_is_answer_text():
    out = parse_output(
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|>Done."
    )
    assert (out.thinking, out.content) == ("", "Let me check.Done.")


def test_an_unknown_channel_or_none_is_answer_text_as_in_ollama():
    assert parse_output("<|channel|>scratchpad<|message|>odd<|end|>").content == "odd"
    assert parse_output("<|message|>no channel<|end|>").content == "no channel"


def test_a_missing_start_assistant_between_messages():
    out = parse_output("<|channel|>analysis<|message|>A<|end|><|channel|>final<|message|>B<|return|>")
    assert (out.thinking, out.content) == ("A", "B")


def test_a_missing_end_before_the_next_message():
    out = parse_output("<|channel|>analysis<|message|>A<|start|>assistant<|channel|>final<|message|>B")
    assert (out.thinking, out.content) == ("A", "B")
    out = parse_output("<|channel|>analysis<|message|>A<|channel|>final<|message|>B")
    assert (out.thinking, out.content) == ("A", "B")


@pytest.mark.parametrize("cut", range(1, len(ANSWER)))
def test_output_cut_off_anywhere_never_leaks_markers_or_reasoning(cut):
    thinking, content, calls = streamed(ANSWER[:cut], 3)
    assert "<|" not in thinking + content and calls == []
    assert "The user greets me."[: len(thinking)] == thinking  # reasoning stays reasoning, cut where it was cut
    assert "Hello there!".startswith(content)


def test_a_stop_inside_the_reasoning_keeps_it_as_reasoning():
    # num_predict or a stop string ends the output before the analysis message closes
    thinking, content, _ = streamed("<|channel|>analysis<|message|>Step one, then step tw", 2)
    assert (thinking, content) == ("Step one, then step tw", "")


def test_text_that_only_looks_like_a_marker_start_is_kept_and_a_cut_off_marker_dropped():
    _, content, _ = streamed("<|channel|>final<|message|>a <| b <|en", 1)
    assert content == "a <| b "


def test_plain_text_where_a_header_was_due_is_the_answer():
    assert streamed("Hello plain text", 1) == ("", "Hello plain text", [])
    assert parse_output("x" * 600, prompt="<|start|>").content == "x" * 600  # no role given: a long non-header


def test_text_outside_any_message_is_answer_text_and_blanks_between_messages_are_dropped():
    out = parse_output(
        "<|channel|>final<|message|>A<|end|>\n<|start|>assistant<|channel|>final<|message|>B<|end|>trailing"
    )
    assert out.content == "ABtrailing"


def test_a_prompt_that_prefills_the_answer_or_the_reasoning_continues_it():
    assert streamed(" world", 2, prompt=PROMPT + "<|channel|>final<|message|>Hello")[1] == " world"
    got = streamed(
        "more.<|end|><|start|>assistant<|channel|>final<|message|>Hi",
        2,
        prompt=PROMPT + "<|channel|>analysis<|message|>Some",
    )
    assert got[:2] == ("more.", "Hi")
    assert (
        streamed("<|start|>assistant<|channel|>final<|message|>Hi", 2, prompt="<|start|>user<|message|>x<|end|>")[1]
        == "Hi"
    )


def test_a_prompt_ending_inside_an_unknown_channel_is_a_400_naming_it():
    with pytest.raises(InvalidRequest, match="'scratchpad'"):
        HarmonyParser.for_prompt(PROMPT + "<|channel|>scratchpad<|message|>")
    with pytest.raises(InvalidRequest, match="no channel"):
        HarmonyParser.for_prompt(PROMPT + "<|message|>")


@pytest.mark.parametrize(
    "raw, header",
    [
        ("assistant<|channel|>analysis", Header("assistant", "analysis")),
        (
            "assistant<|channel|>commentary to=functions.f <|constrain|>json",
            Header("assistant", "commentary", "functions.f", "json"),
        ),
        (
            "assistant<|channel|>commentary to=functions.f<|constrain|>json",
            Header("assistant", "commentary", "functions.f", "json"),
        ),
        (
            "assistant to=functions.f<|channel|>commentary json",
            Header("assistant", "commentary", "functions.f", "json"),
        ),
        ("to=functions.f<|channel|>commentary", Header("", "commentary", "functions.f")),
        (
            "functions.get_weather to=assistant<|channel|>commentary",
            Header("functions.get_weather", "commentary", "assistant"),
        ),
    ],
)
def test_headers(raw, header):
    assert parse_header(raw) == header


def test_detection_and_think_values():
    assert is_harmony_source("<|start|>assistant<|channel|>final<|message|>")
    assert not is_harmony_source("<|start|>user<|end|>") and not is_harmony_source("<|im_start|>")
    assert [render_think(t) for t in (None, True, False, "low")] == [True, True, False, "low"]
    assert [reasoning_effort(t) for t in (None, True, False, "low", "high")] == [
        "medium",
        "medium",
        None,
        "low",
        "high",
    ]
