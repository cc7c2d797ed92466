"""A mirror that lies (pain_points 8 item 19): every answer is a clear error and nothing lands outside the store."""

from __future__ import annotations

import gzip
import json
import re

import pytest

import store as st
from localrt.distribution import download as dl
from localrt.distribution import pull as pl
from localrt.distribution.registry import BlobMismatch, InsufficientSpace, MirrorError, RegistryError
from store import manifests as mf

from _mirror import RawMirror, sha, tree

BLOB = bytes(range(256)) * 64  # 16 KiB
CONFIG = b'{"model_format":"gguf"}'
REPO = "library/evil"
BLOB_PATH = rf"/v2/{REPO}/blobs/(sha256:[0-9a-f]{{64}})"


def manifest_bytes(layers=None, config=None) -> bytes:
    layers = layers if layers is not None else [{"mediaType": mf.MODEL, "digest": sha(BLOB), "size": len(BLOB)}]
    config = config or {"mediaType": mf.CONFIG_MEDIA_TYPE, "digest": sha(CONFIG), "size": len(CONFIG)}
    return json.dumps(
        {"schemaVersion": 2, "mediaType": mf.MANIFEST_MEDIA_TYPE, "config": config, "layers": layers}
    ).encode()


@pytest.fixture()
def world(tmp_path, monkeypatch):
    monkeypatch.setattr(dl, "RETRIES", 2)
    monkeypatch.setattr(dl, "BACKOFF_S", 0.01)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "sentinel").write_text("keep")
    s = st.Store(tmp_path / "store")
    with RawMirror() as mirror:
        yield s, mirror, tmp_path


def serve_manifest(mirror: RawMirror, body: bytes, headers: dict | None = None) -> None:
    def h(handler, m):
        handler.send_raw(
            200, {"Content-Type": mf.MANIFEST_MEDIA_TYPE, "Content-Length": str(len(body)), **(headers or {})}, body
        )

    mirror.route("GET", rf"/v2/{REPO}/manifests/1", h)


def serve_blob(mirror: RawMirror, fn) -> None:
    """`fn(handler, digest)` answers the model blob; the config blob is served honestly."""

    def h(handler, m):
        if m.group(1) == sha(CONFIG):
            handler.send_raw(200, {"Content-Length": str(len(CONFIG))}, CONFIG)
        else:
            fn(handler, m.group(1))

    mirror.route("GET", BLOB_PATH, h)


def outcome(s: st.Store, mirror: RawMirror, tmp_path) -> None:
    """Run the pull; the caller wraps it in pytest.raises. Then nothing outside the store, no model registered."""
    try:
        list(pl.pull(s, f"{mirror.host}/{REPO}:1", insecure=True))
    finally:
        assert [p for p in tree(tmp_path) if not p.startswith("store")] == ["outside", "outside/sentinel"]
        assert not s.list()
        assert not s.has_blob(sha(BLOB)) or s.blob_path(sha(BLOB)).read_bytes() == BLOB


@pytest.mark.parametrize(
    "layers, match",
    [
        ([{"mediaType": mf.MODEL, "digest": "sha256:../../../../etc/passwd", "size": 4}], "is not sha256"),
        ([{"mediaType": mf.MODEL, "digest": "sha256-" + "a" * 64, "size": 4}], "is not sha256"),
        ([{"mediaType": mf.MODEL, "digest": sha(BLOB), "size": -5}], "invalid size"),
        ([{"mediaType": mf.MODEL, "digest": sha(BLOB), "size": "16384"}], "invalid size"),
        ([{"mediaType": mf.MODEL, "digest": sha(BLOB), "size": True}], "invalid size"),
        ([{"mediaType": mf.MODEL, "digest": sha(b"%d" % i), "size": 1} for i in range(5000)], "layers"),
        (
            [
                {"mediaType": mf.MODEL, "digest": sha(BLOB), "size": 1},
                {"mediaType": mf.MODEL, "digest": sha(BLOB), "size": 2},
            ],
            "two different sizes",
        ),
    ],
)
def test_bad_manifests(world, layers, match):
    s, mirror, tmp_path = world
    serve_manifest(mirror, manifest_bytes(layers))
    with pytest.raises(MirrorError, match=match):
        outcome(s, mirror, tmp_path)


def test_manifest_too_big_html_and_lying_digest(world):
    s, mirror, tmp_path = world

    def endless(handler, m):  # claims a million layers: 150 MB it never finishes sending
        handler.send_raw(200, {"Content-Length": str(150_000_000)})
        layer = json.dumps({"mediaType": mf.MODEL, "digest": sha(BLOB), "size": 1}).encode() + b","
        handler.wfile.write(b'{"schemaVersion":2,"layers":[')
        for _ in range(1_000_000):
            handler.wfile.write(layer * 100)

    mirror.route("GET", rf"/v2/{REPO}/manifests/1", endless)
    with pytest.raises(MirrorError, match="larger than"):
        outcome(s, mirror, tmp_path)
    mirror.routes.clear()
    serve_manifest(mirror, b"<html><body>Blocked by proxy</body></html>")
    with pytest.raises(MirrorError, match="not JSON"):
        outcome(s, mirror, tmp_path)
    mirror.routes.clear()
    serve_manifest(mirror, manifest_bytes(), {"Docker-Content-Digest": sha(b"other")})
    with pytest.raises(MirrorError, match="Docker-Content-Digest"):
        outcome(s, mirror, tmp_path)


def test_huge_declared_size_fails_preflight(world):
    s, mirror, tmp_path = world
    serve_manifest(mirror, manifest_bytes([{"mediaType": mf.MODEL, "digest": sha(BLOB), "size": 1 << 50}]))
    with pytest.raises(InsufficientSpace, match="needs"):
        outcome(s, mirror, tmp_path)


