"""Store: blobs, manifests, list/copy/delete, verify/prune (read-only roots, the Ollama layout and hostile names:
test_store_compat.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import store as st
from store import manifests as mt
from _testpaths import REPO

ROOT = REPO


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tree(path: Path) -> dict:
    """Every file and directory under `path` with its size and mtime, to prove nothing changed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            s = p.stat()
            out[str(p.relative_to(path))] = (s.st_size, s.st_mtime_ns)
    return out


def make_model(s: st.Store, name: str, model: bytes = b"GGUF-weights", system: str | None = None) -> mt.Manifest:
    layers = [mt.Layer(mt.MODEL, *_put(s, model))]
    if system is not None:
        layers.append(mt.Layer(mt.SYSTEM, *_put(s, system.encode())))
    cfg = mt.config_blob(model_family="llama", model_type="1M", file_type="F32", diff_ids=[x.digest for x in layers])
    m = mt.build(mt.Layer(mt.CONFIG_MEDIA_TYPE, *_put(s, cfg)), layers)
    s.put_manifest(name, m)
    return m


def _put(s: st.Store, data: bytes) -> tuple[str, int]:
    info = s.write_blob(data)
    return info.digest, info.size


class CountingStream(io.RawIOBase):
    def __init__(self, data: bytes, delay: float = 0.0):
        self.buf = io.BytesIO(data)
        self.reads = 0
        self.delay = delay

    def readable(self):
        return True

    def read(self, n=-1):
        self.reads += 1
        if self.delay:
            time.sleep(self.delay)
        return self.buf.read(n)


# ----- blobs --------------------------------------------------------------------------------------------


def test_write_blob_layout_and_atomicity(tmp_path):
    s = st.Store(tmp_path)
    info = s.write_blob(b"hello")
    assert info == st.BlobInfo(sha(b"hello"), 5, True)
    path = tmp_path / "blobs" / ("sha256-" + sha(b"hello")[7:])
    assert s.blob_path(info.digest) == path and path.read_bytes() == b"hello"
    assert ":" not in path.name
    assert s.write_blob(io.BytesIO(b"hello")).created is False
    assert [p.name for p in (tmp_path / "blobs").iterdir()] == [path.name]  # no temp file left


def test_expected_digest_skips_reading_when_present(tmp_path):
    s = st.Store(tmp_path)
    s.write_blob(b"data")
    stream = CountingStream(b"data")
    info = s.write_blob(stream, expected_digest=sha(b"data"))
    assert info.created is False and stream.reads == 0
    assert s.write_blob(b"x", expected_digest="sha256-" + sha(b"x")[7:]).digest == sha(b"x")


def test_digest_and_size_mismatch_store_nothing(tmp_path):
    s = st.Store(tmp_path)
    with pytest.raises(st.DigestMismatch, match="digest mismatch"):
        s.write_blob(b"abc", expected_digest=sha(b"abd"))
    with pytest.raises(st.SizeMismatch):
        s.write_blob(b"abc", expected_size=4)
    assert list((tmp_path / "blobs").iterdir()) == []


def test_interrupted_write_leaves_no_partial_blob(tmp_path):
    class Broken(io.RawIOBase):
        def readable(self):
            return True

        def read(self, n=-1):
            if getattr(self, "done", False):
                raise OSError("disk went away")
            self.done = True
            return b"x" * 1000

    s = st.Store(tmp_path)
    with pytest.raises(OSError):
        s.write_blob(Broken())
    assert list((tmp_path / "blobs").iterdir()) == []


def test_two_threads_same_blob_one_write(tmp_path):
    s = st.Store(tmp_path)
    data = os.urandom(1 << 16)
    streams = [CountingStream(data, delay=0.01) for _ in range(2)]
    results = [None, None]

    def run(i):
        results[i] = s.write_blob(streams[i], expected_digest=sha(data))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.created for r in results) == [False, True]
    assert sorted(x.reads > 0 for x in streams) == [False, True]  # the second writer read nothing
    assert s.blob_path(sha(data)).read_bytes() == data


_WRITER = """
import sys, time, io
sys.path.insert(0, {root!r})
import store
class Slow(io.RawIOBase):
    def __init__(s, d): s.b = io.BytesIO(d)
    def readable(s): return True
    def read(s, n=-1):
        time.sleep(0.02); return s.b.read(65536)
data = bytes(range(256)) * 4096
info = store.Store({path!r}).write_blob(Slow(data), expected_digest={digest!r})
print(info.created)
"""


