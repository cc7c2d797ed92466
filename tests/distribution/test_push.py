"""Push a model from one real daemon to another over the upload protocol."""

from __future__ import annotations

import json

import httpx
import pytest

import store as st
from localrt.distribution import push as ps
from localrt.distribution.registry import RegistryError

from _mirror import blob_bytes, daemon, make_model

MB = 1 << 20


def _api(base_url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{base_url}{path}", json=body, timeout=60) as r:
        return [json.loads(line) for line in r.iter_lines() if line]


def test_push_via_api_then_pull_back(tmp_path, monkeypatch):
    monkeypatch.setattr(ps, "PATCH_CHUNK", 1 * MB)  # several PATCHes per blob
    admin = st.Store(tmp_path / "admin")
    manifest = make_model(admin, "tiny:1", tmp_path / "src", n_bytes=3 * MB)
    with daemon(tmp_path / "mirror") as mirror, daemon(admin.root) as local:
        host = mirror.url.split("//")[1]
        target = f"{host}/library/tiny:1"
        admin.copy("tiny:1", target)
        events = _api(local.url, "/api/push", {"model": target, "insecure": True})
        blobs = [layer.digest for layer in manifest.layers] + [manifest.config.digest]
        statuses = list(dict.fromkeys(e["status"] for e in events))
        assert statuses == ["retrieving manifest"] + [f"pushing {d[7:19]}" for d in blobs] + [
            "pushing manifest",
            "success",
        ]
        last = {e["digest"]: e for e in events if "digest" in e}
        assert all(last[d]["completed"] == last[d]["total"] for d in blobs)
        m_store = mirror.service.store
        assert m_store.get("tiny:1").manifest.digests == manifest.digests  # listed as tiny:1 on the mirror
        for d in blobs:
            assert blob_bytes(m_store, d) == blob_bytes(admin, d)
        again = list(ps.push(admin, target, insecure=True))
        assert all(e["completed"] == e["total"] for e in again if "digest" in e)
        from localrt.distribution import pull as pl

        fresh = st.Store(tmp_path / "fresh")
        assert list(pl.pull(fresh, target, insecure=True))[-1] == {"status": "success"}


def test_push_refusals(tmp_path):
    s = st.Store(tmp_path / "s")
    make_model(s, "tiny:1", tmp_path / "src")
    with pytest.raises(RegistryError, match="not supported"):
        list(ps.push(s, "tiny:1"))
    s.copy("tiny:1", "127.0.0.1:9/library/tiny:1")
    with pytest.raises(RegistryError, match="insecure protocol http"):
        list(ps.push(s, "http://127.0.0.1:9/library/tiny:1"))
    with pytest.raises(RegistryError, match="cannot reach"):
        list(ps.push(s, "127.0.0.1:9/library/tiny:1", insecure=True))
    with pytest.raises(st.ManifestNotFound):
        list(ps.push(s, "127.0.0.1:9/library/absent:1", insecure=True))


def test_push_needs_the_token_of_a_keyed_mirror(tmp_path):
    s = st.Store(tmp_path / "s")
    manifest = make_model(s, "tiny:1", tmp_path / "src")
    with daemon(tmp_path / "mirror", api_key="k3y") as mirror:
        target = f"{mirror.url.split('//')[1]}/library/tiny:1"
        s.copy("tiny:1", target)
        with pytest.raises(RegistryError, match="401"):
            list(ps.push(s, target, insecure=True))
        assert list(ps.push(s, target, insecure=True, token="k3y"))[-1] == {"status": "success"}
        assert mirror.service.store.get("tiny:1").manifest.digests == manifest.digests


def test_push_refuses_upload_location_on_another_host(tmp_path):
    from _mirror import RawMirror

    s = st.Store(tmp_path / "s")
    make_model(s, "tiny:1", tmp_path / "src")
    with RawMirror() as reg:
        reg.route("HEAD", r"/v2/library/tiny/blobs/.*", lambda h, m: h.send_json(404, {}))
        reg.route(
            "POST",
            r"/v2/library/tiny/blobs/uploads/",
            lambda h, m: h.send_raw(202, {"Location": "http://169.254.169.254/upload", "Content-Length": "0"}),
        )
        target = f"{reg.host}/library/tiny:1"
        s.copy("tiny:1", target)
        with pytest.raises(RegistryError, match="another host"):
            list(ps.push(s, target, insecure=True))
