"""Built-in models: name resolution, their Modelfiles and templates (checked against the reference
prompts and SmolLM2's own Jinja template), and one real offline creation from the PyPI package."""

from __future__ import annotations

import dataclasses
import json
import sys

import jinja2
import pytest

import gguf_io
import modelfile as M
import store as st
from localrt.models import builtin_models, library
from localrt.models.create import config_from_gguf, create, gguf_facts
from localrt.templates.prompt import generate_prompt, load_template, render_prompt
from _testpaths import DATA, TESTS

sys.path.insert(0, str(TESTS))
from fixtures.decoders import write_tiny  # noqa: E402

PROMPTS = json.loads((DATA / "prompts.json").read_text())


@pytest.mark.parametrize(
    "name, expected",
    [
        ("smollm2:135m", "smollm2:135m"),
        ("SmolLM2:135M", "smollm2:135m"),
        ("smollm2", "smollm2:135m"),
        ("registry.ollama.ai/library/smollm2:135m", "smollm2:135m"),
        ("gemma3:270m", "gemma3:270m"),
        ("gemma3", "gemma3:270m"),
        ("smollm2:1.7b", None),
        ("user/smollm2:135m", None),
        ("example.com/library/gemma3:270m", None),
        ("llama3", None),
    ],
)
def test_builtin_for(name, expected):
    spec = library.builtin_for(name)
    assert (spec.name if spec else None) == expected
    assert library.is_builtin(name) is (expected is not None)


def test_is_builtin_on_invalid_name():
    assert library.is_builtin("../x") is False


def messages(*pairs):
    return [{"Role": r, "Content": c} for r, c in pairs]


def render(template: str, msgs: list) -> str:
    """The prompt Ollama's template executor builds (system messages collated into .System, .Response empty)."""
    return render_prompt(template, "go", [{"role": m["Role"], "content": m["Content"]} for m in msgs])


def test_smollm2_modelfile_and_reference_prompt():
    mf = M.parse(library.BUILTINS["smollm2:135m"].modelfile("/p/SmolLM2.gguf"))
    assert mf.froms == ["/p/SmolLM2.gguf"] and mf.system == library.SMOLLM2_SYSTEM
    assert mf.parameters["stop"] == ["<|im_start|>", "<|im_end|>"]
    prompt = render(mf.template, messages(("system", mf.system), ("user", "What is 2+2?")))
    assert prompt == PROMPTS["smollm2"][1]


CONVERSATIONS = [
    [("user", "hi")],
    [("system", "Be terse."), ("user", "hi")],
    [("user", "a"), ("assistant", "b"), ("user", "c")],
    [("system", "S"), ("user", "a"), ("assistant", "b"), ("user", "c")],
]


@pytest.mark.parametrize("conv", CONVERSATIONS)
def test_smollm2_template_matches_its_gguf_jinja_template(smollm2_path, conv):
    with gguf_io.open(smollm2_path) as f:
        jinja_source = f.metadata["tokenizer.chat_template"]
    hf = [{"role": r, "content": c} for r, c in conv]
    expected = jinja2.Environment().from_string(jinja_source).render(messages=hf, add_generation_prompt=True)
    # Ollama inserts the model's SYSTEM as a leading system message when the request has none.
    if conv[0][0] != "system":
        conv = [("system", library.SMOLLM2_SYSTEM)] + conv
    assert render(library.SMOLLM2_TEMPLATE, messages(*conv)) == expected


def test_gemma3_is_a_base_model_that_continues_text():
    """The PyPI Gemma 3 270M is the pretrained model: the prompt goes in bare, and a continuation stops after a
    paragraph by default instead of rambling to the end of the context."""
    mf = M.parse(library.BUILTINS["gemma3:270m"].modelfile("/p/gemma.gguf"))
    assert mf.system is None and mf.parameters == {
        "num_predict": library.BASE_NUM_PREDICT,
        "temperature": 1.0,
        "top_k": 64,
        "top_p": 0.95,
    }
    assert 0 < library.BASE_NUM_PREDICT <= 512
    tmpl = load_template(mf.template, "go")
    assert generate_prompt(tmpl, "The capital of France is").text == "The capital of France is"


def test_real_gguf_facts(smollm2_path, gemma3_path):
    assert config_from_gguf(gguf_facts(smollm2_path)) == {
        "model_format": "gguf",
        "model_family": "llama",
        "model_families": ["llama"],
        "model_type": "134.52M",
        "file_type": "Q4_1",
    }
    assert config_from_gguf(gguf_facts(gemma3_path)) == {
        "model_format": "gguf",
        "model_family": "gemma3",
        "model_families": ["gemma3"],
        "model_type": "268.10M",
        "file_type": "Q4_K_M",
    }


