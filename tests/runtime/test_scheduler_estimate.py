"""The memory estimate (issue 12, part 4): it reads the model file, so it runs outside the scheduler's lock (a
slow header no longer stalls a model that is already loaded); it caps num_ctx as the loader does; and prompts
are fitted to the request's num_ctx, not to whatever num_ctx the model happens to be loaded with."""

from __future__ import annotations

import threading
import time

import httpx

from _daemon_fakes import MODEL, fake_daemon
from localrt.runtime.scheduler import MemoryNeed
from localrt.runtime.service import estimate_memory
from _sched_fakes import Zoo, make, req


def test_a_slow_estimate_does_not_stall_a_loaded_model():
    zoo = Zoo()
    reading = threading.Event()

    def estimate(model, opts):
        if model == "slow":
            reading.set()
            time.sleep(1.5)  # a 23 MB GGUF header on a cold disk
        return MemoryNeed(1 << 20)

    s, zoo, _ = make(zoo)
    s._estimate_fn = estimate
    s._available_fn = lambda: 1 << 40
    try:
        assert list(s.submit(req("a", id=1, steps=1))) == [("a", 1, 0)]
        slow = []
        t = threading.Thread(target=lambda: slow.extend(s.submit(req("slow", id=2, steps=1))))
        t.start()
        assert reading.wait(5)
        start = time.monotonic()
        for i in range(5):
            assert list(s.submit(req("a", id=10 + i, steps=1))) == [("a", 10 + i, 0)]
            s.ps()
        assert time.monotonic() - start < 0.7  # before: each call waited for the estimate to finish
        t.join(5)
        assert slow == [("slow", 2, 0)]
    finally:
        s.stop(timeout=2)


def test_a_failing_estimate_fails_only_its_request():
    s, zoo, _ = make()

    def estimate(model, opts):
        if model == "bad":
            raise OSError("unreadable header")
        return MemoryNeed(0)

    s._estimate_fn = estimate
    s._available_fn = lambda: 1 << 40
    try:
        try:
            list(s.submit(req("bad", id=1)))
        except OSError as e:
            assert "unreadable" in str(e)
        else:
            raise AssertionError("the estimate's error did not reach the request")
        assert list(s.submit(req("a", id=2, steps=1))) == [("a", 2, 0)]
    finally:
        s.stop(timeout=2)


def test_estimate_caps_num_ctx_like_the_loader(smollm2_path):
    """num_ctx 1048576 on smollm2 (trained 8192): the loader loads 8192, so the estimate is for 8192, not 45 GiB."""
    assert estimate_memory(smollm2_path, 1 << 20, 512) == estimate_memory(smollm2_path, 8192, 512)
    assert estimate_memory(smollm2_path, 1 << 20, 512).private < 1 << 30


def _history(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "w" * 60} for i in range(n)]


def _chat(srv, num_ctx: int) -> httpx.Response:
    return httpx.post(
        srv.url + "/api/chat",
        json={
            "model": MODEL,
            "messages": _history(21),
            "stream": False,
            "options": {"num_ctx": num_ctx, "num_predict": 1},
        },
        timeout=30,
    )


def test_prompt_is_fitted_to_the_requests_num_ctx_whatever_is_loaded(tmp_path):
    """The same chat with num_ctx 512 gives the same prompt whether the model was loaded with 512 or 4096 (the fake
    tokenizer counts one token per character)."""
    with fake_daemon(tmp_path / "a") as (srv, lab):
        assert _chat(srv, 512).status_code == 200
        small_load = lab.runs[-1].text
    with fake_daemon(tmp_path / "b") as (srv, lab):
        assert _chat(srv, 4096).status_code == 200  # loaded with 4096
        full = lab.runs[-1].text
        assert _chat(srv, 512).status_code == 200  # served by the same 4096 instance
        assert lab.loads == 1
        big_load = lab.runs[-1].text
    assert len(small_load) <= 512 and big_load == small_load and len(full) > 512
