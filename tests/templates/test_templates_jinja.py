"""GGUF Jinja chat templates: HF semantics on SmolLM2's real template, and the sandbox against SSTI
payloads, oversized templates and runaway loops (pain_points section 8 item 14)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import gguf_io
from localrt.templates import TemplateError
from localrt.templates.jinja import JinjaLimits, JinjaTemplate
from localrt.templates.prompt import JinjaChatTemplate, chat_prompt, render_prompt
from _testpaths import DATA

PROMPTS = json.loads((DATA / "prompts.json").read_text())


@pytest.fixture(scope="module")
def smollm2_template(smollm2_path: Path) -> str:
    with gguf_io.open(smollm2_path) as f:
        return f.metadata["tokenizer.chat_template"]


def test_smollm2_template_matches_reference_prompt(smollm2_template: str) -> None:
    got = render_prompt(smollm2_template, "jinja", [{"role": "user", "content": "What is 2+2?"}])
    assert got == PROMPTS["smollm2"][1]


def test_smollm2_template_with_system_and_turns(smollm2_template: str) -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert render_prompt(smollm2_template, "jinja", msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )
    # a model SYSTEM goes first unless the request brings its own
    assert render_prompt(smollm2_template, "jinja", msgs[1:2], system="Be brief.").startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n"
    )


def test_hf_variables_and_helpers() -> None:
    src = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
        "|{{ tools | tojson }}|{{ {'b': '<é>', 'a': 1} | tojson(sort_keys=True) }}|{{ add_generation_prompt }}"
        "|{{ eos_token }}|{{ strftime_now('%Y') | length }}"
        "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    )
    t = JinjaChatTemplate(src, bos_token="<s>", eos_token="</s>")
    tools = [{"type": "function", "function": {"name": "f"}}]
    got = t.render([{"role": "user", "content": "hi"}], tools)
    assert got == '<s>hi|[{"type": "function", "function": {"name": "f"}}]|{"a": 1, "b": "<é>"}|True|</s>|401'


def test_leading_bos_is_dropped_only_when_the_tokenizer_adds_it() -> None:
    src = "{{ bos_token }}{{ messages[0].content }}"
    msg = [{"role": "user", "content": "x"}]
    assert render_prompt(src, "jinja", msg, bos_token="<bos>") == "<bos>x"
    assert render_prompt(src, "jinja", msg, bos_token="<bos>", strip_bos=True) == "x"


def test_tool_calls_reach_the_template_in_hf_shape() -> None:
    src = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}"
        "{{ c.function.arguments | tojson }}{% endfor %}{% if m.role == 'tool' %}[{{ m.name }}:{{ m.content }}]"
        "{% endif %}{% endfor %}{% if tools %}T{% endif %}"
    )
    msgs = [
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "ok", "tool_name": "f"},
    ]
    assert (
        render_prompt(src, "jinja", msgs, tools=[{"type": "function", "function": {"name": "f"}}]) == 'f{"a": 1}[f:ok]T'
    )


def test_raise_exception_is_a_template_error() -> None:
    src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
    with pytest.raises(TemplateError, match="Conversation roles must alternate"):
        render_prompt(src, "jinja", [{"role": "assistant", "content": "x"}])


def test_syntax_error_has_a_line() -> None:
    with pytest.raises(TemplateError) as e:
        JinjaTemplate("ok\n{% for x in %}")
    assert e.value.line == 2 and e.value.kind == "jinja"


SSTI = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__()[0] }}",
    "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ joiner.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ lipsum.__globals__['os'].popen('touch {marker}').read() }}",
    "{{ namespace.__init__.__globals__['os'].popen('touch {marker}') }}",
    "{{ self.__init__.__globals__.__builtins__.__import__('os').popen('touch {marker}') }}",
    "{{ self._TemplateReference__context }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ '{0.__class__.__mro__}'.format(messages) }}",
    "{{ raise_exception.__globals__['os'] }}",
    "{{ (messages|attr('__class__')) }}",
    "{% set x = ''.__class__ %}{{ x }}",
    "{{ messages.append(1) }}{{ messages }}",
    "{{ request.application.__globals__ }}",
    "{{ config.items() }}",
]


@pytest.mark.parametrize("payload", SSTI)
def test_ssti_payloads_fail_cleanly(payload: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    src = payload.replace("{marker}", str(marker))
    with pytest.raises(TemplateError):
        render_prompt(src, "jinja", [{"role": "user", "content": "x"}])
    assert not marker.exists()


@pytest.mark.parametrize(
    "src",
    [
        "{% for i in range(10**9) %}x{% endfor %}",
        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% macro f(n) %}{{ f(n + 1) }}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{{ 'x' * 10**9 }}",
        "{{ messages * 100000000 }}",
        "{{ 2 ** 100000 }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
        "{{ 'x' | center(1000000000) }}",
        "{{ 'x'.ljust(1000000000) }}",
        "{{ ('x' * 5000).replace('', 'y' * 5000) }}",
        "{{ '%999999999d' % 1 }}",
    ],
)
def test_runaway_templates_are_stopped_quickly(src: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError):
        JinjaTemplate(src).render({"messages": [{"role": "user", "content": "x"}]})
    assert time.monotonic() - start < 5


def test_template_size_cap() -> None:
    big = "{{ 'x' }}" * (10 * 1024 * 1024 // 9)
    start = time.monotonic()
    with pytest.raises(TemplateError, match="more than the limit"):
        JinjaTemplate(big)
    assert time.monotonic() - start < 1


def test_output_cap_and_time_limit() -> None:
    t = JinjaTemplate("{% for i in range(1000) %}{{ 'x' * 100 }}{% endfor %}")
    with pytest.raises(TemplateError, match="output exceeds"):
        t.render({}, JinjaLimits(max_output=10_000))
    slow = JinjaTemplate("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}")
    start = time.monotonic()
    with pytest.raises(TemplateError, match="exceeds 0.1 s"):
        slow.render({}, JinjaLimits(timeout_s=0.1, max_steps=10**12))
    assert time.monotonic() - start < 2


def test_chat_prompt_through_jinja_fits_context(smollm2_template: str) -> None:
    t = JinjaChatTemplate(smollm2_template)
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "w" * 40} for i in range(11)]
    full = len(t.render(msgs))
    fitted = chat_prompt(t, msgs, num_ctx=full // 3, count_tokens=len)
    assert fitted.n_dropped > 0 and "turn 10 " in fitted.text and fitted.n_tokens <= full // 3
