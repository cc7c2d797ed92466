"""Pull between two real daemons on loopback, resume after interruption, verification, concurrency, full disks."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest

import store as st
from localrt.distribution import download as dl
from localrt.distribution import pull as pl
from localrt import errors
from localrt.distribution.registry import InsufficientSpace, RegistryError

from _mirror import RawMirror, blob_bytes, daemon, env_pythonpath, make_model, model_payload

MB = 1 << 20


@pytest.fixture()
def fast(monkeypatch):
    """Small parts (so a few MB split into several ranges) and quick retries."""
    monkeypatch.setattr(dl, "PART_MIN", 1 * MB)
    monkeypatch.setattr(dl, "CHUNK", 64 << 10)
    monkeypatch.setattr(dl, "BACKOFF_S", 0.01)
    monkeypatch.setattr(dl, "PERSIST_S", 0.05)


@pytest.fixture()
def two(tmp_path, fast):
    """Daemon A (mirror, holding tiny:1) and daemon B (empty)."""
    a_store = st.Store(tmp_path / "a")
    manifest = make_model(a_store, "tiny:1", tmp_path / "src", n_bytes=5 * MB)
    with daemon(a_store.root) as a, daemon(tmp_path / "b") as b:
        yield a_store, manifest, a, b


def _api_pull(base_url: str, model: str, **body) -> list[dict]:
    with httpx.stream("POST", f"{base_url}/api/pull", json={"model": model, "insecure": True, **body}, timeout=60) as r:
        return [json.loads(line) for line in r.iter_lines() if line]


def _statuses(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        if not out or out[-1] != e.get("status"):
            out.append(e.get("status"))
    return out


def test_pull_between_daemons_and_repull_is_cache_hits(two):
    a_store, manifest, a, b = two
    host = a.url.split("//")[1]
    events = _api_pull(b.url, f"{host}/library/tiny:1")
    blobs = [layer.digest for layer in manifest.layers] + [manifest.config.digest]
    assert _statuses(events) == ["pulling manifest"] + [f"pulling {d[7:19]}" for d in blobs] + [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    for e in events:
        if e["status"].startswith("pulling ") and e["status"] != "pulling manifest":
            assert list(e) == ["status", "digest", "total", "completed"] and 0 <= e["completed"] <= e["total"]
    b_store = b.service.store
    for d in blobs:
        assert blob_bytes(b_store, d) == blob_bytes(a_store, d)
    assert b_store.get(f"{host}/library/tiny:1").manifest.digests == manifest.digests
    assert not [p for p in (b_store.root / "blobs").iterdir() if "partial" in p.name]
    again = _api_pull(b.url, f"{host}/library/tiny:1")
    pulling = [e for e in again if "digest" in e]
    assert len(pulling) == 3 and all(e["completed"] == e["total"] for e in pulling)  # nothing fetched
    r = httpx.post(f"{b.url}/api/pull", json={"model": f"{host}/library/tiny:1", "insecure": True, "stream": False})
    assert r.json() == {"status": "success"}


def test_default_registry_short_name_and_http_needs_insecure(two, tmp_path):
    a_store, manifest, a, b = two
    c = st.Store(tmp_path / "c")
    events = list(pl.pull(c, "tiny:1", default_registry=a.url))  # an explicit http:// mirror in config is allowed
    assert events[-1] == {"status": "success"} and c.get("tiny:1").manifest.digests == manifest.digests
    host = a.url.split("//")[1]
    with pytest.raises(RegistryError, match="insecure protocol http"):
        list(pl.pull(c, f"http://{host}/library/tiny:1"))
    with pytest.raises(RegistryError, match="file does not exist"):
        list(pl.pull(c, f"{host}/library/nope:1", insecure=True))
    r = httpx.post(f"{b.url}/api/pull", json={"model": f"{host}/library/nope:1", "insecure": True, "stream": False})
    assert r.status_code == 500 and "file does not exist" in r.json()["error"]
    with pytest.raises(RegistryError, match="cannot reach"):
        list(pl.pull(c, "127.0.0.1:9/library/tiny:1", insecure=True))


def test_cancel_then_resume(tmp_path, fast):
    src = st.Store(tmp_path / "a")
    make_model(src, "big:1", tmp_path / "src", n_bytes=6 * MB)
    raw, blobs = model_payload(src, "big:1")
    big = max(blobs, key=lambda d: len(blobs[d]))
    size = len(blobs[big])
    dst = st.Store(tmp_path / "b")
    with RawMirror() as mirror:
        mirror.serve_model("library/big", "1", raw, blobs, delay_s=0.02)
        name = f"{mirror.host}/library/big:1"
        t = pl.pull(dst, name, insecure=True)
        with pytest.raises(errors.Cancelled):
            for ev in t:
                if ev.get("digest") == big and ev["completed"] > size // 4:
                    t.cancel()
        done = pl.partial_done(dst, big, size)
        assert 0 < done < size and not dst.has_blob(big)
        assert mirror.max_active > 1  # a slow link got parallel range requests
        mirror.throttle = 0
        seen = len(mirror.ranges)
        events = list(pl.pull(dst, name, insecure=True))
        first = next(e for e in events if e.get("digest") == big)
        assert first["completed"] >= done  # resumed from what was on disk
        asked = sum(b - a + 1 for d, a, b in mirror.ranges[seen:] if d == big)
        assert asked == size - done  # only the missing bytes were requested
    assert blob_bytes(dst, big) == blobs[big]
    assert not [p for p in (dst.root / "blobs").iterdir() if "partial" in p.name]


def test_killed_client_resumes(tmp_path, fast):
    src = st.Store(tmp_path / "a")
    make_model(src, "big:1", tmp_path / "src", n_bytes=4 * MB)
    raw, blobs = model_payload(src, "big:1")
    big = max(blobs, key=lambda d: len(blobs[d]))
    size = len(blobs[big])
    dst = st.Store(tmp_path / "b")
    with RawMirror() as mirror:
        mirror.serve_model("library/big", "1", raw, blobs, delay_s=0.02)
        name = f"{mirror.host}/library/big:1"
        code = textwrap.dedent(f"""
            import store, localrt.distribution.pull as pl, localrt.distribution.download as dl
            dl.PART_MIN = {MB}; dl.PERSIST_S = 0.05; dl.CHUNK = 65536
            for ev in pl.pull(store.Store({str(dst.root)!r}), {name!r}, insecure=True):
                pass
        """)
        proc = subprocess.Popen([sys.executable, "-c", code], env=env_pythonpath())
        try:
            deadline = time.monotonic() + 30
            while pl.partial_done(dst, big, size) < size // 5:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        done = pl.partial_done(dst, big, size)
        assert 0 < done < size
        mirror.throttle = 0
        events = list(pl.pull(dst, name, insecure=True))
        assert next(e for e in events if e.get("digest") == big)["completed"] >= done
    assert events[-1] == {"status": "success"} and blob_bytes(dst, big) == blobs[big]


def test_dropped_connections_are_retried(tmp_path, fast):
    src = st.Store(tmp_path / "a")
    make_model(src, "big:1", tmp_path / "src", n_bytes=3 * MB)
    raw, blobs = model_payload(src, "big:1")
    big = max(blobs, key=lambda d: len(blobs[d]))
    dst = st.Store(tmp_path / "b")
    with RawMirror() as mirror:
        mirror.serve_model("library/big", "1", raw, blobs, drop_after={big: 300_000})
        events = list(pl.pull(dst, f"{mirror.host}/library/big:1", insecure=True))
    assert events[-1] == {"status": "success"} and blob_bytes(dst, big) == blobs[big]


def test_corrupt_byte_on_mirror_fails_verify_and_keeps_good_blobs(two):
    a_store, manifest, a, b = two
    tpl = manifest.layers[1].digest
    path = a_store.blob_path(tpl)
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))
    host = a.url.split("//")[1]
    events = _api_pull(b.url, f"{host}/library/tiny:1")
    assert "digest mismatch" in events[-1]["error"] and tpl in events[-1]["error"]
    b_store = b.service.store
    assert b_store.has_blob(manifest.layers[0].digest)  # the good model blob stays
    assert not b_store.has_blob(tpl)
    assert not [p for p in (b_store.root / "blobs").iterdir() if "partial" in p.name]
    assert not b_store.exists(f"{host}/library/tiny:1")


def test_concurrent_pulls_one_transfer(tmp_path, fast):
    src = st.Store(tmp_path / "a")
    make_model(src, "big:1", tmp_path / "src", n_bytes=3 * MB)
    raw, blobs = model_payload(src, "big:1")
    dst = st.Store(tmp_path / "b")
    results: list = []
    with RawMirror() as mirror:
        mirror.serve_model("library/big", "1", raw, blobs, delay_s=0.002)
        name = f"{mirror.host}/library/big:1"

        def run():
            try:
                results.append(list(pl.pull(st.Store(dst.root), name, insecure=True))[-1])
            except Exception as e:  # noqa: BLE001 - reported by the assert below
                results.append(e)

        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert results == [{"status": "success"}] * 3
    assert mirror.served == sum(len(v) for v in blobs.values())  # every byte crossed the wire once
    for d, data in blobs.items():
        assert blob_bytes(dst, d) == data


def test_preflight_free_space(two, monkeypatch, tmp_path):
    a_store, manifest, a, b = two
    c = st.Store(tmp_path / "c")
    monkeypatch.setattr(pl, "free_bytes", lambda path: 1 * MB)
    host = a.url.split("//")[1]
    with pytest.raises(InsufficientSpace, match="needs .* more bytes"):
        list(pl.pull(c, f"{host}/library/tiny:1", insecure=True))
    assert not c.list() and not any((c.root / "blobs").iterdir())


def test_disk_full_mid_pull_keeps_daemon_healthy_and_resumes(two, monkeypatch):
    a_store, manifest, a, b = two
    real = dl._write_at
    written = [0]

    def filling(fd, data, offset):
        if written[0] + len(data) > 2 * MB:
            raise OSError(errno.ENOSPC, "No space left on device")
        written[0] += len(data)
        real(fd, data, offset)

    monkeypatch.setattr(dl, "_write_at", filling)
    host = a.url.split("//")[1]
    events = _api_pull(b.url, f"{host}/library/tiny:1")
    assert "disk full" in events[-1]["error"]
    assert httpx.get(f"{b.url}/api/version").status_code == 200
    big = manifest.layers[0].digest
    assert pl.partial_done(b.service.store, big, manifest.layers[0].size) > 0
    assert not b.service.store.exists(f"{host}/library/tiny:1")
    monkeypatch.setattr(dl, "_write_at", real)
    assert _api_pull(b.url, f"{host}/library/tiny:1")[-1] == {"status": "success"}
    assert blob_bytes(b.service.store, big) == blob_bytes(a_store, big)


def test_pull_replaces_old_layers(two, tmp_path):
    a_store, manifest, a, b = two
    host = a.url.split("//")[1]
    c = st.Store(tmp_path / "c")
    list(pl.pull(c, f"{host}/library/tiny:1", insecure=True))
    newer = make_model(a_store, "tiny:1", tmp_path / "src2", n_bytes=100_000, seed=7)
    events = list(pl.pull(c, f"{host}/library/tiny:1", insecure=True))
    assert {"status": "removing unused layers"} in events
    assert not c.has_blob(manifest.layers[0].digest) and c.has_blob(newer.layers[0].digest)


def test_concurrent_pulls_across_processes_one_transfer(tmp_path, fast):
    src = st.Store(tmp_path / "a")
    make_model(src, "big:1", tmp_path / "src", n_bytes=2 * MB)
    raw, blobs = model_payload(src, "big:1")
    dst = st.Store(tmp_path / "b")
    with RawMirror() as mirror:
        mirror.serve_model("library/big", "1", raw, blobs, delay_s=0.02)
        name = f"{mirror.host}/library/big:1"
        big = max(blobs, key=lambda d: len(blobs[d]))
        code = textwrap.dedent(f"""
            import store, localrt.distribution.pull as pl, localrt.distribution.download as dl
            dl.PART_MIN = {MB}; dl.CHUNK = 65536
            print(list(pl.pull(store.Store({str(dst.root)!r}), {name!r}, insecure=True))[-1]["status"])
        """)
        proc = subprocess.Popen([sys.executable, "-c", code], env=env_pythonpath(), stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not mirror.ranges:  # the other process is downloading: this pull must wait for it, not refetch
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        mine = list(pl.pull(dst, name, insecure=True))[-1]
        out, _ = proc.communicate(timeout=60)
    assert mine == {"status": "success"} and out.strip() == "success"
    assert mirror.served == sum(len(v) for v in blobs.values())
