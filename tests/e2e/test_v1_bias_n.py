"""/v1's logit_bias and n > 1 through the official `openai` client, against a daemon on the built-in SmolLM2."""

from __future__ import annotations

import httpx
import openai
import pytest

MODEL = "smollm2:135m"
PROMPT = "Write one word."
# A prompt that renders to fewer tokens than a cached prefix must have to be reused (engine/batch.py
# REUSE_MIN_TOKENS): every run evaluates it afresh. (Reuse is exact anyway, so choices and single requests see
# bit-identical logits either way.)
SHORT = "Hi"


@pytest.fixture(scope="module")
def daemon(shared_daemon):
    return shared_daemon  # this module only reads (conftest.py)


@pytest.fixture(scope="module")
def client(daemon):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def token_id():
    import gguf_io
    from localrt.engine.tokenizer import Tokenizer
    from localrt.models import builtin_models

    with gguf_io.open(builtin_models.smollm2_path()) as f:
        tok = Tokenizer.from_gguf(f.metadata)

    def one(text: str) -> int:
        (i,) = tok.encode(text, add_special=False)
        return i

    return one


def _first(client, **kw):
    r = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=1, logprobs=2, **kw)
    return r.choices[0].logprobs


def test_logit_bias_bans_and_forces_a_token_under_greedy(client, token_id):
    plain = _first(client)
    best, runner_up = list(plain.top_logprobs[0])
    assert plain.tokens == [best]
    banned = _first(client, logit_bias={str(token_id(best)): -100})
    assert banned.tokens == [runner_up]
    # logprobs describe the model's own distribution, before the bias (as Ollama and llama.cpp's server report them)
    assert banned.top_logprobs[0] == plain.top_logprobs[0]
    forced = _first(client, logit_bias={str(token_id(" zebra")): 100})
    assert forced.tokens == [" zebra"]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=1,
        logit_bias={str(token_id(" zebra")): 100},
    )
    assert chat.choices[0].message.content == " zebra"


def test_a_small_bias_shifts_the_distribution_the_sampler_sees(client, token_id):
    plain = _first(client)
    best, runner_up = list(plain.top_logprobs[0])
    gap = plain.top_logprobs[0][best] - plain.top_logprobs[0][runner_up]
    nudged = _first(client, logit_bias={str(token_id(runner_up)): gap + 0.5})
    assert nudged.tokens == [runner_up]
    short = _first(client, logit_bias={str(token_id(runner_up)): max(gap - 0.5, 0.0)})
    assert short.tokens == [best]


@pytest.mark.parametrize(
    "bias, word",
    [
        ({"abc": 1}, "not a token id"),
        ({"-1": 1}, "not a token id"),
        ({"5": 101}, "between -100 and 100"),
        ({"5": "high"}, "between -100 and 100"),
        ({"49152": 1}, "outside the vocabulary"),  # SmolLM2 has 49152 tokens
        ([1, 2], "must be an object"),
    ],
)
def test_bad_logit_bias_is_a_400(daemon, bias, word):
    r = httpx.post(
        daemon.url + "/v1/chat/completions",
        timeout=600,
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logit_bias": bias},
    )
    assert r.status_code == 400, r.text
    assert word in r.json()["error"]["message"]


def test_n_choices_are_the_single_requests_with_seed_plus_i(client):
    kw = dict(model=MODEL, prompt=SHORT, temperature=1.0, max_tokens=8)
    many = client.completions.create(n=3, seed=42, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2]
    singles = [client.completions.create(seed=42 + i, **kw) for i in range(3)]
    assert [c.text for c in many.choices] == [s.choices[0].text for s in singles]
    assert len({c.text for c in many.choices}) > 1  # different seeds, different replies
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens < 32  # the prompt is counted once
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert many.usage.total_tokens == many.usage.prompt_tokens + many.usage.completion_tokens


