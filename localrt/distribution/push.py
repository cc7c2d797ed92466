"""Pushing a model to another localrt daemon (or any registry speaking the same upload protocol).

Events are Ollama's: `retrieving manifest`, `pushing <hex12>` (digest/total/completed), `pushing manifest`,
`success`. For each blob: HEAD on the target; if absent `POST .../blobs/uploads/`, then `PATCH` the bytes in
chunks small enough for the target's request-body cap (each with `Content-Range: <start>-<end>`), then
`PUT <location>?digest=<digest>`; the target verifies the digest before it stores anything. The manifest goes
last, so the target never lists a model whose blobs it lacks."""

from __future__ import annotations

import threading
import urllib.parse
from typing import Iterator

import httpx

import store as st
from store import manifests as mf
from store import names

from .. import errors
from ..config import is_loopback
from .pull import Transfer, _run_fetch
from .registry import MirrorError, RegistryError
from .transport import USER_AGENT, _registry_base

PATCH_CHUNK = 32 << 20  # bytes per PATCH: under the 64 MiB request-body cap of a localrt daemon
READ_CHUNK = 1 << 20


def push(
    store: st.Store,
    name: str,
    *,
    insecure: bool = False,
    cancel: threading.Event | None = None,
    token: str | None = None,
) -> Transfer:
    """Push the stored model `name` (`host[:port]/namespace/model:tag`) to the registry its host names."""
    return Transfer(lambda stop: _push(store, name, insecure, stop, token), cancel)


class _Target:
    def __init__(self, base: str, name: names.ModelName, token: str | None):
        self.base = base
        self.repo = f"{base}/v2/{name.namespace}/{name.model}"
        host = urllib.parse.urlparse(base).hostname or ""
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.client = httpx.Client(
            headers=headers,
            follow_redirects=False,
            trust_env=not is_loopback(host),
            timeout=httpx.Timeout(connect=10.0, read=120.0, write=120.0, pool=None),
        )

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, url: str, **kw) -> httpx.Response:
        try:
            r = self.client.request(method, url, **kw)
        except httpx.TransportError as e:
            raise RegistryError(f"cannot reach {self.base}: {e}") from None
        if r.status_code in (401, 403):
            raise RegistryError(f"{self.base} refused the upload (HTTP {r.status_code}): {r.text[:300]}")
        return r

    def has_blob(self, digest: str) -> bool:
        r = self._call("HEAD", f"{self.repo}/blobs/{digest}")
        if r.status_code not in (200, 404):
            raise RegistryError(f"HEAD blob {digest}: HTTP {r.status_code}")
        return r.status_code == 200

    def _location(self, r: httpx.Response, url: str) -> str:
        loc = r.headers.get("docker-upload-location") or r.headers.get("location")
        if not loc:
            raise MirrorError(f"the registry gave no upload location (HTTP {r.status_code})")
        target = urllib.parse.urljoin(url, loc)
        if urllib.parse.urlparse(target).hostname != urllib.parse.urlparse(self.base).hostname:
            raise MirrorError(f"refusing to upload to another host ({target})")
        return target

    def upload(self, store: st.Store, digest: str, size: int, progress, stop: threading.Event) -> None:
        start_url = f"{self.repo}/blobs/uploads/"
        r = self._call("POST", start_url)
        if r.status_code not in (201, 202):
            raise RegistryError(f"starting the upload of {digest}: HTTP {r.status_code}: {r.text[:300]}")
        if r.status_code == 201:
            progress(size)  # cross-repo mount: the target had it
            return
        loc = self._location(r, start_url)
        sent = 0
        with open(store.blob_path(digest), "rb") as f:
            while sent < size:
                if stop.is_set():
                    self._call("DELETE", loc)
                    raise errors.Cancelled()
                chunk = f.read(min(PATCH_CHUNK, size - sent))
                if not chunk:
                    raise st.CorruptBlob(digest, f"the stored blob ended after {sent} of {size} bytes")
                headers = {
                    "Content-Type": "application/octet-stream",
                    "Content-Range": f"{sent}-{sent + len(chunk) - 1}",
                }
                r = self._call("PATCH", loc, content=_progressing(chunk, sent, progress), headers=headers)
                if r.status_code != 202:
                    raise RegistryError(f"uploading {digest}: HTTP {r.status_code}: {r.text[:300]}")
                loc = self._location(r, loc)
                sent += len(chunk)
        sep = "&" if "?" in loc else "?"
        r = self._call("PUT", f"{loc}{sep}digest={digest}")
        if r.status_code != 201:
            raise RegistryError(f"finishing the upload of {digest}: HTTP {r.status_code}: {r.text[:300]}")
        progress(size)

    def put_manifest(self, tag: str, data: bytes) -> None:
        r = self._call(
            "PUT", f"{self.repo}/manifests/{tag}", content=data, headers={"Content-Type": mf.MANIFEST_MEDIA_TYPE}
        )
        if r.status_code not in (200, 201):
            raise RegistryError(f"pushing the manifest: HTTP {r.status_code}: {r.text[:300]}")


def _progressing(chunk: bytes, offset: int, progress):
    """The chunk as a body iterator that reports bytes sent as httpx consumes it."""
    view = memoryview(chunk)
    for i in range(0, len(view), READ_CHUNK):
        piece = view[i : i + READ_CHUNK]
        yield bytes(piece)
        progress(offset + i + len(piece))


def _push(store: st.Store, name: str, insecure: bool, stop: threading.Event, token: str | None) -> Iterator[dict]:
    if not isinstance(name, str) or not name:
        raise errors.InvalidRequest("model is required")
    explicit_http = name.startswith("http://")
    n = names.parse(name)
    if n.host.lower() == names.DEFAULT_HOST:
        raise RegistryError(
            f"pushing to {names.DEFAULT_HOST} is not supported; copy the model to a name with the "
            "target mirror's host first (localrt cp MODEL host:port/namespace/model:tag)"
        )
    if explicit_http and not insecure:
        raise RegistryError("insecure protocol http")
    entry = store.get(n)
    target = _Target(_registry_base(n.host, insecure or explicit_http, False), n, token)
    try:
        yield {"status": "retrieving manifest"}
        raw = entry.path.read_bytes()
        manifest = mf.parse(raw, n.display)
        seen: set[str] = set()
        for layer in (*manifest.layers, manifest.config):
            d, size = layer.digest, layer.size
            if d in seen:
                continue
            seen.add(d)
            status = f"pushing {d[7:19]}"
            if target.has_blob(d):
                yield {"status": status, "digest": d, "total": size, "completed": size}
                continue
            for ev in _run_fetch(lambda p, d=d, size=size: target.upload(store, d, size, p, stop), d, size, stop):
                yield dict(ev, status=status)
        yield {"status": "pushing manifest"}
        target.put_manifest(n.tag, raw)
        yield {"status": "success"}
    finally:
        target.close()
