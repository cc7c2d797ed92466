"""Helpers for registry / pull / push / bundle tests: tiny models in a store, real daemons on loopback, and a
scriptable raw HTTP mirror (for throttled, counting, dropping and hostile answers)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import socketserver
import threading
import time
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

import store as st
from localrt import config as cfg
from localrt.serve.daemon import BackgroundServer, free_port
from localrt.distribution.registry import registry_routes
from store import manifests as mf

TEMPLATE = "{{ .Prompt }}"


def write_gguf(path: Path, n_bytes: int, seed: int = 0) -> Path:
    """A GGUF whose one F32 tensor makes the file about `n_bytes` long (random values: nothing compresses)."""
    rng = np.random.default_rng(seed)
    n = max(n_bytes // 4, 8)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type("model")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", rng.standard_normal(n).astype(np.float32))  # (n,)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_model(
    store: st.Store, name: str, tmp: Path, n_bytes: int = 64 << 10, seed: int = 0, template: str = TEMPLATE
) -> mf.Manifest:
    """Store a model: one GGUF layer, one template layer, a config blob. Returns its manifest."""
    tmp.mkdir(parents=True, exist_ok=True)
    gguf_path = write_gguf(tmp / f"m{seed}.gguf", n_bytes, seed)
    model = store.import_file(gguf_path)
    tpl = store.write_blob((template + f"\n# {seed}").encode())
    cfg_bytes = mf.config_blob(
        model_family="llama", model_type="1K", file_type="F32", diff_ids=[model.digest, tpl.digest]
    )
    conf = store.write_blob(cfg_bytes)
    manifest = mf.build(
        mf.Layer(mf.CONFIG_MEDIA_TYPE, conf.digest, conf.size),
        [mf.Layer(mf.MODEL, model.digest, model.size), mf.Layer(mf.TEMPLATE, tpl.digest, tpl.size)],
    )
    store.put_manifest(name, manifest)
    return manifest


def blob_bytes(store: st.Store, digest: str) -> bytes:
    return store.blob_path(digest).read_bytes()


def tree(path: Path) -> list[str]:
    """Every file and directory under `path`, relative, sorted (to prove nothing appeared outside a store)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


class _NoModels:
    """A load function for a Service that must never load anything in these tests."""

    def __call__(self, *a, **kw):
        raise AssertionError("registry tests never load a model")


def daemon(models_dir: Path, *, api_key: str | None = None, registry: str | None = None) -> BackgroundServer:
    """A real localrt daemon on 127.0.0.1 over `models_dir`, with the registry routes mounted."""
    from localrt.runtime.service import Service

    env = {
        "LOCALRT_MODELS": str(models_dir),
        "LOCALRT_HOST": f"127.0.0.1:{free_port()}",
        "LOCALRT_DATA": str(models_dir.parent / (models_dir.name + "-data")),
    }
    if api_key:
        env["LOCALRT_API_KEY"] = api_key
    if registry:
        env["LOCALRT_REGISTRY"] = registry
    config = cfg.load(env)
    service = Service(config, load_model=_NoModels())
    bg = BackgroundServer(service, config)
    starlette_app = bg.server.config.app
    while not hasattr(starlette_app, "router"):  # middlewares (request id, access log, guards) wrap the app
        starlette_app = starlette_app.app
    if not any(getattr(r, "path", "").startswith("/v2/") for r in starlette_app.router.routes):
        starlette_app.router.routes.extend(registry_routes(lambda: service.store, config))
    bg.service = service  # type: ignore[attr-defined]
    return bg


# ----- a raw, scriptable mirror ---------------------------------------------------------------------------------

Handler = Callable[["RawHandler", re.Match], None]


class RawHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "RawMirror"

    def log_message(self, *a) -> None:
        pass

    def _dispatch(self) -> None:
        for method, pattern, fn in self.server.routes:
            if method == self.command:
                m = re.fullmatch(pattern, self.path)
                if m:
                    try:
                        fn(self, m)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
        self.send_json(404, {"errors": [{"code": "NOT_FOUND", "message": self.path}]})

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _dispatch

    def send_json(self, code: int, obj, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_raw(self, code: int, headers: dict, body: bytes = b"") -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)


