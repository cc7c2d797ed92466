"""A hostile model file through a real daemon (issue 12): `create` of a file whose rope.dimension_count is larger
than its head size (which used to corrupt the daemon's heap at the first request) is a 400 naming the key, a
file that slipped into the store is a 400 at load, and the daemon keeps serving a good model after both."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from _daemon_fakes import pinned_daemon
from fixtures.decoders import small, write_model
from _hostile_gguf import rewrite
from localrt.models import gguf_facts as C  # where create reads and validates a GGUF header

KEY_MESSAGE = "llama.rope.dimension_count is 96 but the head size (llama.attention.key_length) is 16"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    good = root / "good.gguf"
    write_model(good, small())
    return good, rewrite(good, root / "hostile.gguf", meta={"llama.rope.dimension_count": 96})


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with pinned_daemon(
        tmp_path_factory.mktemp("models")
    ) as srv:  # the real loader: hostile files meet the validator, not a fake
        yield srv


def _upload(srv, path) -> str:
    data = path.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = httpx.post(f"{srv.url}/api/blobs/{digest}", content=data, timeout=30)
    assert r.status_code in (200, 201), r.text
    return digest


def _create(srv, name: str, digest: str, stream: bool = False) -> httpx.Response:
    return httpx.post(
        srv.url + "/api/create", json={"model": name, "files": {"m.gguf": digest}, "stream": stream}, timeout=60
    )


def _generate(srv, name: str) -> httpx.Response:
    body = {"model": name, "prompt": "the", "raw": True, "stream": False, "options": {"num_predict": 2, "num_ctx": 32}}
    return httpx.post(srv.url + "/api/generate", json=body, timeout=120)


def test_create_of_a_hostile_file_is_a_400_naming_the_key(daemon, files):
    good, hostile = files
    digest = _upload(daemon, hostile)
    r = _create(daemon, "hostile", digest)
    assert r.status_code == 400, r.text
    assert KEY_MESSAGE in r.json()["error"]
    # a failed create removes the upload it was given (nothing unreferenced is left behind): clients upload again
    assert httpx.head(daemon.url + f"/api/blobs/{digest}").status_code == 404
    digest = _upload(daemon, hostile)
    streamed = _create(daemon, "hostile", digest, stream=True)  # after the first progress line: an error line
    lines = [json.loads(line) for line in streamed.text.splitlines()]
    assert KEY_MESSAGE in lines[-1]["error"] and not any(x.get("status") == "success" for x in lines)
    assert "hostile" not in {m["name"].split(":")[0] for m in httpx.get(daemon.url + "/api/tags").json()["models"]}
    # The daemon is fine: a good model is created and answers.
    assert _create(daemon, "good", _upload(daemon, good)).status_code == 200
    r = _generate(daemon, "good")
    assert r.status_code == 200 and r.json()["done"] is True, r.text


def test_a_hostile_file_already_in_the_store_is_a_400_at_load(daemon, files, monkeypatch):
    _, hostile = files
    monkeypatch.setattr(C, "_model_problem", lambda *a: None)  # as if stored by an older version without the check
    assert _create(daemon, "slipped", _upload(daemon, hostile)).status_code == 200
    monkeypatch.undo()
    for _ in range(2):  # refused every time, not once
        r = _generate(daemon, "slipped")
        assert r.status_code == 400, r.text
        assert KEY_MESSAGE in r.json()["error"]
    assert _create(daemon, "good", _upload(daemon, files[0])).status_code == 200
    r = _generate(daemon, "good")
    assert r.status_code == 200 and r.json()["done"] is True, r.text
