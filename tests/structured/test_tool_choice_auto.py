"""tool_choice "auto": when the model opens a call by itself (the template's tag, Hermes `<tool_call>`), the call
schema constrains the rest of that call (a lazy constraint), so an opened call always parses; before the tag and
after the call the text is free. Driven token by token over SmolLM2's real tokenizer by a scripted "model" that
prefers the tokens of a given text (deterministic: no forward pass), through the engine's ConstrainedSampler."""

from __future__ import annotations

import json

import numpy as np
import pytest

from localrt.api.options import resolve
from localrt.engine.sampler import make_sampler
from localrt.structured import ConstrainedSampler, LazyConstraint, compile_format
from localrt.templates.toolcalls import HERMES, JSON_START, ToolCallParser, opened_call_format

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


@pytest.fixture(scope="module")
def tok():
    import gguf_io
    from localrt.engine.tokenizer import Tokenizer
    from localrt.models import builtin_models

    with gguf_io.open(builtin_models.smollm2_path()) as f:
        return Tokenizer.from_gguf(f.metadata)


def _lazy(tok, tag=HERMES):
    trigger, fmt, at_start = opened_call_format(tag, TOOLS)
    return LazyConstraint(compile_format(fmt, tok).grammar, trigger.encode(), at_start)


def _write(tok, constraint, script: str, max_tokens: int = 80) -> str:
    """Greedy over logits that rank first the token that continues `script` from what was written so far (or, once
    the output has left the script or finished it, end of generation), then every other token by a fixed order:
    what a model that wants to write `script` writes under the constraint."""
    base = np.random.default_rng(0).standard_normal(tok.n_vocab).astype(np.float32)  # (n_vocab,)
    sampler = ConstrainedSampler(make_sampler(resolve({"temperature": 0})), constraint)
    out: list[int] = []
    for _ in range(max_tokens):
        written = tok.decode(out)
        logits = base.copy()
        rest = script[len(written) :] if script.startswith(written) else ""
        if rest:
            logits[tok.encode(rest, add_special=False)[0]] = 100.0
        else:
            logits[sorted(tok.eog_ids)] = 100.0
        t = sampler.sample(logits, out)
        if t in tok.eog_ids:
            break
        out.append(t)
    return tok.decode(out)


def _parse(text: str, tag=HERMES):
    p = ToolCallParser(tag, TOOLS)
    got = p.feed(text)
    rest = p.flush()
    return got.content + rest.content, got.calls + rest.calls


def test_free_text_is_untouched(tok):
    text = 'Paris is sunny. <tool_call is not a tag here> {"x": 1}'
    assert _write(tok, _lazy(tok), text) == text


def test_a_call_the_model_opens_is_held_to_the_schema(tok):
    # An argument outside the enum and a missing closer: unconstrained this would not parse as a call.
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}'
    out = _write(tok, _lazy(tok), text)
    assert out.startswith('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "')
    content, calls = _parse(out)
    assert [(c.name, c.arguments["city"] in ("Paris", "London")) for c in calls] == [("get_weather", True)]
    assert content.strip() == "Let me look." and out.rstrip().endswith("</tool_call>")


def test_after_a_call_the_text_is_free_again_and_a_second_call_is_held_too(tok):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "London"}}\n</tool_call>'
    text = call + "\nDone.\n" + call.replace("London", "Berlin")
    out = _write(tok, _lazy(tok), text)
    assert out.startswith(call + "\nDone.\n<tool_call>")
    _, calls = _parse(out)
    assert len(calls) == 2 and calls[0].arguments == {"city": "London"}


def test_the_bare_json_format_only_counts_at_the_start(tok):
    out = _write(tok, _lazy(tok, JSON_START), '{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    (call,) = _parse(out, JSON_START)[1]
    assert call.arguments["city"] in ("Paris", "London")
    text = 'It is {"city": "Oslo"} there.'
    assert _write(tok, _lazy(tok, JSON_START), text) == text


def test_a_schema_outside_the_subset_leaves_calls_unconstrained(tok):
    from types import SimpleNamespace

    from localrt.api.types import ChatRequest
    from localrt.runtime.sampling_extras import request_constraint

    odd = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}]
    req = ChatRequest(model="m", tools=odd)
    assert request_constraint(HERMES, req, SimpleNamespace(tokenizer=tok)) is None  # not a 400: it worked before
    req.tools = TOOLS
    assert isinstance(request_constraint(HERMES, req, SimpleNamespace(tokenizer=tok)), LazyConstraint)


def test_on_the_real_model_an_opened_call_never_leaks_into_content(tmp_path):
    """SmolLM2 through the daemon with tools and tool_choice "auto": whatever it writes, the text of a call it opens
    is never left in `content` (seeded sampling: measured here, seed 0 opens a call and the others answer in prose)."""
    import openai
    from _daemon_fakes import real_daemon

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": TOOLS[0]["function"]["parameters"],
        },
    }
    with real_daemon(tmp_path) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
        for seed in (0, 1, 3):
            r = client.chat.completions.create(
                model="smollm2:135m",
                tools=[weather],
                max_tokens=60,
                temperature=0.8,
                seed=seed,
                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            )
            m = r.choices[0].message
            assert "<tool_call>" not in (m.content or "") and "</tool_call>" not in (m.content or "")
            for call in m.tool_calls or ():
                assert call.function.name == "get_weather"
                assert json.loads(call.function.arguments)["city"] in ("Paris", "London")