def _ok_headers(handler, length: int | None, extra: dict | None = None) -> dict:
    h = {"Content-Type": "application/octet-stream", **(extra or {})}
    rng = handler.headers.get("Range")
    if length is not None:
        h["Content-Length"] = str(length)
    if rng:
        a, b = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", rng).groups())
        h["Content-Range"] = f"bytes {a}-{b}/{len(BLOB)}"
    return h


def longer(handler, digest):
    handler.send_raw(206, _ok_headers(handler, None, {"Connection": "close"}), BLOB + b"extra bytes")
    handler.close_connection = True


def endless(handler, digest):
    handler.send_raw(206, _ok_headers(handler, None, {"Connection": "close"}))
    handler.close_connection = True
    while True:
        handler.wfile.write(BLOB)


def shorter(handler, digest):
    a, b = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", handler.headers["Range"]).groups())
    handler.send_raw(206, _ok_headers(handler, b - a + 1))  # declares the range, sends nothing, hangs up
    handler.close_connection = True


def zero(handler, digest):
    handler.send_raw(206, _ok_headers(handler, 0))


def gzipped(handler, digest):
    body = gzip.compress(b"\0" * (1 << 20))  # a small bomb: 1 MiB of zeros in about 1 KiB
    handler.send_raw(206, _ok_headers(handler, len(body), {"Content-Encoding": "gzip"}), body)


def wrong_range(handler, digest):
    handler.send_raw(
        206, {"Content-Length": str(len(BLOB)), "Content-Range": f"bytes 5-{len(BLOB) + 4}/{len(BLOB)}"}, BLOB
    )


def wrong_bytes(handler, digest):
    bad = bytearray(BLOB)
    bad[100] ^= 1
    handler.send_raw(206, _ok_headers(handler, len(bad)), bytes(bad))


def elsewhere(handler, digest):
    handler.send_raw(307, {"Location": "http://169.254.169.254/latest/meta-data", "Content-Length": "0"})


def loop(handler, digest):
    handler.send_raw(307, {"Location": handler.path, "Content-Length": "0"})


def file_scheme(handler, digest):
    handler.send_raw(302, {"Location": "file:///etc/passwd", "Content-Length": "0"})


@pytest.mark.parametrize(
    "answer, error, match",
    [
        (longer, MirrorError, "more bytes"),
        (endless, MirrorError, "more bytes"),
        (shorter, MirrorError, "failed after 2 retries"),
        (zero, MirrorError, "declares 0 bytes"),
        (gzipped, MirrorError, "gzip-encoded"),
        (wrong_range, MirrorError, "Content-Range"),
        (wrong_bytes, BlobMismatch, "digest mismatch"),
        (elsewhere, MirrorError, "another host"),
        (loop, MirrorError, "more than 5 redirects"),
        (file_scheme, MirrorError, "not http"),
    ],
)
def test_bad_blob_answers(world, answer, error, match):
    s, mirror, tmp_path = world
    serve_manifest(mirror, manifest_bytes())
    serve_blob(mirror, answer)
    with pytest.raises(error, match=match):
        outcome(s, mirror, tmp_path)


def test_manifest_redirect_and_auth_challenge_are_not_followed(world):
    s, mirror, tmp_path = world
    calls = []
    mirror.route("GET", r"/realm.*", lambda h, m: calls.append(h.path))
    mirror.route(
        "GET",
        rf"/v2/{REPO}/manifests/1",
        lambda h, m: h.send_raw(307, {"Location": "/v2/library/other/manifests/1", "Content-Length": "0"}),
    )
    with pytest.raises(MirrorError, match="redirect for a manifest"):
        outcome(s, mirror, tmp_path)
    mirror.routes.insert(
        0,
        (
            "GET",
            rf"/v2/{REPO}/manifests/1",
            lambda h, m: h.send_raw(
                401,
                {"WWW-Authenticate": f'Bearer realm="http://{mirror.host}/realm",service="x"', "Content-Length": "0"},
            ),
        ),
    )
    with pytest.raises(RegistryError, match="requires a token"):
        outcome(s, mirror, tmp_path)
    assert calls == []


def test_same_host_redirect_to_other_port_is_followed(world):
    s, mirror, tmp_path = world
    with RawMirror() as direct:
        direct.route("GET", BLOB_PATH, lambda h, m: h.send_raw(206, _ok_headers(h, len(BLOB)), BLOB))
        serve_manifest(mirror, manifest_bytes())
        serve_blob(
            mirror,
            lambda h, d: h.send_raw(
                307, {"Location": f"http://{direct.host}/v2/{REPO}/blobs/{d}", "Content-Length": "0"}
            ),
        )
        events = list(pl.pull(s, f"{mirror.host}/{REPO}:1", insecure=True))
    assert events[-1] == {"status": "success"} and s.blob_path(sha(BLOB)).read_bytes() == BLOB


def test_mirror_without_range_support_still_works(world, monkeypatch):
    s, mirror, tmp_path = world
    monkeypatch.setattr(dl, "PART_MIN", 4096)  # four parts: ranged requests the mirror ignores
    serve_manifest(mirror, manifest_bytes())
    serve_blob(mirror, lambda h, d: h.send_raw(200, {"Content-Length": str(len(BLOB))}, BLOB))
    events = list(pl.pull(s, f"{mirror.host}/{REPO}:1", insecure=True))
    assert events[-1] == {"status": "success"} and s.blob_path(sha(BLOB)).read_bytes() == BLOB
