"""Thinking models' real chat templates (issue 44): the official Qwen3 template and the DeepSeek-R1-Distill-Llama one,
as the GGUF files carry them (tests/fixtures/*.jinja), render what transformers renders for the same conversation
(the expected strings follow the templates by hand: system, tools, a prior reasoning turn, enable_thinking false),
and their reasoning tags are found."""

from __future__ import annotations

import json

import pytest

from localrt.templates import chat_prompt, load_template, opens_reasoning, thinking_tags
from _testpaths import FIXTURES

QWEN3 = (FIXTURES / "qwen3.jinja").read_text()
R1 = (FIXTURES / "deepseek_r1_distill_llama.jinja").read_text()
BOS = "<｜begin▁of▁sentence｜>"
SYSTEM = {"role": "system", "content": "You are helpful."}
USER = {"role": "user", "content": "Remember violet."}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def qwen3():
    return load_template(QWEN3, "jinja", eos_token="<|im_end|>")


def test_qwen3_thinks_unless_told_not_to(qwen3):
    head = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nRemember violet.<|im_end|>\n"
    assert chat_prompt(qwen3, [SYSTEM, USER]).text == head + "<|im_start|>assistant\n"
    assert chat_prompt(qwen3, [SYSTEM, USER], think=True).text == head + "<|im_start|>assistant\n"
    assert (
        chat_prompt(qwen3, [SYSTEM, USER], think=False).text == head + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert thinking_tags(qwen3) == ("<think>", "</think>")
    assert not opens_reasoning(chat_prompt(qwen3, [SYSTEM, USER]).text, ("<think>", "</think>"))


def test_qwen3_renders_a_reasoning_turn_after_the_last_question_and_drops_older_ones(qwen3):
    answered = {"role": "assistant", "content": "Answer.", "thinking": "Reason."}
    # transformers renders [system, user, assistant with reasoning_content] (no generation prompt) as this:
    expected = (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nRemember violet.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nReason.\n</think>\n\nAnswer.<|im_end|>\n"
    )
    assert chat_prompt(qwen3, [SYSTEM, USER, answered]).text == expected + "<|im_start|>assistant\n"
    later = chat_prompt(qwen3, [SYSTEM, USER, answered, {"role": "user", "content": "And?"}]).text
    assert "<|im_start|>assistant\nAnswer.<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n" in later
    assert "Reason." not in later  # an earlier turn's reasoning is not shown to the model again


def test_qwen3_tools_block(qwen3):
    text = chat_prompt(qwen3, [SYSTEM, USER], tools=[TOOL]).text
    assert text.startswith("<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions")
    assert "<tools>\n" + json.dumps(TOOL, ensure_ascii=False) + "\n</tools>" in text  # HF's tojson: no sorting
    assert text.endswith("<|im_start|>user\nRemember violet.<|im_end|>\n<|im_start|>assistant\n")


def test_deepseek_r1_opens_the_reasoning_and_drops_old_reasoning():
    r1 = load_template(R1, "jinja", bos_token=BOS)
    text = chat_prompt(r1, [SYSTEM, {"role": "user", "content": "Hi"}]).text
    assert text == BOS + "You are helpful.<｜User｜>Hi<｜Assistant｜><think>\n"
    assert thinking_tags(r1) == ("<think>", "</think>") and opens_reasoning(text, ("<think>", "</think>"))
    replay = chat_prompt(
        r1,
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "thinking": "Greet back."},
            {"role": "user", "content": "Bye"},
        ],
    ).text
    assert replay == BOS + "<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜><think>\n"
    # think false cannot switch this template off: it still opens the block (the service drops the reasoning)
    assert chat_prompt(r1, [{"role": "user", "content": "Hi"}], think=False).text.endswith("<think>\n")