def test_two_processes_same_blob_one_write(tmp_path):
    data = bytes(range(256)) * 4096
    code = _WRITER.format(root=str(ROOT), path=str(tmp_path), digest=sha(data))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == ["False", "True"]
    assert st.Store(tmp_path).blob_path(sha(data)).read_bytes() == data


def test_import_file_and_adopt(tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(300_000))
    s = st.Store(tmp_path / "models")
    seen = []
    info = s.import_file(src, progress=seen.append)
    assert info.digest == sha(src.read_bytes()) and seen[-1] == 300_000
    tmp = s.new_temp_file()
    tmp.write_bytes(b"quantized")
    out = s.adopt_file(tmp)
    assert out.created and not tmp.exists() and s.blob_path(out.digest).read_bytes() == b"quantized"
    with pytest.raises(st.UnsafePath):
        outside = tmp_path / "elsewhere"
        outside.write_bytes(b"x")
        s.adopt_file(outside)


# ----- manifests ----------------------------------------------------------------------------------------


def test_put_manifest_layout_list_and_digest(tmp_path):
    s = st.Store(tmp_path)
    m = make_model(s, "m:7b", system="be nice")
    path = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "m" / "7b"
    raw = path.read_bytes()
    assert raw.endswith(b"}\n") and b" " not in raw.split(b"\n")[0]
    obj = json.loads(raw)
    assert list(obj) == ["schemaVersion", "mediaType", "config", "layers"]
    assert obj["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert obj["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"
    assert [x["mediaType"] for x in obj["layers"]] == [mt.MODEL, mt.SYSTEM]
    (entry,) = s.list()
    assert entry.name.display == "m:7b" and entry.size == m.size
    assert entry.digest == hashlib.sha256(raw).hexdigest()
    assert abs(entry.modified_at.timestamp() - path.stat().st_mtime) < 1e-3
    cfg = json.loads(s.blob_path(m.config.digest).read_bytes())
    assert cfg["model_format"] == "gguf" and cfg["rootfs"]["diff_ids"] == [x.digest for x in m.layers]


def test_case_insensitive_lookup_reuses_existing_path(tmp_path):
    s = st.Store(tmp_path)
    make_model(s, "MyModel:Tag")
    assert s.get("mymodel:tag").name.display == "MyModel:Tag"
    make_model(s, "MYMODEL:TAG", model=b"other")
    assert len(s.list()) == 1
    assert s.manifest("mymodel:tag").layers[0].digest == sha(b"other")


def test_put_manifest_needs_every_blob(tmp_path):
    s = st.Store(tmp_path)
    missing = mt.Layer(mt.MODEL, sha(b"never stored"), 12)
    cfg = mt.Layer(mt.CONFIG_MEDIA_TYPE, *_put(s, b"{}"))
    with pytest.raises(st.BlobNotFound):
        s.put_manifest("m", mt.build(cfg, [missing]))
    assert not (tmp_path / "manifests").exists()


def test_copy_shares_blobs_and_keeps_bytes(tmp_path):
    s = st.Store(tmp_path)
    make_model(s, "a")
    s.copy("a", "ns/b:x")
    a, b = s.get("a"), s.get("ns/b:x")
    assert a.path.read_bytes() == b.path.read_bytes() and a.digest == b.digest
    assert {e.name.display for e in s.list()} == {"a:latest", "ns/b:x"}
    with pytest.raises(st.ManifestNotFound):
        s.copy("nope", "c")


def test_delete_keeps_shared_layers(tmp_path):
    s = st.Store(tmp_path)
    m1 = make_model(s, "one", system="first")
    m2 = make_model(s, "two", system="second")  # same weights, different system
    blobs_before = set(os.listdir(tmp_path / "blobs"))
    removed = s.delete("one")
    assert sha(b"first") in removed and m1.layers[0].digest not in removed
    assert s.has_blob(m2.layers[0].digest) and not s.has_blob(sha(b"first"))
    assert not (tmp_path / "manifests" / "registry.ollama.ai" / "library" / "one").exists()
    s.delete("two")
    assert os.listdir(tmp_path / "blobs") == [] and blobs_before
    assert not (tmp_path / "manifests" / "registry.ollama.ai").exists()
    with pytest.raises(st.ManifestNotFound, match="'two:latest' not found"):
        s.delete("two")


def test_model_record(tmp_path):
    s = st.Store(tmp_path)
    layers = [
        mt.Layer(mt.MODEL, *_put(s, b"weights"), "base:1b"),
        mt.Layer(mt.ADAPTER, *_put(s, b"lora")),
        mt.Layer(mt.PROMPT, *_put(s, b"{{ .Prompt }}")),
        mt.Layer(mt.SYSTEM, *_put(s, b"sys")),
        mt.Layer(mt.PARAMS, *_put(s, b'{"stop":["x"],"temperature":0.5}')),
        mt.Layer(mt.MESSAGES, *_put(s, b'[{"role":"user","content":"hi"}]')),
        mt.Layer(mt.LICENSE, *_put(s, b"L1")),
        mt.Layer(mt.LICENSE, *_put(s, b"L2")),
    ]
    cfg = mt.config_blob(model_family="llama", model_type="7B", file_type="Q4_0")
    s.put_manifest("r", mt.build(mt.Layer(mt.CONFIG_MEDIA_TYPE, *_put(s, cfg)), layers))
    r = s.model_record("r")
    assert r.model_path.read_bytes() == b"weights" and r.adapter_paths[0].read_bytes() == b"lora"
    assert (r.template, r.system, r.licenses) == ("{{ .Prompt }}", "sys", ("L1", "L2"))
    assert r.params == {"stop": ["x"], "temperature": 0.5} and r.messages == [{"role": "user", "content": "hi"}]
    assert r.details == {
        "parent_model": "base:1b",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "7B",
        "quantization_level": "Q4_0",
    }


def test_model_record_detects_size_mismatch(tmp_path):
    s = st.Store(tmp_path)
    m = make_model(s, "m")
    blob = s.blob_path(m.layers[0].digest)
    blob.write_bytes(blob.read_bytes() + b"!")
    with pytest.raises(st.CorruptBlob):
        s.model_record("m")


# ----- verify / prune -----------------------------------------------------------------------------------


def test_verify_and_prune(tmp_path):
    s = st.Store(tmp_path)
    m = make_model(s, "m", system="s")
    stray = s.write_blob(b"unreferenced").digest
    blob = s.blob_path(m.layers[0].digest)
    blob.write_bytes(b"X" + blob.read_bytes()[1:])  # one byte flipped
    temp = tmp_path / "blobs" / ".tmp-dead.partial"
    temp.write_bytes(b"half")
    os.utime(temp, (time.time() - 3600, time.time() - 3600))
    r = s.verify()
    assert r.corrupt == [m.layers[0].digest] and r.unreferenced == [stray] and not r.ok
    assert r.temp_files == [str(temp)]
    kept = s.prune(grace_s=600)
    assert kept.removed == [str(temp)] and s.has_blob(stray)  # too young to collect
    r = s.prune(grace_s=0)
    assert r.removed == [stray] and s.has_blob(m.layers[0].digest)  # corrupt but referenced: reported only
    r = s.prune(grace_s=0, remove_corrupt=True)
    assert r.removed == [m.layers[0].digest]
    assert s.verify().missing == {"m:latest": [m.layers[0].digest]}


def test_verify_reports_broken_manifest(tmp_path):
    s = st.Store(tmp_path)
    make_model(s, "good")
    bad = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "bad" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schemaVersion":2,"config":{"mediaType":"x","digest":"sha256:../../etc","size":1},"layers":[]}')
    assert [e.name.display for e in s.list()] == ["good:latest"]
    assert str(bad) in s.verify().invalid_manifests
    with pytest.raises(st.InvalidManifest):
        s.get("bad")


@pytest.mark.parametrize(
    "body, why",
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"schemaVersion":1,"layers":[]}', "schemaVersion"),
        (
            b'{"schemaVersion":2,"config":{"mediaType":"c","digest":"sha256:'
            + b"a" * 64
            + b'","size":-1},"layers":[]}',
            "size",
        ),
        (
            b'{"schemaVersion":2,"config":{"mediaType":"c","digest":"sha256:'
            + b"a" * 64
            + b'","size":true},"layers":[]}',
            "size",
        ),
        (
            b'{"schemaVersion":2,"config":{"mediaType":"c","digest":"sha256:' + b"A" * 64 + b'","size":1},"layers":[]}',
            "digest",
        ),
        (
            b'{"schemaVersion":2,"config":{"mediaType":"c","digest":"sha256:' + b"a" * 64 + b'","size":1},"layers":{}}',
            "layers",
        ),
        (
            b'{"schemaVersion":2,"config":{"mediaType":"c","digest":"sha256:'
            + b"a" * 64
            + b'","size":1},"layers":['
            + b",".join([b"{}"] * 5000)
            + b"]}",
            "layers",
        ),
        (b'{"schemaVersion":2,"x":' + b"[" * 100000 + b"]" * 100000 + b"}", "nested too deeply"),
    ],
)
def test_hostile_manifest_bytes(body, why):
    with pytest.raises(st.InvalidManifest, match=why):
        mt.parse(body, "x")
