"""Bad input against a real daemon (pain_points section 8, items 15, 20, 22): each gets the right status and a clear
message, and the daemon keeps serving. The model loader is scripted (tests/_daemon_fakes.py); everything between
the socket and the loader is the real daemon."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from _daemon_fakes import MODEL, fake_daemon, raw_request, read_reply, status_of
from localrt.serve.daemon import BackgroundServer, InsecureBind
from localrt.serve.security import Guard

GEN = "/api/generate"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def daemon(models_dir):
    with fake_daemon(models_dir) as (srv, lab):
        yield srv


def _ok(srv) -> None:
    """The daemon still answers a real generation after the bad request."""
    r = httpx.post(
        srv.url + GEN, json={"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 3}}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.json()["response"] == "xxx" and r.json()["done_reason"] == "length"


def _post(srv, body: dict | bytes, path: str = GEN, **kw) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(srv.url + path, content=body, timeout=30, **kw)
    return httpx.post(srv.url + path, json={"stream": False, **body}, timeout=30, **kw)


@pytest.mark.parametrize(
    "host", ["evil.example.com", "evil.example.com:11434", "127.0.0.1.nip.io", "localhost.attacker.net", "localhost."]
)
def test_host_not_allowed_is_403(daemon, host):
    r = httpx.get(daemon.url + "/api/tags", headers={"Host": host}, timeout=10)
    assert r.status_code == 403 and "host" in r.json()["error"]
    r = _post(daemon, {"model": MODEL, "prompt": "hi"}, headers={"Host": host})
    assert r.status_code == 403
    _ok(daemon)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]:1234", "app.localhost"])
def test_loopback_hosts_are_allowed(daemon, host):
    assert httpx.get(daemon.url + "/api/tags", headers={"Host": host}, timeout=10).status_code == 200


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example.com",
        "null",
        "file://",
        "file:///home/u/x.html",
        "http://localhost.evil.com",
        "http://127.0.0.1.evil.com",
    ],
)
def test_foreign_origin_is_403(daemon, origin):
    r = _post(daemon, {"model": MODEL, "prompt": "hi"}, headers={"Origin": origin})
    assert r.status_code == 403 and "origin" in r.json()["error"]
    assert "access-control-allow-origin" not in r.headers
    pre = httpx.options(daemon.url + GEN, headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 403
    _ok(daemon)


def test_local_origin_gets_cors_headers(daemon):
    r = _post(
        daemon,
        {"model": MODEL, "prompt": "hi", "options": {"num_predict": 1}},
        headers={"Origin": "http://localhost:5173"},
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:5173"


def test_declared_oversized_body_is_413_before_reading(daemon):
    head = (
        f"POST {GEN} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n"
    ).encode()  # a 1 GB prompt, announced and never sent
    t0 = time.monotonic()
    reply = raw_request(daemon.config.port, head)
    assert status_of(reply) == 413 and time.monotonic() - t0 < 5
    assert b"too large" in reply
    _ok(daemon)


def test_chunked_body_without_length_over_the_cap_is_413(daemon):
    cap = Guard(None, loopback_bind=True).max_body  # the cap make_app installs (Guard's default)
    block = b"x" * (1 << 20)
    chunk = b"%x\r\n" % len(block) + block + b"\r\n"
    start = b'{"model":"smollm2:135m","prompt":"'
    replies: list[bytes] = []
    sent = 0
    with socket.create_connection(("127.0.0.1", daemon.config.port), timeout=10) as s:
        reader = threading.Thread(target=lambda: replies.append(read_reply(s)), daemon=True)
        s.sendall(f"POST {GEN} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        s.sendall(b"%x\r\n" % len(start) + start + b"\r\n")
        reader.start()
        for _ in range(cap // len(block) + 8):  # bounded: a few MiB past the cap, no Content-Length anywhere
            if replies:
                break
            try:
                s.sendall(chunk)
            except OSError:  # the server answered and closed while the body was still coming
                break
            sent += len(block)
        reader.join(10)
    assert replies and status_of(replies[0]) == 413, replies[:1]
    assert b"too large" in replies[0] and sent > cap
    _ok(daemon)


def _opts(**o) -> dict:
    return {"model": MODEL, "prompt": "hi", "options": o}


@pytest.mark.parametrize(
    "body, needle",
    [
        (_opts(num_ctx=-1), "num_ctx"),
        (_opts(num_ctx=0), "num_ctx"),
        (_opts(num_ctx=1 << 40), "num_ctx"),
        (_opts(num_predict=-3), "num_predict"),
        (_opts(num_predict=1 << 40), "num_predict"),
        (_opts(num_thread=100000), "num_thread"),
        (_opts(num_batch=-8), "num_batch"),
        (_opts(top_k=-1), "top_k"),
        (_opts(top_p=1.5), "top_p"),
        (_opts(temperature=-0.1), "temperature"),
        (_opts(repeat_last_n=-2), "repeat_last_n"),
        (_opts(num_keep=-5), "num_keep"),
        (_opts(seed=1 << 64), "seed"),
        (_opts(seed=10**30), "seed"),
        (_opts(seed=1.5), "seed"),
        (_opts(stop=["a"] * 100_000), "stop"),
        (_opts(num_ctx="4096"), "num_ctx"),
        (_opts(temperature=True), "temperature"),
        ({"model": MODEL, "prompt": "hi", "keep_alive": "300"}, "keep_alive"),
        ({"model": MODEL, "prompt": "hi", "keep_alive": "5 minutes"}, "keep_alive"),
        ({"model": MODEL, "prompt": "hi", "keep_alive": [1]}, "keep_alive"),
    ],
)
def test_option_out_of_range_is_400(daemon, body, needle):
    r = _post(daemon, body)
    assert r.status_code == 400, (body, r.text)
    assert needle in r.json()["error"], r.text
    _ok(daemon)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
@pytest.mark.parametrize("option", ["temperature", "top_p", "repeat_penalty", "presence_penalty"])
def test_non_finite_float_options_are_400(daemon, literal, option):
    raw = b'{"model":"%s","prompt":"hi","stream":false,"options":{"%s":%s}}' % (
        MODEL.encode(),
        option.encode(),
        literal,
    )
    r = _post(daemon, raw)
    assert r.status_code == 400 and option in r.json()["error"], r.text
    _ok(daemon)


def test_nan_keep_alive_is_400(daemon):
    r = _post(daemon, b'{"model":"%s","prompt":"hi","stream":false,"keep_alive":NaN}' % MODEL.encode())
    assert r.status_code == 400 and "keep_alive" in r.json()["error"], r.text


def test_edge_values_in_range_are_accepted(daemon):
    r = _post(daemon, _opts(num_predict=-2, seed=(1 << 63) - 1, top_k=0, num_thread=0, temperature=0))
    assert r.status_code == 200, r.text
    # num_predict -2 fills the context: the fake model answers up to its own bound, never a negative count
    assert r.json()["eval_count"] > 0


def test_negative_keep_alive_string_keeps_the_model_forever(daemon):
    r = _post(daemon, {"model": MODEL, "prompt": "", "keep_alive": "-1h"})
    assert r.status_code == 200 and r.json()["done_reason"] == "load", r.text
    ps = httpx.get(daemon.url + "/api/ps", timeout=10).json()["models"]
    (entry,) = [m for m in ps if m["model"] == MODEL]
    assert int(entry["expires_at"][:4]) > 2200  # "forever", as Ollama's ~292-years-ahead date
    _ok(daemon)
    ps = httpx.get(daemon.url + "/api/ps", timeout=10).json()["models"]
    assert int([m for m in ps if m["model"] == MODEL][0]["expires_at"][:4]) > 2200  # a request without one keeps it


def test_hundred_thousand_messages_is_400(daemon):
    msgs = [{"role": "user", "content": "hi"}] * 100_000
    r = _post(daemon, {"model": MODEL, "messages": msgs}, path="/api/chat")
    assert r.status_code == 400 and "too many messages" in r.json()["error"]
    _ok(daemon)


def test_openai_route_rejects_out_of_range_options(daemon):
    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=-3)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], seed=1 << 70)
    _ok(daemon)


SYNTAX = [
    (b"{nope", "invalid JSON"),
    (b'{"model": "smollm2:135m", "prompt": "hi"', "invalid JSON"),
    (b"[1, 2, 3]", "JSON object"),
    (b"\xff\xfe\x00garbage", "invalid JSON"),
    (b"", "missing request body"),
]


@pytest.mark.parametrize("raw, needle", SYNTAX)
def test_invalid_json_is_400_on_every_json_route(daemon, raw, needle):
    for path in (GEN, "/api/chat", "/api/show", "/api/embed", "/api/copy", "/api/create", "/v1/chat/completions"):
        r = _post(daemon, raw, path=path)
        assert r.status_code == 400, (path, raw, r.text)
    assert needle in _post(daemon, raw).json()["error"]
    _ok(daemon)


@pytest.mark.parametrize(
    "raw, needle",
    [
        (b'{"model": "smollm2:135m", "prompt": 7}', "prompt"),
        (b'{"model": 7, "prompt": "hi"}', "model"),
        (b'{"model": "smollm2:135m", "prompt": "hi", "options": []}', "options"),
    ],
)
def test_wrong_json_types_are_400(daemon, raw, needle):
    r = _post(daemon, raw)
    assert r.status_code == 400 and needle in r.json()["error"], r.text
    _ok(daemon)


def test_deep_nesting_is_400_not_a_crash(daemon):
    raw = b'{"model":"smollm2:135m","prompt":"hi","options":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = _post(daemon, raw)
    assert r.status_code == 400, r.text[:300]
    _ok(daemon)


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", GEN),
        ("PUT", "/api/chat"),
        ("GET", "/api/delete"),
        ("POST", "/api/tags"),
        ("DELETE", "/api/show"),
        ("POST", "/api/ps"),
    ],
)
def test_wrong_method_is_405(daemon, method, path):
    r = httpx.request(method, daemon.url + path, timeout=10)
    assert r.status_code == 405, (method, path, r.status_code)
    _ok(daemon)


@pytest.mark.parametrize(
    "path", ["/api/nope", "/api", "/v1/chat", "/api/generate/x", "/../etc/passwd", "/api/%2e%2e/%2e%2e/etc/passwd"]
)
def test_unknown_path_is_404(daemon, path):
    r = httpx.get(daemon.url + path, timeout=10)
    assert r.status_code == 404, (path, r.status_code)
    _ok(daemon)


def test_bearer_token_required_when_api_key_set(models_dir):
    with fake_daemon(models_dir, api_key="s3cret-token") as (srv, _lab):
        body = {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "s3cret-token"},
            {"Authorization": "Basic s3cret-token"},
            {"Authorization": "Bearer s3cret-token-and-more"},
        ):
            r = httpx.post(srv.url + GEN, json=body, headers=headers, timeout=10)
            assert r.status_code == 401 and "token" in r.json()["error"], headers
            assert httpx.get(srv.url + "/api/tags", headers=headers, timeout=10).status_code == 401
        ok = httpx.post(srv.url + GEN, json=body, headers={"Authorization": "Bearer s3cret-token"}, timeout=30)
        assert ok.status_code == 200 and ok.json()["response"] == "xx"
        assert httpx.get(srv.url + "/", timeout=10).status_code == 200  # the health check stays open
        # the Host guard still applies on a loopback bind, token or not
        r = httpx.get(srv.url + "/api/tags", headers={"Authorization": "Bearer s3cret-token", "Host": "evil.com"})
        assert r.status_code == 403
        # a server-side path (issue 48): a local caller without the key may not name one either
        pull = {"model": str(models_dir), "stream": False}
        r = httpx.post(srv.url + "/api/pull", json=pull, timeout=10)
        assert r.status_code == 401 and str(models_dir) not in r.text
        r = httpx.post(srv.url + "/api/pull", json=pull, headers={"Authorization": "Bearer s3cret-token"}, timeout=30)
        assert r.status_code != 401


def test_non_loopback_bind_without_token_is_refused(models_dir):
    from _daemon_fakes import make_config

    conf = make_config(models_dir, host="0.0.0.0")
    with pytest.raises(InsecureBind, match="LOCALRT_API_KEY"):
        BackgroundServer(object(), conf)  # refused before any socket is opened


def test_error_bodies_are_json_objects(daemon):
    r = _post(daemon, {"model": "no-such-model", "prompt": "hi"})
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
    assert set(json.loads(r.text)) == {"error"}