def test_streamed_chat_choices_carry_their_index(client):
    msgs = [{"role": "user", "content": SHORT}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, n=2, seed=7, temperature=1.0, max_tokens=6)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            n=2,
            seed=7,
            temperature=1.0,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
        )
    )
    text = {0: "", 1: ""}
    finished, spelled = [], {0: "", 1: ""}
    for ch in chunks[:-1]:
        (c,) = ch.choices
        text[c.index] += c.delta.content or ""
        if c.logprobs:
            spelled[c.index] += "".join(e.token for e in c.logprobs.content)
        if c.finish_reason:
            finished.append(c.index)
    assert sorted(finished) == [0, 1]
    assert [text[0], text[1]] == [c.message.content for c in whole.choices] == [spelled[0], spelled[1]]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_greedy_choices_are_equal(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2, temperature=0, max_tokens=4
    )
    assert r.choices[0].message.content == r.choices[1].message.content and r.usage.completion_tokens == 8


@pytest.mark.parametrize("n", [0, 9, "2"])
def test_n_out_of_range_is_a_400(daemon, n):
    r = httpx.post(daemon.url + "/v1/completions", timeout=600, json={"model": MODEL, "prompt": "hi", "n": n})
    assert r.status_code == 400, r.text
    assert "n must be" in r.json()["error"]["message"]


def test_embeddings_take_token_ids(client, token_id):
    text = " hello world"
    ids = [token_id(" hello"), token_id(" world")]
    by_text = client.embeddings.create(model=MODEL, input=[text, " world"]).data
    by_ids = client.embeddings.create(model=MODEL, input=[ids, ids[1:]]).data
    assert [d.index for d in by_ids] == [0, 1]
    for a, b in zip(by_text, by_ids):
        assert a.embedding == b.embedding
    one = client.embeddings.create(model=MODEL, input=ids)  # a flat list is one input
    assert len(one.data) == 1 and one.data[0].embedding == by_ids[0].embedding
    assert one.usage.prompt_tokens == 2


@pytest.mark.parametrize(
    "inp, word",
    [
        ([49152], "out of range"),
        ([[1], []], "invalid input"),
        ([1, "a"], "invalid input"),
        ([True], "invalid input"),
        ([[-1]], "invalid input"),
        ("", "empty string"),
        (["a", ""], "input[1] is an empty string"),
    ],
)
def test_bad_token_id_embedding_input_is_a_400(daemon, inp, word):
    r = httpx.post(daemon.url + "/v1/embeddings", timeout=600, json={"model": MODEL, "input": inp})
    assert r.status_code == 400, r.text
    assert word in r.json()["error"]["message"]


def test_echo_puts_the_prompt_before_the_completion(client):
    kw = dict(model=MODEL, prompt=SHORT, temperature=0, max_tokens=4)
    plain = client.completions.create(**kw).choices[0].text
    assert client.completions.create(echo=True, **kw).choices[0].text == SHORT + plain
    streamed = [c.choices[0].text for c in client.completions.create(echo=True, stream=True, **kw)]
    assert streamed[0].startswith(SHORT) and "".join(streamed) == SHORT + plain


def test_best_of_keeps_the_candidates_with_the_highest_mean_logprob(client):
    kw = dict(model=MODEL, prompt=SHORT, temperature=1.0, max_tokens=5, seed=11)
    cands = client.completions.create(n=4, logprobs=0, **kw)  # the same four candidates (seeds 11..14), with logprobs
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in cands.choices]
    order = sorted(range(4), key=lambda i: (-means[i], i))
    assert len(set(means)) > 1
    best = client.completions.create(best_of=4, **kw)
    (only,) = best.choices
    assert only.index == 0 and only.text == cands.choices[order[0]].text and only.logprobs is None
    assert best.usage.completion_tokens == cands.usage.completion_tokens  # every candidate's tokens are counted
    two = client.completions.create(best_of=4, n=2, logprobs=0, **kw)
    assert [c.text for c in two.choices] == [cands.choices[i].text for i in order[:2]]
    assert two.choices[1].logprobs.token_logprobs == cands.choices[order[1]].logprobs.token_logprobs
