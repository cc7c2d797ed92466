"""Hostile requests round 2 against the real daemon (issue 12, parts 1 and 7): a GGUF chat template Python cannot
compile and NaN/Inf metadata (show and chat still answer), server-side paths in pull/create from a remote caller
(one 400 whether or not the path exists), CORS origins with IPv6 literals, a full disk during upload/create (507),
JSON numbers beyond float range (400). The daemon keeps serving after each."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import math
from pathlib import Path

import httpx
import pytest

import gguf_io
import store as st
from _daemon_fakes import MODEL, FakeModel, Lab, fake_daemon, make_config
from _jinja_payloads import UNCOMPILABLE
from fixtures.decoders import write_tiny
from localrt.models.create import create
from localrt.runtime.service import Service
from localrt.serve.security import origin_allowed, parse_origin
from localrt.serve.server import make_app

BAD = "badtemplate:latest"
NAN = "nanmeta:latest"
BOMB = "bombtemplate:latest"
BOMB_TEMPLATES = [
    "{{ ('a' * 40000)|replace('a', 'b' * 40000) }}",
    "{{ '{:>1500000000}'.format(1) }}",
    "{{ ('\t' * 200000).expandtabs(8000) }}",
    "{{ ('a\n' * 400000)|indent(4000) }}",
    "{{ ('a' * 1000000)|wordwrap(1) }}",
]


class MetaLab(Lab):
    """A fake loader whose models carry the GGUF's own metadata (so the GGUF chat template is the one in use)."""

    def load_model(self, path, num_ctx: int = 4096, num_batch: int = 512, **_device):
        model = super().load_model(path, num_ctx, num_batch)
        with gguf_io.open(path) as f:
            model.metadata = dict(f.metadata)
        return model


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    s = st.Store(d)
    g = tmp_path_factory.mktemp("src")
    bad = write_tiny(g / "bad.gguf", extra={"tokenizer.chat_template": UNCOMPILABLE[0]})
    nan = write_tiny(g / "nan.gguf", extra={"test.nan": math.nan, "test.inf": math.inf, "test.ok": 1.5})
    list(create(s, BAD, f"FROM {bad}\n"))
    for i, src in enumerate(BOMB_TEMPLATES):
        bomb = write_tiny(g / f"bomb{i}.gguf", extra={"tokenizer.chat_template": src}, seed=10 + i)
        list(create(s, f"bomb{i}:latest", f"FROM {bomb}\n"))
    list(create(s, NAN, f"FROM {nan}\n"))
    return d


@pytest.fixture(scope="module")
def daemon(models_dir):
    import _daemon_fakes

    saved, _daemon_fakes.Lab = _daemon_fakes.Lab, MetaLab
    try:
        with fake_daemon(models_dir) as (srv, lab):
            yield srv
    finally:
        _daemon_fakes.Lab = saved