class RawMirror(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """A mirror whose every answer is a Python function; `served` counts blob body bytes written."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), RawHandler)
        self.routes: list[tuple[str, str, Handler]] = []
        self.served = 0
        self.ranges: list[tuple[str, int, int]] = []  # (digest, first byte, last byte) of each blob GET
        self.active = 0  # blob bodies being sent right now
        self.max_active = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def route(self, method: str, pattern: str, fn: Handler) -> None:
        self.routes.append((method, pattern, fn))

    def __enter__(self) -> "RawMirror":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()

    def count(self, n: int) -> None:
        with self.lock:
            self.served += n

    def _send_body(self, h: RawHandler, data: bytes, start: int, end: int, chunk: int, cut: int | None) -> None:
        pos = start
        while pos <= end:
            piece = data[pos : min(pos + chunk, end + 1)]
            if cut is not None and pos - start + len(piece) > cut:
                h.wfile.write(piece[: max(cut - (pos - start), 0)])
                h.wfile.flush()
                h.close_connection = True
                h.connection.shutdown(2)
                return
            h.wfile.write(piece)
            self.count(len(piece))
            pos += len(piece)
            if self.throttle:
                time.sleep(self.throttle)

    def serve_model(
        self,
        repo: str,
        tag: str,
        manifest_bytes: bytes,
        blobs: dict[str, bytes],
        *,
        delay_s: float = 0.0,
        chunk: int = 64 << 10,
        drop_after: dict | None = None,
    ) -> None:
        """Serve a model honestly (Range included), optionally slowly, optionally cutting the first request
        for a digest after `drop_after[digest]` bytes."""
        drops = dict(drop_after or {})
        self.throttle = delay_s

        def manifest(h: RawHandler, m) -> None:
            h.send_raw(
                200,
                {
                    "Content-Type": mf.MANIFEST_MEDIA_TYPE,
                    "Content-Length": str(len(manifest_bytes)),
                    "Docker-Content-Digest": "sha256:" + hashlib.sha256(manifest_bytes).hexdigest(),
                },
                manifest_bytes,
            )

        def blob(h: RawHandler, m) -> None:
            data = blobs.get(m.group(1))
            if data is None:
                h.send_json(404, {"errors": [{"code": "BLOB_UNKNOWN"}]})
                return
            start, end, code = 0, len(data) - 1, 200
            rng = h.headers.get("Range")
            headers = {"Content-Type": "application/octet-stream"}
            if rng:
                a, b = re.fullmatch(r"bytes=(\d+)-(\d+)", rng).groups()
                start, end, code = int(a), int(b), 206
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            headers["Content-Length"] = str(end - start + 1)
            h.send_raw(code, headers)
            if h.command == "HEAD":
                return
            with self.lock:
                self.ranges.append((m.group(1), start, end))
                self.active += 1
                self.max_active = max(self.max_active, self.active)
            try:
                self._send_body(h, data, start, end, chunk, drops.pop(m.group(1), None))
            finally:
                with self.lock:
                    self.active -= 1

        self.route("GET", rf"/v2/{repo}/manifests/{tag}", manifest)
        self.route("HEAD", rf"/v2/{repo}/manifests/{tag}", manifest)
        self.route("GET", rf"/v2/{repo}/blobs/(sha256:[0-9a-f]{{64}})", blob)
        self.route("HEAD", rf"/v2/{repo}/blobs/(sha256:[0-9a-f]{{64}})", blob)


def model_payload(store: st.Store, name: str) -> tuple[bytes, dict[str, bytes]]:
    """(manifest bytes, digest -> blob bytes) of a stored model, to serve from a RawMirror."""
    entry = store.get(name)
    return entry.path.read_bytes(), {d: blob_bytes(store, d) for d in entry.manifest.digests}


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def env_pythonpath() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env
