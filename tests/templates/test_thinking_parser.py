"""The reasoning / answer split (localrt.templates.thinking), fed whole and one character at a time: the two must
agree on every case, and every case is what Ollama's parser gives for the same output."""

from __future__ import annotations

import pytest

from localrt.templates.thinking import ThinkingParser, opens_reasoning, thinking_tags
from localrt.templates import load_template

CASES = [
    # (output, opened by the prompt, reasoning, answer)
    ("<think>abc</think>def", False, "abc", "def"),
    ("  <think>\n abc \n</think>\n\ndef ", False, "abc", "def "),
    ("no reasoning here <think>x</think>", False, "", "no reasoning here <think>x</think>"),
    ("abc</think>\n\ndef", True, "abc", "def"),
    ("\n\nabc </think>def", True, "abc", "def"),
    ("<think>never closed ", False, "never closed", ""),
    ("still thinking", True, "still thinking", ""),
    ("<think></think>answer", False, "", "answer"),
    ("<thi", False, "", "<thi"),
    ("<think>a</thin", False, "a</thin", ""),
    ("<think>a</think>b</think>", False, "a", "b</think>"),
    ("", False, "", ""),
    ("   ", True, "", ""),
]


def _run(parser: ThinkingParser, pieces: list[str]) -> tuple[str, str]:
    reasoning = answer = ""
    for p in pieces:
        r, a = parser.feed(p)
        reasoning, answer = reasoning + r, answer + a
    r, a = parser.flush()
    return reasoning + r, answer + a


@pytest.mark.parametrize("output, opened, reasoning, answer", CASES)
def test_whole_and_streamed_agree(output, opened, reasoning, answer):
    assert _run(ThinkingParser(opened=opened), [output]) == (reasoning, answer)
    assert _run(ThinkingParser(opened=opened), list(output)) == (reasoning, answer)


def test_nothing_that_may_still_be_a_tag_is_sent_early():
    p = ThinkingParser()
    assert p.feed("<think>abc </") == ("abc", "")  # " </" may be the closing tag: held back
    assert p.in_reasoning
    assert p.feed("b>") == (" </b>", "")  # it was not
    assert p.feed("</think>ok") == ("", "ok") and not p.in_reasoning


QWEN3_GO = (  # the shape of Ollama's qwen3 template: a message's reasoning inside the Messages range
    "{{- range $i, $_ := .Messages }}<|im_start|>{{ .Role }}\n"
    '{{- if and .Thinking (eq .Role "assistant") }}\n<think>{{ .Thinking }}</think>\n{{ end }}'
    "{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)


def test_tags_come_from_the_template():
    assert thinking_tags(load_template(QWEN3_GO, "go")) == ("<think>", "</think>")
    plain = "{{ range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
    assert thinking_tags(load_template(plain, "go")) is None
    r1 = "{% for m in messages %}{{ m.content }}{% endfor %}<|Assistant|><think>\n{# the model closes </think> #}"
    assert thinking_tags(load_template(r1, "jinja")) == ("<think>", "</think>")
    assert opens_reasoning("<|Assistant|><think>\n", ("<think>", "</think>"))
    assert not opens_reasoning("<think>\n\n</think>\n\n", ("<think>", "</think>"))
