"""Store, continued: read-only roots, the Ollama models directory as is, hostile names and digests that touch no
file, list details and legacy blob names."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import store as st
from store import manifests as mt
from test_store import make_model, sha, tree

# ----- read-only roots ----------------------------------------------------------------------------------


def test_readonly_root_is_read_never_written(tmp_path):
    shared = tmp_path / "shared"
    make_model(st.Store(shared), "team/model:1", system="shared system")
    st.Store(shared).write_blob(b"orphan in shared store")
    before = tree(shared)
    s = st.Store(tmp_path / "mine", readonly_roots=[shared])
    assert [e.name.display for e in s.list()] == ["team/model:1"] and s.list()[0].readonly
    assert s.model_record("team/model:1").system == "shared system"
    with pytest.raises(st.ReadOnlyStore):
        s.delete("team/model:1")
    s.copy("team/model:1", "mine")  # a manifest in the writable root; blobs stay shared
    assert s.model_record("mine").system == "shared system"
    r = s.prune(grace_s=0)
    assert r.unreferenced == [] and r.removed == []
    s.verify()
    assert tree(shared) == before
    assert not (shared / ".locks").exists() or tree(shared) == before


def test_writable_model_shadows_readonly_one(tmp_path):
    shared = tmp_path / "shared"
    make_model(st.Store(shared), "m", system="ro")
    s = st.Store(tmp_path / "mine", readonly_roots=[shared])
    make_model(s, "m", system="rw")
    (entry,) = s.list()
    assert not entry.readonly and s.model_record("m").system == "rw"


# ----- Ollama compatibility -----------------------------------------------------------------------------


def write_ollama_style_dir(root: Path) -> dict:
    """A models directory as Ollama writes it (Go-marshalled manifest, extra layer keys, legacy prompt layer,
    an old config without model_* keys)."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> dict:
        d = sha(data)
        (blobs / ("sha256-" + d[7:])).write_bytes(data)
        return {"digest": d, "size": len(data)}

    cfg = blob(b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}')
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **cfg},
        "layers": [
            {"mediaType": mt.MODEL, **blob(b"GGUF..."), "from": "registry.ollama.ai/library/base:latest", "name": "x"},
            {"mediaType": mt.PROMPT, **blob(b"[INST] {{ .Prompt }} [/INST]")},
            {"mediaType": mt.PARAMS, **blob(b'{"num_ctx":4096,"stop":["[INST]"]}')},
        ],
    }
    raw = json.dumps(manifest, separators=(",", ":")).encode()
    path = root / "manifests" / "registry.ollama.ai" / "library" / "mistral" / "7b"
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    return {"raw": raw, "path": path}


def test_reads_ollama_models_dir_as_is(tmp_path):
    info = write_ollama_style_dir(tmp_path)
    s = st.Store(tmp_path)
    (entry,) = s.list()
    assert entry.name.display == "mistral:7b" and entry.digest == hashlib.sha256(info["raw"]).hexdigest()
    r = s.model_record("Mistral:7B")
    assert r.template == "[INST] {{ .Prompt }} [/INST]" and r.params["num_ctx"] == 4096
    assert r.details["format"] == "" and r.details["parent_model"] == "registry.ollama.ai/library/base:latest"
    # Unknown layer keys survive a round trip (a copy through our Manifest type loses nothing).
    assert json.loads(entry.manifest.to_bytes()) == json.loads(info["raw"])
    assert s.verify().ok