def _ok(srv) -> None:
    r = httpx.post(
        srv.url + "/api/generate",
        json={"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
        timeout=30,
    )
    assert r.status_code == 200, r.text


# ---- part 1: a template that does not compile --------------------------------------------------------------


def test_show_and_chat_fall_back_when_the_gguf_template_does_not_compile(daemon):
    r = httpx.post(daemon.url + "/api/show", json={"model": BAD}, timeout=30)
    assert r.status_code == 200, r.text  # before: 500 (SyntaxError escaped the fallback)
    assert "rejected" in r.json()["template_info"]["reason"]
    r = httpx.post(
        daemon.url + "/api/chat",
        json={
            "model": BAD,
            "stream": False,
            "options": {"num_predict": 2},
            "messages": [{"role": "user", "content": "hi"}],
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    _ok(daemon)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_template_bombs_are_400_and_the_daemon_keeps_no_memory(daemon):
    """Each chat builds nothing large (before: 0.4-1.6 GB per chat, 9.5 GB after five) and answers 400."""
    chat = {"stream": False, "options": {"num_predict": 2}, "messages": [{"role": "user", "content": "hi"}]}
    httpx.post(daemon.url + "/api/chat", json={**chat, "model": "bomb0"}, timeout=60)  # loads, warms up
    base = _rss()
    for _ in range(2):
        for i in range(len(BOMB_TEMPLATES)):
            r = httpx.post(daemon.url + "/api/chat", json={**chat, "model": f"bomb{i}"}, timeout=60)
            assert r.status_code == 400 and "template" in r.json()["error"], r.text
    assert _rss() - base < 150 << 20
    _ok(daemon)


def test_fair_share_through_http_clients_named_by_a_local_proxy(models_dir):
    """Twelve clients (named by X-Forwarded-For from a loopback proxy) on a queue of 4: every one is served;
    refusals are 503 with Retry-After."""
    import threading
    import time

    with fake_daemon(models_dir, max_queue=4) as (srv, lab):
        served = {f"10.0.0.{i}": 0 for i in range(12)}
        refused_ok = []
        stop = threading.Event()

        def client(addr: str) -> None:
            with httpx.Client(timeout=30) as c:
                while not stop.is_set():
                    r = c.post(
                        srv.url + "/api/generate",
                        headers={"X-Forwarded-For": addr},
                        json={"model": MODEL, "prompt": "[slow] x", "stream": False, "options": {"num_predict": 4}},
                    )
                    if r.status_code == 503:
                        refused_ok.append(r.headers.get("retry-after") is not None)
                        time.sleep(0.2)
                    else:
                        assert r.status_code == 200, r.text
                        served[addr] += 1

        threads = [threading.Thread(target=client, args=(a,), daemon=True) for a in served]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 40
        while min(served.values()) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(30)
        assert min(served.values()) >= 1, served
        assert all(refused_ok)


# ---- part 7: NaN metadata ---------------------------------------------------------------------------------


def test_show_renders_nan_and_inf_metadata_as_null(daemon):
    r = httpx.post(daemon.url + "/api/show", json={"model": NAN}, timeout=30)
    assert r.status_code == 200, r.text
    info = r.json()["model_info"]
    assert info["test.nan"] is None and info["test.inf"] is None and info["test.ok"] == 1.5
    _ok(daemon)


# ---- part 7: server-side paths from a remote caller -------------------------------------------------------


def _remote(models_dir: Path, method: str, path: str, body: dict, peer: str = "10.1.2.3") -> httpx.Response:
    """The app behind its guards, as reached from another machine (the ASGI scope's peer address)."""
    conf = make_config(models_dir)
    service = Service(conf, load_model=Lab().load_model)

    async def go():
        transport = httpx.ASGITransport(app=make_app(service, conf), client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.request(method, path, json=body, timeout=30)

    try:
        return asyncio.run(go())
    finally:
        service.close()


def test_remote_pull_of_a_server_path_is_one_400_whether_or_not_it_exists(models_dir, tmp_path):
    missing = tmp_path / "no-such-folder"
    replies = [
        _remote(models_dir, "POST", "/api/pull", {"model": str(p), "stream": False})
        for p in (models_dir, missing, f"file://{models_dir}")
    ]
    assert {r.status_code for r in replies} == {400}
    assert len({r.json()["error"] for r in replies}) == 1
    assert "badtemplate" not in replies[0].text and "nanmeta" not in replies[0].text


def test_pull_of_a_server_path_via_a_local_proxy_is_refused_too(daemon, models_dir):
    r = httpx.post(
        daemon.url + "/api/pull",
        json={"model": str(models_dir), "stream": False},
        headers={"X-Forwarded-For": "203.0.113.9"},
        timeout=30,
    )
    assert r.status_code == 400 and "badtemplate" not in r.text
    r = httpx.post(daemon.url + "/api/pull", json={"model": str(models_dir), "stream": False}, timeout=30)
    assert "only be pulled from this machine" not in r.text  # this machine itself may still use a folder
    _ok(daemon)


def test_a_folder_whose_blob_links_out_is_refused_through_the_daemon(daemon, tmp_path):
    """A local caller's /api/pull of a folder holding a blob linked to a file it may not read: one error line that
    tells neither the linked file's size nor its sha256, nothing registered (/api/show 404), the daemon serving."""
    from _mirror import make_model

    from localrt.distribution import bundle as bd

    s = st.Store(tmp_path / "src")
    manifest = make_model(s, "linked:1", tmp_path / "work", n_bytes=300_000)
    bd.export(s, "linked:1", tmp_path / "b")
    blob = tmp_path / "b" / "blobs" / st.digest.to_filename(manifest.layers[0].digest)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root-only secret " * 254 + b"end")  # 4321 bytes
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    blob.unlink()
    blob.symlink_to(secret)
    r = httpx.post(daemon.url + "/api/pull", json={"model": str(tmp_path / "b"), "stream": False}, timeout=30)
    assert r.status_code >= 400 and "is a link; refused" in r.json()["error"], r.text
    assert "4321" not in r.text and digest not in r.text
    assert httpx.post(daemon.url + "/api/show", json={"model": "linked:1"}, timeout=30).status_code == 404
    _ok(daemon)


def test_remote_create_from_a_server_path_is_one_400(models_dir, tmp_path):
    bodies = [
        {"model": "x", "from": str(models_dir)},
        {"model": "x", "from": str(tmp_path / "nope.gguf")},
        {"model": "x", "modelfile": f"FROM {models_dir}"},
    ]
    replies = [_remote(models_dir, "POST", "/api/create", {**b, "stream": False}) for b in bodies]
    assert {r.status_code for r in replies} == {400}
    assert all("local file paths are not accepted" in r.json()["error"] for r in replies)


# ---- part 7: CORS origins -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin,ok",
    [
        ("http://[::1]:8080", True),
        ("http://[::1]", True),
        ("https://[0:0::1]:3", True),
        ("http://localhost:5173", True),
        ("http://127.0.0.1", True),
        ("http://localhost:80", True),
        ("http://[::1]x", False),
        ("http://[:1]:8080", False),
        ("http://[::2]:8080", False),
        ("http://localhost.evil.com", False),
        ("http://evil.com:*", False),
        ("http://127.0.0.1:99999", False),
        ("http://localhost/path", False),
        ("http://u@localhost", False),
        ("null", False),
        ("file://", False),
        ("javascript:alert(1)", False),
    ],
)
def test_cors_origin_parser(origin, ok):
    assert origin_allowed(origin, ()) is ok


def test_configured_origins_use_the_same_parser():
    extra = ("chrome-extension://*", "https://app.example.com:*", "http://[fe80::1]:9000")
    assert origin_allowed("chrome-extension://abcdef", extra)
    assert origin_allowed("https://app.example.com:8443", extra) and origin_allowed("https://app.example.com", extra)
    assert origin_allowed("http://[fe80::1]:9000", extra) and not origin_allowed("http://[fe80::1]:9001", extra)
    assert not origin_allowed("https://evil.example.com", extra)
    assert not origin_allowed("https://a.example.com", ("https://*.example.com",))  # no globs inside a name
    assert parse_origin("http://[::1]:*", pattern=True) == ("http", "::1", "*")
    assert parse_origin("http://[::1]:*") is None


def test_ipv6_loopback_origin_gets_cors_headers(daemon):
    r = httpx.get(daemon.url + "/api/version", headers={"Origin": "http://[::1]:8080"}, timeout=10)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://[::1]:8080"
    assert httpx.get(daemon.url + "/api/version", headers={"Origin": "http://[::1]x"}, timeout=10).status_code == 403


# ---- part 7: a full disk ------------------------------------------------------------------------------------


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_during_blob_upload_is_507_and_leaves_nothing(daemon, models_dir, monkeypatch):
    from localrt.runtime import catalog

    payload = b"z" * 300_000
    digest = "sha256:" + hashlib.sha256(payload).hexdigest()
    monkeypatch.setattr(catalog.BlobWriter, "write", _enospc)
    r = httpx.post(daemon.url + f"/api/blobs/{digest}", content=payload, timeout=30)
    assert r.status_code == 507 and "disk space" in r.json()["error"], r.text
    assert not any(p.name.startswith(".tmp-") for p in (models_dir / "blobs").iterdir())
    monkeypatch.undo()
    assert httpx.post(daemon.url + f"/api/blobs/{digest}", content=payload, timeout=30).status_code == 201
    _ok(daemon)


def test_disk_full_during_create_is_507(daemon, monkeypatch):
    monkeypatch.setattr(st.Store, "put_manifest", _enospc)
    body = {"model": "full-disk", "from": MODEL, "system": "x", "stream": False}
    r = httpx.post(daemon.url + "/api/create", json=body, timeout=60)
    assert r.status_code == 507 and "disk space" in r.json()["error"], r.text
    with httpx.stream("POST", daemon.url + "/api/create", json={**body, "stream": True}, timeout=60) as s:
        lines = [json.loads(line) for line in s.iter_lines() if line]
    assert "disk space" in lines[-1].get("error", ""), lines
    monkeypatch.undo()
    _ok(daemon)


# ---- part 7: JSON numbers beyond float range --------------------------------------------------------------


@pytest.mark.parametrize(
    "path,raw",
    [
        ("/api/generate", '{"model":"%s","prompt":"hi","stream":false,"options":{"temperature":1e400}}'),
        ("/api/generate", '{"model":"%s","prompt":"hi","stream":false,"keep_alive":1e400}'),
        ("/api/generate", '{"model":"%s","prompt":"hi","stream":false,"keep_alive":-1e999}'),
        ("/api/chat", '{"model":"%s","messages":[],"keep_alive":%s}' % ("%s", "1" * 400)),
        ("/v1/chat/completions", '{"model":"%s","messages":[{"role":"user","content":"x"}],"max_tokens":1e400}'),
        ("/v1/chat/completions", '{"model":"%s","messages":[{"role":"user","content":"x"}],"max_tokens":Infinity}'),
        ("/v1/completions", '{"model":"%s","prompt":"x","max_tokens":1e400}'),
        ("/api/embed", '{"model":"%s","input":"x","dimensions":1e400}'),
        ("/api/embed", '{"model":"%s","input":"x","dimensions":-Infinity}'),
        ("/v1/embeddings", '{"model":"%s","input":"x","dimensions":1e400}'),
    ],
)
def test_numbers_beyond_float_range_are_400(daemon, path, raw):
    r = httpx.post(
        daemon.url + path, content=(raw % MODEL).encode(), timeout=30, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    _ok(daemon)
