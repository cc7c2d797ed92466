"""Rendering harmony (gpt-oss) conversations: the HF chat template that gpt-oss GGUF files carry (rendered byte for
byte as transformers and llama.cpp render it), Ollama's gpt-oss Go template (think levels as Ollama passes them), and
what a harmony template makes a model able to do (`thinking`, `tools`)."""

from __future__ import annotations

import datetime
import re

import pytest

import localrt.templates.jinja as jinja_module
from localrt.runtime.reasoning import Split, tags_for
from localrt.templates import choose_template, is_harmony
from localrt.templates.harmony import HARMONY
from localrt.templates.prompt import chat_prompt, generate_prompt, load_template
from _testpaths import DATA as TESTS_DATA

DATA = TESTS_DATA / "templates" / "gpt-oss"
HF = (DATA / "chat_template.jinja").read_text()
OLLAMA = (DATA / "template.gotmpl").read_text()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {
                    "city": {"type": "string", "description": "The city"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a weather bot."}
ASK = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {
    "role": "assistant",
    "content": "",
    "thinking": "I should call get_weather.",
    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
}
RESULT = {"role": "tool", "content": '{"temp_c": 21}', "tool_name": "get_weather"}
FINAL = {"role": "assistant", "content": "It is 21 °C.", "thinking": "The tool says 21."}
AGAIN = {"role": "user", "content": "And tomorrow?"}
HISTORY = [SYSTEM, ASK, CALL, RESULT, FINAL, AGAIN]  # a finished tool loop, then a new question
TOOL_LOOP = [SYSTEM, ASK, CALL, RESULT]  # the model is to answer from the tool's result

HF_HEAD = """<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06
Current date: 2025-08-05

Reasoning: {effort}

# Valid channels: analysis, commentary, final. Channel must be included for every message.
Calls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions

You are a weather bot.

# Tools

## functions

namespace functions {{

// Current weather of a city
type get_weather = (_: {{
// The city
city: string,
unit?: "c" | "f",
}}) => any;

}} // namespace functions<|end|><|start|>user<|message|>What is the weather in Paris?<|end|>"""
HF_CALL = (
    '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
    '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"temp_c\\": 21}"<|end|>'
)
HF_HISTORY = (
    HF_HEAD.format(effort="high") + HF_CALL + "<|start|>assistant<|channel|>final<|message|>It is 21 °C.<|end|>"
    "<|start|>user<|message|>And tomorrow?<|end|><|start|>assistant"
)
HF_TOOL_LOOP = (
    HF_HEAD.format(effort="medium") + "<|start|>assistant<|channel|>analysis<|message|>"
    "I should call get_weather.<|end|>" + HF_CALL + "<|start|>assistant"
)


class _Day(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime(2025, 8, 5, 9, 30)


@pytest.fixture
def fixed_date(monkeypatch):
    """strftime_now() reads 2025-08-05, in our renderer and in transformers'."""
    monkeypatch.setattr(jinja_module, "datetime", type("M", (), {"datetime": _Day}))
    try:
        import transformers.utils.chat_template_utils as hf_utils

        monkeypatch.setattr(hf_utils, "datetime", _Day, raising=False)
    except ImportError:
        pass


def hf_render(messages, think=None) -> str:
    return chat_prompt(load_template(HF, "jinja"), messages, tools=TOOLS, think=think).text


def test_hf_template_history_drops_old_reasoning_and_takes_the_effort(fixed_date):
    assert hf_render(HISTORY, think="high") == HF_HISTORY


def test_hf_template_keeps_the_reasoning_of_a_tool_call_turn_inside_the_tool_loop(fixed_date):
    assert hf_render(TOOL_LOOP) == HF_TOOL_LOOP  # no think: "medium", as Ollama sends true


@pytest.mark.parametrize(
    "think, effort", [(None, "medium"), (True, "medium"), ("low", "low"), ("high", "high"), (False, "medium")]
)
def test_hf_template_reasoning_effort(fixed_date, think, effort):
    # think false cannot switch gpt-oss's reasoning off: the template keeps its own default
    assert f"\nReasoning: {effort}\n" in hf_render([ASK], think=think)


def test_hf_rendering_matches_transformers(fixed_date):
    """The same conversation in the HF message shape (a turn's reasoning in `thinking`), rendered by transformers."""
    hf_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    hf_call = {
        "role": "assistant",
        "content": "",
        "thinking": CALL["thinking"],
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
    hf_result = {"role": "tool", "content": RESULT["content"], "name": "get_weather"}
    for messages, ours, kw in (
        ([SYSTEM, ASK, hf_call, hf_result, FINAL, AGAIN], HF_HISTORY, {"reasoning_effort": "high"}),
        ([SYSTEM, ASK, hf_call, hf_result], HF_TOOL_LOOP, {}),
    ):
        theirs = hf_utils.render_jinja_template(
            [messages], tools=TOOLS, chat_template=HF, add_generation_prompt=True, **kw
        )
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs
        assert (theirs[0] if isinstance(theirs, list) else theirs) == ours


# -- Ollama's gpt-oss template ---------------------------------------------------------------------------------------


def go_render(messages, think=None, tools=TOOLS) -> str:
    text = chat_prompt(load_template(OLLAMA, "go"), messages, tools=tools, think=think).text
    return re.sub(r"Current date: \d{4}-\d{2}-\d{2}", "Current date: D", text)


GO_HEAD = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
    "2024-06\nCurrent date: D\n\nReasoning: {effort}\n\n# Valid channels: analysis, commentary, final. Channel "
    "must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'."
    "<|end|><|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {{\n\n// Current weather "
    "of a city\ntype get_weather = (_: {{\n  // The city\n  city: string,\n  unit: string,\n}}) => any;\n\n}} "
    "// namespace functions\n\n# Instructions\n\nYou are a weather bot.<|end|><|start|>user<|message|>What is the "
    "weather in Paris?<|end|>"
)
GO_CALL = (
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'
    '<|call|><|start|>functions.get_weather to=assistant<|message|>{"temp_c": 21}<|end|>'
)


def test_ollama_template_history_as_ollama_renders_it():
    assert go_render(HISTORY) == (
        GO_HEAD.format(effort="medium") + GO_CALL + "<|start|>assistant<|channel|>final"
        "<|message|>It is 21 °C.<|end|><|start|>user<|message|>And tomorrow?<|end|>"
        "<|start|>assistant"
    )
    assert go_render(TOOL_LOOP, think="low") == (
        GO_HEAD.format(effort="low") + "<|start|>assistant<|channel|>analysis"
        "<|message|>I should call get_weather.<|end|>" + GO_CALL + "<|start|>assistant"
    )


@pytest.mark.parametrize(
    "think, line",
    [(None, "Reasoning: medium"), (True, "Reasoning: medium"), ("high", "Reasoning: high"), (False, None)],
)
def test_ollama_template_think_values(think, line):
    text = go_render([ASK], think=think, tools=None)
    assert (re.search(r"Reasoning: \w+", text).group(0) if "Reasoning:" in text else None) == line


def test_ollama_template_prefill_continues_the_answer_and_the_parser_follows():
    prompt = chat_prompt(load_template(OLLAMA, "go"), [ASK, {"role": "assistant", "content": "It is"}]).text
    assert prompt.endswith("<|start|>assistant<|channel|>final<|message|>It is")
    split = Split(HARMONY, prompt, None)
    assert split.feed(" sunny.") == ("", " sunny.")


def test_generate_renders_through_the_harmony_template():
    prompt = generate_prompt(load_template(OLLAMA, "go"), "Hi", think="high").text
    assert "Reasoning: high" in prompt and prompt.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")


# -- detection and capabilities --------------------------------------------------------------------------------------


class _Req:
    think, think_field = "high", "think"


def test_both_templates_are_harmony_and_others_are_not():
    for source, kind in ((HF, "jinja"), (OLLAMA, "go")):
        t = load_template(source, kind)
        assert is_harmony(t) and t.supports_tools
        assert tags_for(t, _Req(), "gpt-oss") is HARMONY  # levels are a harmony model's own: never refused
    chatml = load_template("{{ range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}", "go")
    assert not is_harmony(chatml)


def test_a_gguf_chat_template_in_harmony_is_chosen_as_harmony():
    choice = choose_template({"tokenizer.chat_template": HF, "general.architecture": "gpt-oss"})
    assert choice.kind == "jinja" and is_harmony(choice.load())  # /api/show's capabilities: test_daemon_harmony


def test_a_format_holds_from_the_final_channel_on():
    from types import SimpleNamespace

    from localrt.runtime.reasoning import after_reasoning

    inner = SimpleNamespace(grammar=SimpleNamespace(index=None))
    held = after_reasoning(inner, HARMONY, "<|start|>assistant", None)
    assert held.tag == b"<|channel|>final<|message|>" and not held.looking and not held.open
    assert after_reasoning(None, HARMONY, "", None) is None
