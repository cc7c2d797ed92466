"""Cancellation with the real engine (pain_points P6.7, #11889): a client that leaves during prompt evaluation must
stop the work between prefill chunks, not after the whole prompt. SmolLM2 runs for real; its `forward` is wrapped
to count chunks and to pause on one chunk until the client has gone."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from _daemon_fakes import make_config
from localrt.serve.daemon import BackgroundServer
from localrt.runtime.service import Service

MODEL = "smollm2:135m"
LOAD = {"num_ctx": 512, "num_batch": 8}  # 8-token prefill chunks: a long prompt is many chunks
PAUSE_AT_CHUNK = 2


class Chunks:
    """Counts full prefill chunks (num_batch tokens) while armed; pauses at one of them."""

    def __init__(self) -> None:
        self.armed = False
        self.count = 0
        self.paused = threading.Event()
        self.release = threading.Event()

    def wrap(self, model):
        forward = model.forward

        def counted(batch, cache, output_rows=None):
            if self.armed and len(batch.tokens) == LOAD["num_batch"]:
                self.count += 1
                if self.count == PAUSE_AT_CHUNK:
                    self.paused.set()
                    self.release.wait(20)
            return forward(batch, cache, output_rows)

        model.forward = counted  # instance attribute: the engine's _prefill/_decode call model.forward
        return model


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from localrt import load_model

    chunks = Chunks()
    conf = make_config(tmp_path_factory.mktemp("models"))
    service = Service(conf, load_model=lambda path, **kw: chunks.wrap(load_model(path, **kw)))
    with BackgroundServer(service, conf) as srv:
        yield srv, chunks
    chunks.release.set()
    service.close()


def _generate(url: str, prompt: str, n: int) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "raw": True,
        "stream": False,
        "options": {**LOAD, "num_predict": n, "temperature": 0},
    }
    return httpx.post(url + "/api/generate", json=body, timeout=300)


def test_disconnect_during_prompt_eval_stops_between_chunks(real):
    srv, chunks = real
    warm = _generate(srv.url, "Hello", 1)  # load the model outside the measured request
    assert warm.status_code == 200, warm.text
    prompt = " ".join(f"word{i}" for i in range(120))  # several hundred tokens: dozens of 8-token chunks
    body = json.dumps(
        {"model": MODEL, "prompt": prompt, "raw": True, "stream": True, "options": {**LOAD, "num_predict": 64}}
    ).encode()
    chunks.armed = True
    try:
        s = socket.create_connection(("127.0.0.1", srv.config.port), timeout=30)
        s.sendall(
            b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert chunks.paused.wait(60), "prefill never reached the paused chunk"
        s.shutdown(socket.SHUT_RDWR)
        s.close()
        time.sleep(1.0)  # the daemon has a second to notice while prefill is paused
    finally:
        chunks.release.set()
    nxt = _generate(srv.url, "Hi", 1)  # queued behind the abandoned request: it returns once that work stopped
    chunks.armed = False
    assert nxt.status_code == 200, nxt.text
    from localrt import load_model
    from localrt.models.builtin_models import smollm2_path

    n_full_chunks = len(load_model(smollm2_path(), num_ctx=512).tokenize(prompt)) // LOAD["num_batch"]
    assert n_full_chunks > 3 * PAUSE_AT_CHUNK
    assert chunks.count <= PAUSE_AT_CHUNK + 2, (
        f"{chunks.count} of {n_full_chunks} prefill chunks ran after the client left"
    )
