"""Load and cancellation on a real daemon (pain_points section 8 item 24, P6.7): a full queue answers 503 with
Retry-After, idle half-open connections do not lock others out, and a client that goes away during load, prompt
evaluation or decoding stops its work; the next request is served each time. The loader is scripted and blocks on
gates the test opens (tests/_daemon_fakes.py); every wait is bounded."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import ollama
import openai
import pytest

from _daemon_fakes import MODEL, fake_daemon, status_of, wait_until

GEN = "/api/generate"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture
def daemon(models_dir):
    with fake_daemon(models_dir) as pair:
        yield pair


def _body(prompt: str, stream: bool = False, **options) -> dict:
    return {"model": MODEL, "prompt": prompt, "stream": stream, "options": options}


def _served(srv, timeout: float = 10.0) -> None:
    """A fresh request completes quickly: the worker is free again."""
    t0 = time.monotonic()
    r = httpx.post(srv.url + GEN, json=_body("next", num_predict=2), timeout=timeout)
    assert r.status_code == 200 and r.json()["response"] == "xx", r.text
    assert time.monotonic() - t0 < timeout


def _stream_lines(srv, prompt: str, n_lines: int, **options) -> list[dict]:
    """Open a streamed generate, read n_lines, then drop the connection."""
    lines = []
    with httpx.stream("POST", srv.url + GEN, json=_body(prompt, stream=True, **options), timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(json.loads(line))
            if len(lines) == n_lines:
                break
    return lines


class _Sender:
    """A request in a thread: a socket we can drop at a chosen moment, reading whatever comes back."""

    def __init__(self, port: int, body: dict):
        data = json.dumps(body).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (GEN.encode(), len(data), data)
        )

    def drop(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# ---- queue ------------------------------------------------------------------------------------------------


def test_full_queue_is_503_with_retry_after(models_dir):
    with fake_daemon(models_dir, max_queue=1) as (srv, lab):
        results: dict[str, httpx.Response] = {}

        def send(key: str, prompt: str) -> None:
            results[key] = httpx.post(srv.url + GEN, json=_body(prompt, num_predict=3), timeout=30)

        first = threading.Thread(target=send, args=("running", "[decode-gate] running"))
        first.start()
        lab.wait_run("running").in_decode.wait(10)  # the worker is busy with it; the queue is empty
        second = threading.Thread(target=send, args=("queued", "queued"))
        second.start()
        wait_until(lambda: any(i.queued == 1 for i in srv.service.scheduler.ps()), 10, "one queued request")
        over = [httpx.post(srv.url + GEN, json=_body("over", num_predict=1), timeout=10) for _ in range(3)]
        for r in over:
            assert r.status_code == 503, r.text
            assert int(r.headers["retry-after"]) > 0
            assert "server busy" in r.json()["error"]
        with pytest.raises(ollama.ResponseError) as e:  # what the official clients make of it
            ollama.Client(host=srv.url).generate(model=MODEL, prompt="over")
        assert e.value.status_code == 503
        oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "over"}])
        assert e.value.status_code == 503 and int(e.value.response.headers["retry-after"]) > 0
        lab.decode_release.set()
        first.join(15)
        second.join(15)
        assert results["running"].status_code == 200 and results["running"].json()["response"] == "xxx"
        assert results["queued"].status_code == 200 and results["queued"].json()["response"] == "xxx"
        assert not lab.runs_with("over")  # refused work never reached the model
        _served(srv)


def test_queue_serves_concurrent_requests_in_order_without_loss(daemon):
    srv, lab = daemon
    out: dict[int, httpx.Response] = {}

    def send(i: int) -> None:
        out[i] = httpx.post(srv.url + GEN, json=_body(f"[slow] req-{i}", num_predict=5 + i), timeout=60)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(out) == list(range(8))
    for i, r in out.items():
        assert r.status_code == 200 and r.json()["response"] == "x" * (5 + i) and r.json()["eval_count"] == 5 + i
    assert all(r.finished and not r.cancelled for r in lab.runs_with("req-"))


# ---- idle connections ----------------------------------------------------------------------------------------


def _stall(port: int, n: int, half_body: bool) -> list[socket.socket]:
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if half_body and i % 2:
            s.sendall(b'POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{"model": "sm')
        else:
            s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")  # headers never finish
        socks.append(s)
    return socks


def test_fifty_stalled_connections_do_not_block_others(daemon):
    srv, _lab = daemon
    socks = _stall(srv.config.port, 50, half_body=True)
    try:
        t0 = time.monotonic()
        assert httpx.get(srv.url + "/api/tags", timeout=5).status_code == 200
        _served(srv, timeout=5)
        assert time.monotonic() - t0 < 5
    finally:
        for s in socks:
            s.close()
    _served(srv)


def test_hundreds_of_stalled_connections_do_not_lock_the_daemon(daemon):
    srv, _lab = daemon
    socks = _stall(srv.config.port, 300, half_body=False)
    try:
        deadline = time.monotonic() + 10  # room for a header-read timeout to drop the stalled sockets
        status = None
        while time.monotonic() < deadline:
            status = httpx.get(srv.url + "/api/tags", timeout=5).status_code
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200
    finally:
        for s in socks:
            s.close()


# ---- cancellation --------------------------------------------------------------------------------------------


def test_disconnect_during_decode_stops_generation(daemon):
    srv, lab = daemon
    lines = _stream_lines(srv, "[slow] decode-stream", 3)
    assert all(line["response"] == "x" for line in lines)
    run = lab.wait_run("decode-stream")
    assert run.closed.wait(5), "generation kept running after the client left"
    assert run.cancelled and not run.finished and run.tokens < 1000
    _served(srv)


def test_disconnect_during_non_streamed_decode_stops_generation(daemon):
    srv, lab = daemon
    with pytest.raises(httpx.ReadTimeout):  # httpx closes the connection on a timeout
        httpx.post(srv.url + GEN, json=_body("[slow] decode-whole"), timeout=httpx.Timeout(30, read=0.5))
    run = lab.wait_run("decode-whole")
    assert run.closed.wait(5), "generation kept running after the client left"
    assert run.cancelled and not run.finished and run.tokens < 1000
    _served(srv)


def test_disconnect_during_prompt_eval_stops_generation(daemon):
    srv, lab = daemon
    sender = _Sender(srv.config.port, _body("[prefill-gate] [slow] prefill", stream=True))
    run = lab.wait_run("prefill")
    assert run.in_prefill.wait(5)
    sender.drop()
    time.sleep(0.3)  # let the daemon see the disconnect while prompt evaluation still runs
    lab.prefill_release.set()
    assert run.closed.wait(5), "generation kept running after the client left"
    assert run.cancelled and not run.finished and run.tokens < 200  # ~1 s of tokens: stopped at a decode step
    _served(srv)


def test_disconnect_during_load_leaves_the_daemon_serving(daemon):
    srv, lab = daemon
    lab.load_gate.clear()
    sender = _Sender(srv.config.port, _body("[slow] during-load", stream=True))
    assert lab.load_entered.wait(5)
    sender.drop()
    time.sleep(0.3)
    lab.load_gate.set()
    _served(srv)  # the load completed and the model serves the next request
    for run in lab.runs_with("during-load"):
        assert run.closed.wait(5) and run.cancelled and run.tokens < 1000
    assert lab.loads == 1


def test_disconnect_during_load_withdraws_the_request(daemon):
    srv, lab = daemon
    lab.load_gate.clear()
    sender = _Sender(srv.config.port, _body("[slow] withdrawn", stream=True))
    assert lab.load_entered.wait(5)
    sender.drop()
    time.sleep(0.5)  # time for the daemon to see the disconnect while the load still runs
    lab.load_gate.set()
    _served(srv)
    assert not lab.runs_with("withdrawn"), "the abandoned request was run after the load"


def test_disconnect_while_queued_withdraws_the_request(daemon):
    srv, lab = daemon
    holder = threading.Thread(
        target=lambda: httpx.post(srv.url + GEN, json=_body("[decode-gate] holder", num_predict=3), timeout=30)
    )
    holder.start()
    assert lab.wait_run("holder").in_decode.wait(10)
    sender = _Sender(srv.config.port, _body("[slow] queued-then-gone", stream=True))
    wait_until(lambda: any(i.queued == 1 for i in srv.service.scheduler.ps()), 10, "one queued request")
    sender.drop()
    try:
        wait_until(lambda: all(i.queued == 0 for i in srv.service.scheduler.ps()), 2, "the queue to empty")
    finally:
        lab.decode_release.set()
        holder.join(15)
    _served(srv)
    assert not lab.runs_with("queued-then-gone")


def test_disconnect_mid_stream_on_openai_route_stops_generation(daemon):
    srv, lab = daemon
    body = {"model": MODEL, "messages": [{"role": "user", "content": "[slow] sse-gone"}], "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
            if seen == 3:
                break
    run = lab.wait_run("sse-gone")
    assert run.closed.wait(5) and run.cancelled and not run.finished
    _served(srv)


def test_raw_half_closed_stream_reader_is_cancelled(daemon):
    """A client that stops reading and closes without a FIN handshake (RST) also frees the worker."""
    srv, lab = daemon
    sender = _Sender(srv.config.port, _body("[slow] rst-gone", stream=True))
    head = read_reply_head(sender.sock)
    assert status_of(head) == 200
    sender.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    sender.sock.close()
    run = lab.wait_run("rst-gone")
    assert run.closed.wait(5) and run.cancelled and not run.finished
    _served(srv)


def read_reply_head(s: socket.socket) -> bytes:
    buf = b""
    deadline = time.monotonic() + 10
    while b"\r\n\r\n" not in buf and time.monotonic() < deadline:
        buf += s.recv(4096)
    return buf
