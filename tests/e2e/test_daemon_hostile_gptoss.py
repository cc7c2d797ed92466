"""Hostile gpt-oss files through a real daemon (issue 44's bad input): MXFP4 expert blocks of a wrong size, and
metadata whose experts, sinks or window contradict the tensors. `create` refuses each with a 400 naming the tensor or
key; a file that is in the store anyway (stored by an older version without the check, or changed on disk since) is
a 400 naming it on /api/chat and /v1/chat/completions, every time; and the daemon keeps answering on a good gpt-oss
file. The loader-level checks are in test_gptoss.py."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
from pathlib import Path

import httpx
import numpy as np
import pytest

from fixtures import decoders
from _daemon_fakes import pinned_daemon
from _hostile_gguf import rewrite
from localrt.models import gguf_facts as C  # where create reads and validates a GGUF header

CASE = decoders.CASES["gpt-oss"]  # 4 heads, 4 experts of 32 (MXFP4: one block a row), a window of 5
DOWN = "blk.1.ffn_down_exps.weight"  # numpy shape (n_expert 4, n_embd 64, n_ff_exp 32): ggml ne (32, 64, 4)
# variant -> what its error says (a regex), naming the tensor or the key
PROBLEMS = {
    "blocks": f"tensor '{re.escape(DOWN)}' .*row length 48 is not a multiple of the MXFP4 block size 32",
    "rows": (
        rf"tensor '{re.escape(DOWN)}' has shape \(4, 32, 64\) but the metadata gives \(4, 64, 32\) "
        r"\(gpt-oss\.embedding_length is 64; gpt-oss\.expert_feed_forward_length is 32\)"
    ),
    "experts": r"ffn_gate_exps\.weight' has shape .*gpt-oss\.expert_feed_forward_length is 16",
    "sinks": r"blk\.1\.attn_sinks\.weight.*gpt-oss\.attention\.head_count is 4",
    "window": r"gpt-oss\.attention\.sliding_window is 0; it must be at least 1",
}
MESSAGES = [{"role": "user", "content": "hi"}]
# One worker runs the module: its daemon starts, and compiles the MXFP4 kernels cold, once rather than per worker.
pytestmark = pytest.mark.xdist_group("gptoss-hostile-daemon")


def redim(src: Path, dst: Path, name: str, ne: tuple) -> Path:
    """dst = src with tensor `name`'s dimensions (ggml order) set to ne in its header, nothing else changed: a
    header the writer would refuse to write, as a hostile file carries it."""
    data = bytearray(src.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", data, at)
    assert n_dims == len(ne)
    struct.pack_into(f"<{n_dims}Q", data, at + 4, *ne)
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("files")
    good = decoders.write(root / "good.gguf", CASE, decoders.MXFP4)
    sinks = np.zeros(CASE.n_head + 1, np.float32)
    return {
        "good": good,
        # a row of 48 elements: one and a half 32-element MXFP4 blocks
        "blocks": redim(good, root / "blocks.gguf", DOWN, (48, 64, 4)),
        # the same bytes as (64, 32, 4): whole blocks, but the expert's rows and columns swapped against the metadata
        "rows": redim(good, root / "rows.gguf", DOWN, (64, 32, 4)),
        "experts": rewrite(good, root / "experts.gguf", meta={"gpt-oss.expert_feed_forward_length": 16}),
        "sinks": rewrite(
            good,
            root / "sinks.gguf",
            drop_tensors=("blk.1.attn_sinks.weight",),
            add_tensors={"blk.1.attn_sinks.weight": sinks},
        ),
        "window": rewrite(good, root / "window.gguf", meta={"gpt-oss.attention.sliding_window": 0}),
    }


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with pinned_daemon(tmp_path_factory.mktemp("models")) as srv:  # the real loader: the files meet the validator
        yield srv


def _upload(srv, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = httpx.post(f"{srv.url}/api/blobs/{digest}", content=data, timeout=30)
    assert r.status_code in (200, 201), r.text
    return digest


def _create(srv, name: str, digest: str) -> httpx.Response:
    return httpx.post(
        srv.url + "/api/create", json={"model": name, "files": {"m.gguf": digest}, "stream": False}, timeout=60
    )


def _chats(srv, name: str) -> tuple[httpx.Response, httpx.Response]:
    """(/api/chat, /v1/chat/completions) on model `name`."""
    native = httpx.post(
        srv.url + "/api/chat",
        json={"model": name, "messages": MESSAGES, "stream": False, "options": {"num_predict": 2, "num_ctx": 64}},
        timeout=120,
    )
    v1 = httpx.post(
        srv.url + "/v1/chat/completions", json={"model": name, "messages": MESSAGES, "max_tokens": 2}, timeout=120
    )
    return native, v1


def _still_serving(srv, files) -> None:
    if "good" not in {m["name"].split(":")[0] for m in httpx.get(srv.url + "/api/tags").json()["models"]}:
        assert _create(srv, "good", _upload(srv, files["good"].read_bytes())).status_code == 200
    native, v1 = _chats(srv, "good")
    assert native.status_code == 200 and native.json()["done"] is True, native.text
    assert v1.status_code == 200 and v1.json()["choices"][0]["finish_reason"] == "length", v1.text


@pytest.mark.parametrize("variant", list(PROBLEMS))
def test_create_of_a_hostile_gpt_oss_file_is_a_400_naming_the_problem(daemon, files, variant):
    r = _create(daemon, f"hostile-{variant}", _upload(daemon, files[variant].read_bytes()))
    assert r.status_code == 400, r.text
    assert re.search(PROBLEMS[variant], r.json()["error"]), r.json()["error"]
    names = {m["name"].split(":")[0] for m in httpx.get(daemon.url + "/api/tags").json()["models"]}
    assert f"hostile-{variant}" not in names
    _still_serving(daemon, files)


@pytest.mark.parametrize("variant", ["rows", "experts", "sinks", "window"])
def test_a_contradicting_gpt_oss_file_in_the_store_is_a_400_on_chat(daemon, files, variant, monkeypatch):
    monkeypatch.setattr(C, "_model_problem", lambda *a: None)  # as if stored by an older version without the check
    assert _create(daemon, f"slipped-{variant}", _upload(daemon, files[variant].read_bytes())).status_code == 200
    monkeypatch.undo()
    for _ in range(2):  # refused every time, not once
        native, v1 = _chats(daemon, f"slipped-{variant}")
        assert native.status_code == 400, native.text
        assert re.search(PROBLEMS[variant], native.json()["error"]), native.text
        assert v1.status_code == 400, v1.text
        assert re.search(PROBLEMS[variant], v1.json()["error"]["message"]), v1.text
    _still_serving(daemon, files)


def test_mxfp4_blocks_of_a_wrong_size_in_the_store_are_a_400_on_chat(daemon, files, tmp_path):
    """A stored file whose header changed on disk after create checked it: the expert's row length is rewritten to
    48 in place (same length, no other byte changed); the loader's reader refuses it at the first request."""
    other = rewrite(files["good"], tmp_path / "other.gguf", meta={"general.name": "to be changed"})  # its own blob
    data = other.read_bytes()
    digest = _upload(daemon, data)
    assert _create(daemon, "changed", digest).status_code == 200
    blob = Path(daemon.service.config.models_dir) / "blobs" / digest.replace(":", "-")
    bad = redim(other, tmp_path / "bad.gguf", DOWN, (48, 64, 4)).read_bytes()
    assert blob.read_bytes() == data and len(bad) == len(data)
    os.chmod(blob, stat.S_IMODE(blob.stat().st_mode) | stat.S_IWUSR)
    blob.write_bytes(bad)
    for _ in range(2):
        native, v1 = _chats(daemon, "changed")
        assert native.status_code == 400, native.text
        assert re.search(PROBLEMS["blocks"], native.json()["error"]), native.text
        assert v1.status_code == 400 and re.search(PROBLEMS["blocks"], v1.json()["error"]["message"]), v1.text
    _still_serving(daemon, files)
