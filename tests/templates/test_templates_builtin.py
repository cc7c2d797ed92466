"""Which template is in effect (Modelfile > GGUF > built-in family > default), with the real models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gguf_io
from localrt.templates import TemplateError
from localrt.templates.builtin import FAMILIES, choose_template, family_of_text
from localrt.templates.prompt import chat_prompt, render_prompt
from _testpaths import DATA

PROMPTS = json.loads((DATA / "prompts.json").read_text())
U = [{"role": "user", "content": "What is 2+2?"}]


def _metadata(path: Path) -> dict:
    with gguf_io.open(path) as f:
        return dict(f.metadata)


@pytest.fixture(scope="module")
def smollm2_meta(smollm2_path: Path) -> dict:
    return _metadata(smollm2_path)


@pytest.fixture(scope="module")
def gemma3_meta(gemma3_path: Path) -> dict:
    return _metadata(gemma3_path)


def test_smollm2_uses_its_gguf_template(smollm2_meta: dict) -> None:
    c = choose_template(smollm2_meta)
    assert (c.kind, c.origin) == ("jinja", "gguf")
    assert c.stop == ("<|im_start|>", "<|im_end|>")
    assert c.bos_token == "<|im_start|>" and c.eos_token == "<|im_end|>" and not c.strip_bos
    assert chat_prompt(c.load(), U).text == PROMPTS["smollm2"][1]


def test_gemma3_without_gguf_template_gets_builtin(gemma3_meta: dict) -> None:
    assert "tokenizer.chat_template" not in gemma3_meta
    c = choose_template(gemma3_meta)
    assert (c.kind, c.origin, c.stop) == ("go", "builtin:gemma3", ("<end_of_turn>",))
    assert "gemma3" in c.reason and "architecture" in c.reason
    assert chat_prompt(c.load(), U).text == PROMPTS["gemma3"][1]


def test_modelfile_template_wins(smollm2_meta: dict) -> None:
    src = (DATA / "templates" / "llama3-instruct" / "template.gotmpl").read_text()
    c = choose_template(smollm2_meta, modelfile_template=src)
    assert (c.kind, c.origin) == ("go", "modelfile")
    assert c.stop == FAMILIES["llama3"].stop
    with pytest.raises(TemplateError, match="unclosed action"):
        choose_template(smollm2_meta, modelfile_template="{{ .Prompt ")


def test_rejected_gguf_template_falls_back_and_says_why() -> None:
    meta = {"general.architecture": "qwen2", "tokenizer.chat_template": "{% for %}"}
    c = choose_template(meta)
    assert c.origin == "builtin:chatml" and "GGUF chat template was rejected" in c.reason


@pytest.mark.parametrize(
    "tokens,family",
    [
        (["<s>", "<|start_header_id|>", "<|eot_id|>"], "llama3"),
        (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "chatml"),
        (["<s>", "[INST]", "[/INST]"], "mistral"),
        (["<|user|>", "<|assistant|>", "<|end|>"], "phi3"),
    ],
)
def test_builtin_family_from_vocabulary(tokens: list[str], family: str) -> None:
    c = choose_template({"general.architecture": "llama", "tokenizer.ggml.tokens": tokens})
    assert c.origin == f"builtin:{family}" and c.stop == FAMILIES[family].stop


def test_default_template_passes_the_prompt() -> None:
    c = choose_template({"general.architecture": "llama", "tokenizer.ggml.tokens": ["a", "b"]})
    assert (c.origin, c.source, c.stop) == ("default", "{{ .Prompt }}", ())
    assert "as is" in c.reason
    assert chat_prompt(c.load(), U).text == "What is 2+2?"


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello, how are you?"}
A1 = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
U2 = {"role": "user", "content": "I'd like to show off how chat templating works!"}
CHATS = {"user": [U1], "user-assistant-user": [U1, A1, U2], "system-user-assistant-user": [SYSTEM, U1, A1, U2]}
SAME_AS = {
    "chatml": "chatml",
    "llama3": "llama3-instruct",
    "gemma": "gemma-instruct",
    "mistral": "mistral-instruct",
    "phi3": "phi-3",
    "gemma3": "gemma3-instruct",
}


@pytest.mark.parametrize("case", sorted(CHATS))
@pytest.mark.parametrize("family", sorted(SAME_AS))
def test_builtin_templates_match_ollama_prompts(family: str, case: str) -> None:
    got = render_prompt(FAMILIES[family].template, "go", CHATS[case])
    expected = (DATA / "templates" / SAME_AS[family] / case).read_text()
    if family == "gemma3":
        expected = expected[:-1]  # Ollama's gemma3 file ends in a stray blank line; HF's format does not
    assert got == expected


def test_family_of_text() -> None:
    assert family_of_text("<|im_start|>{{ .Role }}").name == "chatml"
    assert family_of_text("plain") is None
