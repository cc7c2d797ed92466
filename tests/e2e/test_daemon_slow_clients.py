"""Slow clients against a real daemon on loopback (issue 12, part 2): connections that stall in their request
body (or trickle it, or trickle a second head on a kept-alive connection) are closed by rate/time deadlines and
never count toward the concurrency limit, so every other client keeps being served meanwhile; past the socket
limit the slowest waiting connections are shed. Real uploads at a real rate are not cut."""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import httpx
import pytest

from _daemon_fakes import MODEL, fake_daemon, status_of, read_reply, wait_until
from localrt.serve import daemon as dmn

STALL = (
    b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
)


@pytest.fixture
def fast_deadlines(monkeypatch):
    monkeypatch.setattr(dmn, "BODY_GRACE_S", 1.5)
    monkeypatch.setattr(dmn, "WATCH_TICK_S", 0.1)
    monkeypatch.setattr(dmn, "HEADER_TIMEOUT_S", 1.0)


def _ok(srv) -> None:
    r = httpx.post(
        srv.url + "/api/generate",
        json={"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
        timeout=20,
    )
    assert r.status_code == 200, r.text


def _stalled(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(STALL)
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_stalled_bodies_do_not_lock_others_out(tmp_path, fast_deadlines):
    with fake_daemon(tmp_path) as (srv, lab):
        socks = _stalled(srv.config.port, 256)
        try:
            state = srv.server.server_state
            wait_until(lambda: len(state.tasks) >= 256, 20, "the daemon to accept all 256 and start their requests")
            start = time.monotonic()
            for _ in range(3):  # before: 503 "Exceeded concurrency limit" for as long as the 256 stayed open
                _ok(srv)
            assert time.monotonic() - start < 10
            # the body deadline closes every stalled connection once its grace has passed
            deadline = time.monotonic() + 8
            assert all(_closed_by_server(s, max(0.1, deadline - time.monotonic())) for s in socks)
        finally:
            for s in socks:
                s.close()
        _ok(srv)


def test_trickled_body_is_closed_by_its_rate(tmp_path, fast_deadlines):
    with fake_daemon(tmp_path) as (srv, lab):
        socks = _stalled(srv.config.port, 8)
        stop = threading.Event()

        def trickle():  # one byte per 0.2 s and socket: alive, but far below the minimum rate
            while not stop.wait(0.2):
                for s in socks:
                    try:
                        s.sendall(b" ")
                    except OSError:
                        pass

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            start = time.monotonic()
            assert all(_closed_by_server(s, 8) for s in socks)
            assert time.monotonic() - start < 8
        finally:
            stop.set()
            t.join()
            for s in socks:
                s.close()
        _ok(srv)


def test_trickled_head_on_a_kept_alive_connection_is_closed(tmp_path, fast_deadlines):
    with fake_daemon(tmp_path) as (srv, lab):
        with socket.create_connection(("127.0.0.1", srv.config.port), timeout=10) as s:
            s.sendall(b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert status_of(read_reply(s)) == 200
            start = time.monotonic()
            closed = False
            for ch in b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200:
                try:
                    s.sendall(bytes([ch]))  # each byte would restart uvicorn's own keep-alive timer
                except OSError:
                    closed = True
                    break
                s.settimeout(0.2)
                try:
                    if s.recv(1) == b"":
                        closed = True
                        break
                except socket.timeout:
                    pass
                except OSError:
                    closed = True
                    break
            assert closed and time.monotonic() - start < 6
        _ok(srv)


def test_past_the_socket_limit_the_slowest_waiting_connections_are_shed(tmp_path, fast_deadlines, monkeypatch):
    monkeypatch.setattr(dmn, "BODY_GRACE_S", 60.0)  # only shedding may close them here
    monkeypatch.setattr(dmn, "MAX_CONNECTIONS", 48)
    with fake_daemon(tmp_path) as (srv, lab):
        socks = _stalled(srv.config.port, 48)
        try:
            state = srv.server.server_state
            wait_until(lambda: len(state.tasks) >= 48, 20, "the daemon to accept the first 48")
            time.sleep(dmn.SHED_MIN_AGE_S + 0.2)
            more = _stalled(srv.config.port, 16)  # each new connection closes the oldest slow ones
            socks += more
            _ok(srv)
            closed = sum(_closed_by_server(s, 0.05) for s in socks[:48])
            assert closed >= 16
            assert not any(_closed_by_server(s, 0.05) for s in more)  # younger than SHED_MIN_AGE_S
        finally:
            for s in socks:
                s.close()
        _ok(srv)


def test_a_real_upload_at_a_modest_rate_is_not_cut(tmp_path, fast_deadlines):
    payload = bytes(range(256)) * 256 * 4  # 256 KiB, sent over ~3 s: well above the minimum rate
    digest = "sha256:" + hashlib.sha256(payload).hexdigest()
    with fake_daemon(tmp_path) as (srv, lab):
        with socket.create_connection(("127.0.0.1", srv.config.port), timeout=20) as s:
            s.sendall(
                f"POST /api/blobs/{digest} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
            )
            for i in range(0, len(payload), 8192):
                s.sendall(payload[i : i + 8192])
                time.sleep(0.1)
            assert status_of(read_reply(s)) == 201
        assert httpx.head(srv.url + f"/api/blobs/{digest}", timeout=10).status_code == 200
