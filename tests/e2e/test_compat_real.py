"""Drop-in behaviours that need the real engine (the built-in SmolLM2 from PyPI): prompt counts on a prompt-cache
hit, and num_gpu on a machine without a GPU."""

from __future__ import annotations

import ollama
import openai
import pytest
from _daemon_fakes import real_daemon

from localrt.engine.backends import devices

MODEL = "smollm2:135m"
GREEDY = {"temperature": 0, "num_predict": 2}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with real_daemon(tmp_path_factory.mktemp("models")) as srv:
        yield srv


def test_the_whole_prompt_is_counted_on_a_cache_hit(daemon):
    c = ollama.Client(host=daemon.url)
    msgs = [{"role": "user", "content": "Name three colours."}]
    first = c.chat(model=MODEL, messages=msgs, options=GREEDY)
    again = c.chat(model=MODEL, messages=msgs, options=GREEDY)  # all but the last prompt token is cached now
    assert first.prompt_eval_count == again.prompt_eval_count > 10
    assert "_prompt_cached_count" not in again.model_dump()  # the native reply has Ollama's keys only


def test_v1_usage_reports_the_cached_part_of_the_prompt(daemon):
    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": "Name three animals."}]
    first = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=2)
    again = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=2)
    assert first.usage.prompt_tokens == again.usage.prompt_tokens > 10
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens  # at least the last prompt token is evaluated again
    streamed = list(
        c.chat.completions.create(
            model=MODEL, messages=msgs, temperature=0, max_tokens=2, stream=True, stream_options={"include_usage": True}
        )
    )
    assert streamed[-1].usage.prompt_tokens == first.usage.prompt_tokens
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == cached


@pytest.mark.skipif(devices.probe().gpu is not None, reason="a GPU is present: num_gpu places layers on it")
def test_num_gpu_on_a_cpu_only_machine_is_served_on_the_cpu(daemon):
    c = ollama.Client(host=daemon.url)
    r = c.generate(model=MODEL, prompt="Hi", options={**GREEDY, "num_gpu": 99})
    assert r.done and r.eval_count == 2
    (entry,) = [m for m in c.ps().models if m.model == MODEL]
    assert entry.size_vram == 0
