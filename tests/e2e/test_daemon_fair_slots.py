"""One client's flood does not starve a newcomer (issue 48, class 5): with LOCALRT_NUM_PARALLEL=2, a client that holds
both slots and has more requests queued gives its newest running request's slot to another client's request, and
that request resumes later with its output unchanged. A real daemon runs the built-in SmolLM2; clients are told
apart by X-Forwarded-For from loopback (a reverse proxy on this machine), as the fair queue groups them.

Before the fix the newcomer waited for one of the flood's requests to finish (its time to first token grew with the
flood's num_predict: 118 s in the issue); now it waits about one step and its prompt."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest

from _daemon_fakes import real_daemon, wait_until

MODEL = "smollm2:135m"
FLOOD, NEWCOMER, ALONE = "192.0.2.10", "198.51.100.20", "203.0.113.30"  # ALONE: a scope of its own, no cache shared
LONG = 96  # tokens of the flood's paused request: before, the newcomer waited about this many steps
PROMPTS = [
    "Write a long story about a dragon who learns to bake bread.",
    "Explain how a steam engine works, step by step, in detail.",
    "List the planets of the solar system and describe each one.",
]


class Call(threading.Thread):
    """One streaming /api/generate from a client: when its first token and its end came, its text and counts."""

    def __init__(self, url: str, client: str, prompt: str, num_predict: int) -> None:
        super().__init__(daemon=True)
        self.url, self.client, self.prompt, self.num_predict = url, client, prompt, num_predict
        self.sent = self.first = self.done = None
        self.text, self.last = "", None
        self.times: list[float] = []  # when each token's line came

    def run(self) -> None:
        body = {
            "model": MODEL,
            "prompt": self.prompt,
            "options": {"temperature": 0, "repeat_penalty": 1.0, "num_predict": self.num_predict},
        }
        self.sent = time.monotonic()
        with httpx.stream(
            "POST", self.url + "/api/generate", json=body, headers={"X-Forwarded-For": self.client}, timeout=300
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line:
                    continue
                part = json.loads(line)
                assert "error" not in part, part
                if not part["done"]:
                    self.times.append(time.monotonic())
                    self.first = self.first or self.times[0]
                self.text += part.get("response", "")
                if part["done"]:
                    self.done, self.last = time.monotonic(), part

    @property
    def ttft(self) -> float:
        return self.first - self.sent

    def tokens_between(self, t0: float, t1: float) -> int:
        return sum(t0 < t < t1 for t in self.times)


def _call(url: str, client: str, prompt: str, num_predict: int) -> Call:
    c = Call(url, client, prompt, num_predict)
    c.start()
    return c


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with real_daemon(tmp_path_factory.mktemp("models"), num_parallel=2) as srv:
        yield srv


@pytest.mark.slow  # 7-17 s of a real flood on two cores; CI's slow pass runs it
def test_a_newcomer_gets_a_slot_from_a_flooding_client_whose_paused_request_is_unchanged(daemon, caplog):
    httpx.post(daemon.url + "/api/pull", json={"model": MODEL}, timeout=120).raise_for_status()
    alone = _call(daemon.url, ALONE, PROMPTS[1], LONG)  # loads the model; the reference for the one paused below
    alone.join(240)
    assert alone.last["eval_count"] == LONG, "the reference stopped early: the flood would not hold its slot"

    with caplog.at_level(logging.INFO, logger="localrt.service"):
        a1 = _call(daemon.url, FLOOD, PROMPTS[0], 2 * LONG)  # the oldest: it runs on beside the newcomer
        wait_until(lambda: a1.first is not None, 60, "the flood's first request to stream")
        a2 = _call(daemon.url, FLOOD, PROMPTS[1], LONG)  # the flood's newest running request: the one that gives way
        wait_until(lambda: a2.first is not None, 60, "the flood's second request to stream")
        a3 = _call(daemon.url, FLOOD, PROMPTS[2], 4)  # queued: the flood has more requests than slots
        b = _call(daemon.url, NEWCOMER, "Say hello.", 4)
        for c in (a1, a2, a3, b):
            c.join(300)
    assert all(c.last is not None for c in (a1, a2, a3, b))
    waited = a1.tokens_between(b.sent, b.first)
    print(
        f"\nnewcomer's time to first token {b.ttft:.2f} s, while the flood's first request gave {waited} tokens; "
        f"the first of the flood's running requests ended {min(a1.done, a2.done) - b.sent:.1f} s after it asked"
    )

    # Both slots were the flood's: before, the newcomer's first token came after one of its requests ended.
    assert b.first < min(a1.done, a2.done), "the newcomer waited for a flood request to finish"
    assert waited < LONG // 4 and b.ttft < 0.5 * (min(a1.done, a2.done) - b.sent)
    assert b.first < a3.first  # and the flood's queued request does not go first either
    paused = [r.getMessage() for r in caplog.records if "paused" in r.getMessage()]
    assert len(paused) == 1 and repr(FLOOD) in paused[0], paused  # once: afterwards each client holds one slot
    # The paused request resumed and gave, token for token, what it gives alone; the oldest ran on to its end.
    assert a2.last["eval_count"] == LONG and a2.text == alone.text
    assert a1.last["eval_count"] == 2 * LONG