def test_ensure_builtin_uses_create_path(tmp_path, monkeypatch):
    """Same code path as the real models, on a tiny file (the real copies are tested once below)."""
    tiny = write_tiny(tmp_path / "tiny.gguf", arch="gemma3")
    spec = dataclasses.replace(library.BUILTINS["gemma3:270m"], gguf_path=lambda: tiny)
    monkeypatch.setitem(library.BUILTINS, "gemma3:270m", spec)
    s = st.Store(tmp_path / "models")
    assert library.ensure_builtin(s, "llama3") is False and s.list() == []
    assert library.resolve(s, "gemma3") == "gemma3:270m"  # a name, nothing created
    assert s.list() == []
    with pytest.raises(st.ManifestNotFound):
        library.model_record(s, "gemma3")  # read-only lookups never create
    assert s.list() == []
    assert library.ensure_builtin(s, "gemma3") is True
    assert {e.name.display for e in s.list()} == {"gemma3:270m"}  # stored once, under its canonical name
    assert library.resolve(s, "gemma3") == library.resolve(s, "gemma3:latest") == "gemma3:270m"
    assert library.model_record(s, "gemma3").name.display == "gemma3:270m"
    r = s.model_record("gemma3:270m")
    assert r.template == library.BASE_TEMPLATE and r.params["num_predict"] == library.BASE_NUM_PREDICT
    assert r.model_path.read_bytes() == tiny.read_bytes()
    assert library.ensure_builtin(s, "gemma3:270m") is True  # idempotent
    assert library.model_record(s, "GEMMA3:270M").name.display == "gemma3:270m"
    with pytest.raises(st.ManifestNotFound):
        library.model_record(s, "llama3", create_builtin=True)


def test_a_stored_latest_wins_over_the_builtin_alias(tmp_path, monkeypatch):
    tiny = write_tiny(tmp_path / "tiny.gguf", arch="gemma3")
    monkeypatch.setitem(
        library.BUILTINS, "gemma3:270m", dataclasses.replace(library.BUILTINS["gemma3:270m"], gguf_path=lambda: tiny)
    )
    s = st.Store(tmp_path / "models")
    list(create(s, "gemma3:latest", f"FROM {tiny}\nSYSTEM mine\n"))
    assert library.resolve(s, "gemma3") == "gemma3"
    assert library.model_record(s, "gemma3", create_builtin=True).system == "mine"
    assert {e.name.display for e in s.list()} == {"gemma3:latest"}


def test_missing_package_is_a_clear_error(tmp_path, monkeypatch):
    def missing():
        raise builtin_models.BuiltinModelMissing("Gemma 3 270M is not installed; run: pip install ...")

    monkeypatch.setitem(
        library.BUILTINS, "gemma3:270m", dataclasses.replace(library.BUILTINS["gemma3:270m"], gguf_path=missing)
    )
    s = st.Store(tmp_path)
    with pytest.raises(builtin_models.BuiltinModelMissing, match="pip install"):
        library.ensure_builtin(s, "gemma3:270m")
    assert s.list() == []


def test_real_smollm2_builtin_offline(tmp_path, smollm2_path):
    """The one test that copies a real model (~98 MB): created on first use, also through FROM."""
    s = st.Store(tmp_path)
    events = list(create(s, "terse", "FROM smollm2\nSYSTEM Answer in one word.\n"))
    assert events[-1] == {"status": "success"}
    assert {e.name.display for e in s.list()} == {"smollm2:135m", "terse:latest"}
    r = s.model_record("smollm2:135m")
    assert r.model_path.stat().st_size == smollm2_path.stat().st_size
    assert r.details["parameter_size"] == "134.52M" and r.details["quantization_level"] == "Q4_1"
    assert r.system == library.SMOLLM2_SYSTEM and r.params["temperature"] == 0.2
    t = s.model_record("terse")
    assert t.model_path == r.model_path and t.system == "Answer in one word." and t.template == r.template
    assert s.verify(rehash=False).ok


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def test_smollm2_is_tools_capable_with_hermes_calls():
    """As Ollama's library smollm2: tools are offered in the system turn and called with <tool_call> tags."""
    from localrt.templates.capabilities import capabilities
    from localrt.templates.toolcalls import HERMES, ToolCallParser, tag_for_template

    tmpl = load_template(library.SMOLLM2_TEMPLATE, "go")
    assert tmpl.supports_tools and "tools" in capabilities(tmpl.template) and tag_for_template(tmpl) == HERMES
    prompt = render_prompt(
        library.SMOLLM2_TEMPLATE,
        "go",
        [{"role": "user", "content": "Weather in Paris?"}],
        system=library.SMOLLM2_SYSTEM,
        tools=TOOLS,
    )
    assert prompt.startswith(f"<|im_start|>system\n{library.SMOLLM2_SYSTEM}\n\n# Tools\n")
    assert '"name":"get_weather"' in prompt.replace(" ", "") and "<tool_call>" in prompt
    assert prompt.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    # the list form of a call, streamed a few characters at a time, leaves nothing of its brackets in content
    reply = '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}\n]\n</tool_call>'
    parser, content, calls = ToolCallParser(HERMES, TOOLS), "", []
    for i in range(0, len(reply), 3):
        got = parser.feed(reply[i : i + 3])
        content, calls = content + got.content, calls + got.calls
    rest = parser.flush()
    content, calls = content + rest.content, calls + rest.calls
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
