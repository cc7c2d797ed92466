"""The registry protocol served from a store: manifests, blobs with Range, uploads, and when it is switched on."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

import store as st
from localrt import config as cfg
from localrt.distribution.registry import parse_range, registry_enabled, registry_routes, uploads_allowed
from store import manifests as mf

from _mirror import daemon, make_model, sha


@pytest.fixture()
def served(tmp_path):
    s = st.Store(tmp_path / "models")
    manifest = make_model(s, "tiny:1", tmp_path / "src", n_bytes=200_000)
    config = cfg.load({"LOCALRT_MODELS": str(s.root)})
    client = TestClient(Starlette(routes=registry_routes(lambda: s, config)))
    return s, manifest, client


def test_enabled_only_on_loopback_unless_key_or_opt_in():
    base = cfg.Config()
    assert registry_enabled(base)
    assert registry_enabled(dataclasses.replace(base, host="::1"))
    lan = dataclasses.replace(base, host="0.0.0.0")
    assert not registry_enabled(lan)
    assert registry_enabled(dataclasses.replace(lan, api_key="k"))
    opted = type("C", (), {"host": "192.168.1.5", "api_key": None, "registry_public": True})()
    assert registry_enabled(opted)
    assert uploads_allowed(base) and not uploads_allowed(lan) and uploads_allowed(dataclasses.replace(lan, api_key="k"))
    assert not uploads_allowed(opted)  # a public read-only mirror never takes uploads without a key


def test_manifest_get_head_and_404(served):
    s, manifest, client = served
    raw = s.get("tiny:1").path.read_bytes()
    r = client.get("/v2/library/tiny/manifests/1")
    assert r.status_code == 200 and r.content == raw
    assert r.headers["content-type"].startswith(mf.MANIFEST_MEDIA_TYPE)
    assert r.headers["docker-content-digest"] == sha(raw)
    assert int(r.headers["content-length"]) == len(raw)
    h = client.head("/v2/library/tiny/manifests/1")
    assert h.status_code == 200 and h.content == b"" and int(h.headers["content-length"]) == len(raw)
    assert client.get("/v2/LIBRARY/Tiny/manifests/1").status_code == 200  # names are case-insensitive
    missing = client.get("/v2/library/tiny/manifests/2")
    assert missing.status_code == 404 and missing.json()["errors"][0]["code"] == "MANIFEST_UNKNOWN"
    assert client.get("/v2/library/%2e%2e/manifests/1").status_code == 400
    assert client.get("/v2/").status_code == 200


def test_manifest_found_under_other_host(tmp_path):
    s = st.Store(tmp_path / "models")
    make_model(s, "mirror.lan:11434/team/x:v1", tmp_path / "src")
    client = TestClient(Starlette(routes=registry_routes(lambda: s, cfg.Config())))
    assert client.get("/v2/team/x/manifests/v1").status_code == 200


def test_blob_full_ranges_and_errors(served):
    s, manifest, client = served
    d = manifest.layers[0].digest
    data = s.blob_path(d).read_bytes()
    n = len(data)
    r = client.get(f"/v2/library/tiny/blobs/{d}")
    assert r.status_code == 200 and r.content == data and r.headers["docker-content-digest"] == d
    assert int(r.headers["content-length"]) == n and r.headers["accept-ranges"] == "bytes"
    for header, (a, b) in {
        "bytes=10-99": (10, 99),
        "bytes=1000-": (1000, n - 1),
        "bytes=-50": (n - 50, n - 1),
        f"bytes=0-{n + 999}": (0, n - 1),
    }.items():
        r = client.get(f"/v2/library/tiny/blobs/{d}", headers={"Range": header})
        assert r.status_code == 206, header
        assert r.content == data[a : b + 1]
        assert r.headers["content-range"] == f"bytes {a}-{b}/{n}"
        assert int(r.headers["content-length"]) == b - a + 1
    for bad in (f"bytes={n}-", "bytes=5-1", "bytes=0-1,5-9", "items=0-1", "bytes=-0"):
        r = client.get(f"/v2/library/tiny/blobs/{d}", headers={"Range": bad})
        assert r.status_code == 416, bad
        assert r.headers["content-range"] == f"bytes */{n}"
    h = client.head(f"/v2/library/tiny/blobs/{d}")
    assert h.status_code == 200 and int(h.headers["content-length"]) == n and h.content == b""
    assert client.get(f"/v2/library/tiny/blobs/sha256:{'0' * 64}").status_code == 404
    assert client.get("/v2/library/tiny/blobs/sha256:..etc").status_code == 400
    assert client.get("/v2/library/tiny/blobs/sha256:..%2f..%2fetc").status_code == 404  # no route matches
    assert client.get(f"/v2/library/tiny/blobs/sha256-{d[7:]}").status_code == 200  # the file-name form too


def test_parse_range_table():
    assert parse_range("bytes=0-0", 10) == (0, 0)
    assert parse_range("bytes=9-", 10) == (9, 9)
    assert parse_range("bytes=-20", 10) == (0, 9)
    assert parse_range("bytes=10-", 10) is None
    assert parse_range("bytes=0-", 0) is None
    assert parse_range("bytes=-", 10) is None


def _upload(client, data: bytes, digest: str, chunks: int = 3, repo: str = "library/up"):
    r = client.post(f"/v2/{repo}/blobs/uploads/")
    assert r.status_code == 202, r.text
    loc = r.headers["location"]
    step = -(-len(data) // chunks)
    for i in range(0, len(data), step):
        piece = data[i : i + step]
        r = client.patch(loc, content=piece, headers={"Content-Range": f"{i}-{i + len(piece) - 1}"})
        assert r.status_code == 202, r.text
        loc = r.headers["location"]
    return client.put(f"{loc}?digest={digest}")


def test_upload_roundtrip_then_manifest(served, tmp_path):
    s, manifest, client = served
    data = b"fresh blob bytes " * 1000
    d = sha(data)
    r = _upload(client, data, d)
    assert r.status_code == 201 and r.headers["docker-content-digest"] == d
    assert s.blob_path(d).read_bytes() == data
    assert s.new_temp_file().parent == s.root / "blobs"
    cfg_blob = b"{}"
    assert _upload(client, cfg_blob, sha(cfg_blob), chunks=1).status_code == 201
    m = mf.build(mf.Layer(mf.CONFIG_MEDIA_TYPE, sha(cfg_blob), 2), [mf.Layer(mf.MODEL, d, len(data))])
    r = client.put("/v2/team/up/manifests/v2", content=m.to_bytes(), headers={"Content-Type": mf.MANIFEST_MEDIA_TYPE})
    assert r.status_code == 201, r.text
    assert s.get("team/up:v2").manifest.digests == m.digests  # stored under the default host


def test_upload_refusals(served):
    s, manifest, client = served
    data = b"x" * 5000
    before = sorted(p.name for p in (s.root / "blobs").iterdir())
    r = _upload(client, data, sha(b"something else"))
    assert r.status_code == 400 and "digest mismatch" in r.json()["errors"][0]["message"]
    r = client.post("/v2/library/up/blobs/uploads/")
    loc = r.headers["location"]
    assert client.patch(loc, content=b"abc", headers={"Content-Range": "5-7"}).status_code == 416
    assert client.patch("/v2/library/up/blobs/uploads/nope", content=b"abc").status_code == 404
    assert client.patch(loc.replace("library/up", "library/other"), content=b"abc").status_code == 404
    assert client.put(f"{loc}?digest=sha256:../../x").status_code == 400
    missing = mf.build(mf.Layer(mf.CONFIG_MEDIA_TYPE, sha(b"nope"), 4), [])
    r = client.put("/v2/library/up/manifests/1", content=missing.to_bytes())
    assert r.status_code == 400 and r.json()["errors"][0]["code"] == "MANIFEST_BLOB_UNKNOWN"
    assert client.put("/v2/library/up/manifests/1", content=b'{"schemaVersion": 2, "layers": "x"}').status_code == 400
    after = sorted(p.name for p in (s.root / "blobs").iterdir() if not p.name.startswith(".tmp-"))
    assert [n for n in after if n not in before] == []
    assert not st.Store(s.root).exists("library/up:1")


def test_uploads_refused_on_public_read_only_mirror(tmp_path):
    s = st.Store(tmp_path / "models")
    lan = type("C", (), {"host": "0.0.0.0", "api_key": None, "registry_public": True})()
    client = TestClient(Starlette(routes=registry_routes(lambda: s, lan)))
    r = client.post("/v2/library/up/blobs/uploads/")
    assert r.status_code == 403 and r.json()["errors"][0]["code"] == "DENIED"
    assert client.put("/v2/library/up/manifests/1", content=b"{}").status_code == 403


def test_real_daemon_serves_registry_and_guard_applies(tmp_path):
    s = st.Store(tmp_path / "a")
    manifest = make_model(s, "tiny:1", tmp_path / "src")
    with daemon(s.root, api_key="sekret") as a:
        url = f"{a.url}/v2/library/tiny/manifests/1"
        assert httpx.get(url).status_code == 401  # the API key protects the registry like every route
        r = httpx.get(url, headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200 and mf.parse(r.content).digests == manifest.digests
