"""Embeddings and a client that goes away (issue 12, part 5): /api/embed and /v1/embeddings stop between inputs once
the client has disconnected, and the model is free for the next request at once; a queued embedding whose
client left is withdrawn without running."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from _daemon_fakes import MODEL, FakeModel, Lab, fake_daemon, wait_until

N_INPUTS = 2000
EMBED_S = 0.01  # per input: 2,000 inputs would hold the model ~20 s


class EmbedModel(FakeModel):
    def embed(self, ids) -> np.ndarray:
        self.lab.embedded += 1
        time.sleep(EMBED_S)
        return np.ones(4, dtype=np.float32)


class EmbedLab(Lab):
    embedded = 0

    def load_model(self, path, num_ctx: int = 4096, num_batch: int = 512, **_device):
        super().load_model(path, num_ctx, num_batch)
        return EmbedModel(self, num_ctx)


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    import _daemon_fakes

    monkeypatch.setattr(_daemon_fakes, "Lab", EmbedLab)
    with fake_daemon(tmp_path) as (srv, lab):
        r = httpx.post(srv.url + "/api/embed", json={"model": MODEL, "input": "warm"}, timeout=60)
        assert r.status_code == 200  # the built-in record exists and the model is loaded
        lab.embedded = 0
        yield srv, lab


def _send_and_leave(port: int, path: str, body: dict, after: float) -> None:
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        time.sleep(after)


@pytest.mark.parametrize("path,field", [("/api/embed", "input"), ("/v1/embeddings", "input")])
def test_embedding_stops_when_the_client_leaves(daemon, path, field):
    srv, lab = daemon
    _send_and_leave(srv.config.port, path, {"model": MODEL, field: ["some text"] * N_INPUTS}, after=0.5)
    wait_until(lambda: lab.embedded > 0, 10, "the embedding to start")
    time.sleep(0.5)  # the worker notices at its next input
    stopped_at = lab.embedded
    time.sleep(0.5)
    assert lab.embedded == stopped_at < N_INPUTS // 4  # before: all 2,000 inputs, ~20 s of the model
    start = time.monotonic()
    r = httpx.post(
        srv.url + "/api/generate",
        json={"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
        timeout=30,
    )
    assert r.status_code == 200 and time.monotonic() - start < 3


def test_queued_embedding_of_a_gone_client_never_runs(daemon):
    srv, lab = daemon
    held = threading.Thread(
        target=lambda: httpx.post(
            srv.url + "/api/generate",
            json={"model": MODEL, "prompt": "[decode-gate] x", "stream": False, "options": {"num_predict": 3}},
            timeout=30,
        )
    )
    held.start()  # holds the model at its second token while the embedding waits behind it
    wait_until(
        lambda: lab.runs_with("[decode-gate]") and lab.runs_with("[decode-gate]")[0].in_decode.is_set(),
        10,
        "the gated generation",
    )
    sched = srv.service.scheduler
    _send_and_leave(srv.config.port, "/api/embed", {"model": MODEL, "input": ["a"] * 10}, after=0.5)
    # the daemon notices the disconnect and withdraws the queued request (before: it stayed and ran later)
    wait_until(lambda: sched.ps()[0].queued == 0, 5, "the queued embedding to be withdrawn")
    lab.decode_release.set()
    held.join(10)
    time.sleep(0.3)
    assert lab.embedded == 0
    r = httpx.post(srv.url + "/api/embed", json={"model": MODEL, "input": ["a", "b"]}, timeout=30)
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 2
