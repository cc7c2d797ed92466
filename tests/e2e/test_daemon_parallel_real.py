"""Requests for one model run together (LOCALRT_NUM_PARALLEL): a real daemon with the built-in SmolLM2 serves four
streaming greedy chats at once through the model's BatchDriver; each one's output is exactly what it is alone
(the Batcher is batch-invariant) and their decodes overlap in time."""

from __future__ import annotations

import threading
import time

import ollama
import pytest
from _daemon_fakes import real_daemon

MODEL = "smollm2:135m"
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 16}
QUESTIONS = [
    "Write a long story about a cat.",
    "Explain how a steam engine works, in detail.",
    "List many fruits and describe each one.",
    "Tell me everything about the history of Rome.",
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with real_daemon(tmp_path_factory.mktemp("models"), num_parallel=4) as srv:
        yield srv


def test_concurrent_greedy_chats_equal_their_solo_outputs_and_overlap(daemon):
    client = ollama.Client(host=daemon.url)
    client.pull(MODEL)
    msgs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    # Alone, each on a freshly loaded model (keep_alive 0 unloads it after), so no request reuses another's cache.
    solo = []
    for m in msgs:
        r = client.chat(model=MODEL, messages=m, options=GREEDY, keep_alive=0)
        assert r.done and r.eval_count == GREEDY["num_predict"]  # no early stop: the decodes must overlap
        solo.append(r.message.content)

    barrier = threading.Barrier(len(msgs))
    results: list = [None] * len(msgs)

    def one(i: int) -> None:
        barrier.wait()
        first, text, last = None, [], None
        for part in client.chat(model=MODEL, messages=msgs[i], options=GREEDY, stream=True):
            if first is None and part.message.content:
                first = time.monotonic()
            text.append(part.message.content)
            if part.done:
                last = time.monotonic()
                assert part.eval_count == GREEDY["num_predict"]
        results[i] = ("".join(text), first, last)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(msgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r is not None for r in results)
    assert [r[0] for r in results] == solo
    firsts, lasts = [r[1] for r in results], [r[2] for r in results]
    assert max(firsts) < min(lasts), "every request streamed its first token before any one finished"


def test_ps_shows_the_slots_and_the_kv_cache_in_use(daemon):
    import httpx

    client = ollama.Client(host=daemon.url)
    client.pull(MODEL)
    client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], options=GREEDY)
    (entry,) = [m for m in httpx.get(daemon.url + "/api/ps").json()["models"] if m["name"] == MODEL]
    assert entry["slots"] == 4 and entry["slots_in_use"] == 0  # the request is over
    # the cache was allocated whole at load; the finished chat's positions stay cached for the next prompt
    assert 0 < entry["kv_cache_used_bytes"] < entry["kv_cache_bytes"] <= entry["size"]
    # in the paged pool's blocks (SmolLM2 has only full-attention layers): none in use, the chat's cached
    assert entry["kv_blocks"] * entry["kv_block_size"] == 4 * entry["context_length"]  # the default budget
    assert entry["kv_blocks_in_use"] == 0 < entry["kv_blocks_cached"]
    assert entry["kv_cache_used_bytes"] == entry["kv_blocks_cached"] * (entry["kv_cache_bytes"] // entry["kv_blocks"])


def test_an_embedding_beside_running_chats_waits_its_turn_and_is_unchanged(daemon):
    client = ollama.Client(host=daemon.url)
    alone = client.embed(model=MODEL, input="hello world").embeddings[0]
    chats = [
        threading.Thread(
            target=lambda m=m: client.chat(model=MODEL, messages=[{"role": "user", "content": m}], options=GREEDY)
        )
        for m in QUESTIONS[:3]
    ]
    for t in chats:
        t.start()
    beside = client.embed(model=MODEL, input="hello world").embeddings[0]
    for t in chats:
        t.join(120)
    assert beside == alone