def test_our_dir_has_ollama_layout(tmp_path):
    """What Ollama's reader relies on: manifests at exactly 4 levels, blobs named sha256-<hex> whose bytes
    hash to their name, every referenced digest present, config with the model_* keys."""
    s = st.Store(tmp_path)
    make_model(s, "user/thing:v1", system="x")
    manifests = [p for p in (tmp_path / "manifests").glob("*/*/*/*") if p.is_file()]
    assert [p.relative_to(tmp_path / "manifests").parts for p in manifests] == [
        ("registry.ollama.ai", "user", "thing", "v1")
    ]
    m = json.loads(manifests[0].read_bytes())
    for layer in [m["config"], *m["layers"]]:
        f = tmp_path / "blobs" / layer["digest"].replace(":", "-")
        assert sha(f.read_bytes()) == layer["digest"] and f.stat().st_size == layer["size"]
        assert layer["mediaType"].startswith("application/vnd.")
    cfg = json.loads((tmp_path / "blobs" / m["config"]["digest"].replace(":", "-")).read_bytes())
    assert {"model_format", "model_family", "model_families", "model_type", "file_type", "rootfs"} <= set(cfg)
    assert all(n.startswith("sha256-") for n in os.listdir(tmp_path / "blobs"))


# ----- hostile names and digests touch nothing ----------------------------------------------------------

HOSTILE_NAMES = [
    "../../etc/passwd",
    "..",
    "/etc/passwd",
    "%2e%2e/%2e%2e/x",
    "a\\..\\b",
    "m\x00",
    "CON",
    "nul:latest",
    "x" * 400,
    "h/n/../m",
    "C:/Windows/m",
]
HOSTILE_DIGESTS = [
    "sha256:../../../etc/passwd",
    "sha256:" + "A" * 64,
    "sha256:abc",
    "md5:" + "a" * 32,
    "../blobs/x",
    "sha256:" + "a" * 64 + "/../x",
    "sha256-" + "a" * 63,
    "",
]


@pytest.mark.parametrize("bad", HOSTILE_NAMES)
def test_hostile_names_touch_no_file(tmp_path, bad):
    s = st.Store(tmp_path / "models")
    make_model(s, "ok")
    before = tree(tmp_path)
    calls = [
        lambda: s.get(bad),
        lambda: s.exists(bad),
        lambda: s.delete(bad),
        lambda: s.copy("ok", bad),
        lambda: s.copy(bad, "ok2"),
        lambda: s.model_record(bad),
        lambda: s.put_manifest(bad, s.manifest("ok")),
    ]
    for call in calls:
        with pytest.raises(st.InvalidName):
            call()
    assert tree(tmp_path) == before


@pytest.mark.parametrize("bad", HOSTILE_DIGESTS)
def test_hostile_digests_touch_no_file(tmp_path, bad):
    s = st.Store(tmp_path / "models")
    make_model(s, "ok")
    before = tree(tmp_path)
    for call in [
        lambda: s.blob_path(bad),
        lambda: s.has_blob(bad),
        lambda: s.write_blob(b"x", expected_digest=bad),
        lambda: s.read_blob(bad),
    ]:
        with pytest.raises(st.InvalidDigest):
            call()
    assert tree(tmp_path) == before


def test_details_for_list_and_broken_manifest_is_logged(tmp_path, caplog):
    s = st.Store(tmp_path)
    make_model(s, "m")
    (entry,) = s.list()
    assert s.details(entry) == {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "1M",
        "quantization_level": "F32",
    }
    bad = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{")
    with caplog.at_level("WARNING"):
        assert [e.name.display for e in s.list()] == ["m:latest"]
    assert "broken" in caplog.text


@pytest.mark.skipif(os.name != "posix", reason="':' cannot appear in Windows file names")
def test_legacy_colon_blob_names_are_read_and_migrated(tmp_path):
    write_ollama_style_dir(tmp_path)
    blobs = tmp_path / "blobs"
    for p in list(blobs.iterdir()):
        p.rename(blobs / p.name.replace("sha256-", "sha256:"))  # as very old Ollama versions wrote them
    s = st.Store(tmp_path)
    assert s.model_record("mistral:7b").template == "[INST] {{ .Prompt }} [/INST]"
    assert s.verify().ok and s.verify().unreferenced == []
    r = s.prune(grace_s=0)
    assert len(r.renamed) == 4 and r.removed == []
    assert all(n.startswith("sha256-") for n in os.listdir(blobs))
    assert s.model_record("mistral:7b").params["num_ctx"] == 4096
