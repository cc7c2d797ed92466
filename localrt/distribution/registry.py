"""Serving a store over the registry protocol (Docker Registry v2 as Ollama speaks it, ollama_spec 10).

Reads are `GET/HEAD /v2/<namespace>/<model>/manifests/<tag>` and `GET/HEAD /v2/<namespace>/<model>/blobs/<digest>`
(single `Range` requests, exact `Content-Length`, `Docker-Content-Digest`). Writes are the upload protocol push
uses (`POST .../blobs/uploads/`, `PATCH`/`PUT` on the upload, `PUT .../manifests/<tag>`); an upload is hashed as it
arrives and lands in the store only when its digest matches.

A manifest is looked up by namespace/model/tag under any host in the store, preferring the default host, so a
model pulled as `mirror:11434/library/x:1` or created as `x:1` is served as `library/x/manifests/1`. Pushed
manifests are stored under the default host (they list locally as `x:1`).

Also here: the typed errors of pull/push/bundle and `commit_partial`, the one way a verified file in the blobs
directory becomes a blob."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import store as st
from store import digest as dg
from store import manifests as mf
from store import names
from store.locks import digest_lock_file, locked

from .. import errors
from ..config import is_loopback

MANIFEST_TYPE = mf.MANIFEST_MEDIA_TYPE
READ_CHUNK = 1 << 20  # bytes per read while serving a blob: few thread hops, small memory
UPLOAD_BUFFER = 4 << 20  # bytes gathered before one write+hash in a worker thread
MAX_UPLOADS = 32  # open upload sessions; each holds a temp file
UPLOAD_IDLE_S = 900.0  # an upload session untouched this long is dropped (its temp file with it)
BLOB_MODE = 0o644


class RegistryError(errors.LocalrtError):
    """A pull, push, import or export failed for a reason the user can act on."""


class MirrorError(RegistryError):
    """The mirror (or bundle) answered something we refuse: malformed, oversized, redirected elsewhere, lying."""


class InsufficientSpace(RegistryError):
    pass


class BlobMismatch(RegistryError):
    """Downloaded or imported bytes do not hash to their digest (or have the wrong size)."""


def registry_enabled(config) -> bool:
    """Serve /v2 on loopback binds always; beyond loopback only with an API key or an explicit opt-in
    (`registry_public`, from LOCALRT_REGISTRY_PUBLIC), so a LAN bind never exposes the store by accident."""
    if is_loopback(config.host):
        return True
    return bool(config.api_key) or bool(getattr(config, "registry_public", False))


def uploads_allowed(config) -> bool:
    """Writes (push) need a loopback bind or an API key (the Guard then demands the bearer token)."""
    return is_loopback(config.host) or bool(config.api_key)


# ----- store helpers shared with pull / push / bundle ------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return  # directories cannot be opened for fsync on Windows
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_partial(store: st.Store, tmp: Path, digest: str) -> None:
    """Rename `tmp` (a file in the writable blobs directory whose bytes were verified to hash to `digest`) into
    place under the store's per-digest lock. If the blob appeared meanwhile the temp file is dropped."""
    blobs = store.root / "blobs"
    if Path(tmp).parent.resolve() != blobs.resolve():
        raise st.UnsafePath(str(tmp))
    final = blobs / dg.to_filename(digest)
    with locked(digest_lock_file(store.root, digest[7:])):
        if final.is_file():
            Path(tmp).unlink(missing_ok=True)
            return
        os.chmod(tmp, BLOB_MODE)
        os.replace(tmp, final)
        fsync_dir(blobs)


def find_manifest(store: st.Store, namespace: str, model: str, tag: str) -> st.ModelEntry:
    """The stored model named namespace/model:tag under any host; the default host wins, then the newest."""
    name = names.parse(f"{namespace}/{model}:{tag}")
    try:
        return store.get(name)
    except st.ManifestNotFound:
        pass
    key = name.key[1:]
    for entry in store.list():  # newest first
        if entry.name.key[1:] == key:
            return entry
    raise st.ManifestNotFound(name.display)


# ----- HTTP side --------------------------------------------------------------------------------------------------

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """One `bytes=a-b`, `bytes=a-` or `bytes=-n` range as (start, end inclusive); None if unsatisfiable or not one
    simple range (we answer those with 416 rather than guess)."""
    m = _RANGE.fullmatch(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        return None
    if not m.group(1):
        n = int(m.group(2))
        if n == 0 or size == 0:
            return None
        return max(0, size - n), size - 1
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else size - 1
    if start >= size or end < start:
        return None
    return start, min(end, size - 1)


def _error(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"errors": [{"code": code, "message": message}]}, status_code=status, headers=headers)


def _file_chunks(path: Path, start: int, length: int):
    """The bytes [start, start+length) of a file, read in chunks (a sync iterator: Starlette runs it in threads)."""
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left > 0:
            chunk = f.read(min(READ_CHUNK, left))
            if not chunk:
                return  # the file shrank under us; the client sees a short body and retries
            left -= len(chunk)
            yield chunk


class _Upload:
    def __init__(self, store: st.Store, repo: str):
        self.store = store
        self.repo = repo
        self.tmp = store.new_temp_file()
        self.fh = open(self.tmp, "wb")
        self.hash = hashlib.sha256()
        self.offset = 0
        self.touched = time.monotonic()
        self.lock = asyncio.Lock()  # serialises PATCH/PUT of one upload without blocking the loop

    def write(self, data: bytes) -> None:
        self.hash.update(data)
        self.fh.write(data)
        self.offset += len(data)

    def discard(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


def registry_routes(store_getter: Callable[[], st.Store], config) -> list[Route]:
    """Routes of the registry protocol over `store_getter()`; mount them only when `registry_enabled(config)`."""
    r = _Registry(store_getter, uploads_allowed(config))
    base_path = "/v2/{namespace}/{model}"
    return [
        Route("/v2/", _guarded(r.base), methods=["GET", "HEAD"]),
        Route(base_path + "/manifests/{tag}", _guarded(r.get_manifest), methods=["GET", "HEAD"]),
        Route(base_path + "/manifests/{tag}", _guarded(r.put_manifest), methods=["PUT"]),
        Route(base_path + "/blobs/uploads/", _guarded(r.start_upload), methods=["POST"]),
        Route(base_path + "/blobs/uploads/{upload}", _guarded(r.patch_upload), methods=["PATCH"]),
        Route(base_path + "/blobs/uploads/{upload}", _guarded(r.finish_upload), methods=["PUT"]),
        Route(base_path + "/blobs/uploads/{upload}", _guarded(r.cancel_upload), methods=["DELETE"]),
        Route(base_path + "/blobs/{digest}", _guarded(r.get_blob), methods=["GET", "HEAD"]),
    ]


def _parse_name(request: Request) -> names.ModelName:
    p = request.path_params
    return names.parse(f"{p['namespace']}/{p['model']}:{p.get('tag', names.DEFAULT_TAG)}")


def _guarded(handler):
    """The registry's own error shape (`{"errors": [{"code", "message"}]}`), mapped once for every route."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except st.InvalidName as e:
            return _error(400, "NAME_INVALID", str(e))
        except st.InvalidDigest as e:
            return _error(400, "DIGEST_INVALID", str(e))
        except st.ManifestNotFound as e:
            return _error(404, "MANIFEST_UNKNOWN", str(e))
        except st.BlobNotFound as e:
            return _error(404, "BLOB_UNKNOWN", str(e))
        except st.InvalidManifest as e:
            return _error(400, "MANIFEST_INVALID", str(e))
        except OSError as e:
            return _error(500, "UNKNOWN", f"{type(e).__name__}: {e.strerror or e}")

    return route


def _check_range(up: _Upload, request: Request) -> Response | None:
    # Ollama sends `Content-Range: <start>-<end>`; a chunk must continue exactly where the upload stands.
    cr = request.headers.get("content-range")
    if cr is None:
        return None
    m = re.fullmatch(r"(?:bytes )?(\d+)-(\d+)", cr.strip())
    if not m or int(m.group(1)) != up.offset:
        return _error(
            416,
            "BLOB_UPLOAD_INVALID",
            f"Content-Range {cr!r} does not continue at {up.offset}",
            {"Range": f"0-{max(up.offset - 1, 0)}"},
        )
    return None


async def _receive_into(up: _Upload, request: Request) -> None:
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) >= UPLOAD_BUFFER:
            await run_in_threadpool(up.write, bytes(buf))
            buf.clear()
    if buf:
        await run_in_threadpool(up.write, bytes(buf))


class _Registry:
    """The registry's routes over one store, and the uploads in progress (one method per route)."""

    def __init__(self, store_getter: Callable[[], st.Store], writable: bool):
        self.store_getter = store_getter
        self.writable = writable
        self.uploads: dict[str, _Upload] = {}
        self.uploads_guard = threading.Lock()

    async def base(self, request: Request) -> Response:
        return JSONResponse({}, headers={"Docker-Distribution-API-Version": "registry/2.0"})

    async def get_manifest(self, request: Request) -> Response:
        p = request.path_params
        entry = await run_in_threadpool(find_manifest, self.store_getter(), p["namespace"], p["model"], p["tag"])
        data = await run_in_threadpool(entry.path.read_bytes)
        headers = {"Docker-Content-Digest": dg.of_bytes(data), "Content-Length": str(len(data))}
        body = b"" if request.method == "HEAD" else data
        return Response(body, media_type=MANIFEST_TYPE, headers=headers)

    async def get_blob(self, request: Request) -> Response:
        digest = dg.normalize(request.path_params["digest"])
        path = await run_in_threadpool(self.store_getter().blob_path, digest)
        size = path.stat().st_size
        headers = {"Docker-Content-Digest": digest, "Accept-Ranges": "bytes", "ETag": f'"{digest}"'}
        start, length, status = 0, size, 200
        if "range" in request.headers:
            rng = parse_range(request.headers["range"], size)
            if rng is None:
                return _error(
                    416,
                    "RANGE_INVALID",
                    f"range {request.headers['range']!r} not satisfiable",
                    {"Content-Range": f"bytes */{size}"},
                )
            start, length, status = rng[0], rng[1] - rng[0] + 1, 206
            headers["Content-Range"] = f"bytes {rng[0]}-{rng[1]}/{size}"
        headers["Content-Length"] = str(length)
        if request.method == "HEAD":
            return Response(b"", status_code=status, headers=headers, media_type="application/octet-stream")
        return StreamingResponse(
            _file_chunks(path, start, length),
            status_code=status,
            headers=headers,
            media_type="application/octet-stream",
        )

    def _deny_writes(self) -> Response | None:
        if self.writable:
            return None
        return _error(403, "DENIED", "this mirror is read-only: uploads need a loopback bind or LOCALRT_API_KEY")

    def _expire(self) -> None:
        now = time.monotonic()
        with self.uploads_guard:
            for key in [k for k, u in self.uploads.items() if now - u.touched > UPLOAD_IDLE_S]:
                self.uploads.pop(key).discard()

    def _session(self, request: Request) -> _Upload:
        with self.uploads_guard:
            up = self.uploads.get(request.path_params["upload"])
        name = _parse_name(request)
        if up is None or up.repo != f"{name.namespace}/{name.model}":
            raise LookupError(request.path_params["upload"])
        up.touched = time.monotonic()
        return up

    async def start_upload(self, request: Request) -> Response:
        if (denied := self._deny_writes()) is not None:
            return denied
        name = _parse_name(request)
        await run_in_threadpool(self._expire)
        with self.uploads_guard:
            if len(self.uploads) >= MAX_UPLOADS:
                return _error(429, "TOOMANYREQUESTS", f"more than {MAX_UPLOADS} uploads in progress")
            up = _Upload(self.store_getter(), f"{name.namespace}/{name.model}")
            key = uuid.uuid4().hex
            self.uploads[key] = up
        loc = f"/v2/{name.namespace}/{name.model}/blobs/uploads/{key}"
        return Response(status_code=202, headers={"Location": loc, "Docker-Upload-UUID": key, "Range": "0-0"})

    def _upload_of(self, request: Request) -> _Upload | Response:
        """The upload a PATCH / PUT continues, or the error reply (read-only mirror, unknown upload)."""
        if (denied := self._deny_writes()) is not None:
            return denied
        try:
            return self._session(request)
        except LookupError:
            return _error(404, "BLOB_UPLOAD_UNKNOWN", "no such upload")

    async def patch_upload(self, request: Request) -> Response:
        if isinstance(up := self._upload_of(request), Response):
            return up
        async with up.lock:
            if (bad := _check_range(up, request)) is not None:
                return bad
            await _receive_into(up, request)
        return Response(
            status_code=202,
            headers={
                "Location": request.url.path,
                "Range": f"0-{max(up.offset - 1, 0)}",
                "Docker-Upload-UUID": request.path_params["upload"],
            },
        )

    async def finish_upload(self, request: Request) -> Response:
        if isinstance(up := self._upload_of(request), Response):
            return up
        digest = dg.validate(request.query_params.get("digest"))
        try:
            async with up.lock:
                await _receive_into(up, request)
                await run_in_threadpool(up.fh.close)
            actual = "sha256:" + up.hash.hexdigest()
            if actual != digest:
                return _error(400, "DIGEST_INVALID", f'digest mismatch, expected "{digest}", got "{actual}"')
            await run_in_threadpool(commit_partial, up.store, up.tmp, digest)
        finally:
            with self.uploads_guard:
                self.uploads.pop(request.path_params["upload"], None)
            up.discard()
        loc = f"/v2/{request.path_params['namespace']}/{request.path_params['model']}/blobs/{digest}"
        return Response(status_code=201, headers={"Location": loc, "Docker-Content-Digest": digest})

    async def cancel_upload(self, request: Request) -> Response:
        if (denied := self._deny_writes()) is not None:
            return denied
        with self.uploads_guard:
            up = self.uploads.pop(request.path_params["upload"], None)
        if up is None:
            return _error(404, "BLOB_UPLOAD_UNKNOWN", "no such upload")
        up.discard()
        return Response(status_code=204)

    async def put_manifest(self, request: Request) -> Response:
        if (denied := self._deny_writes()) is not None:
            return denied
        name = _parse_name(request)
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > mf.MAX_MANIFEST_BYTES:
                return _error(413, "MANIFEST_INVALID", f"manifest larger than {mf.MAX_MANIFEST_BYTES} bytes")
        manifest = mf.parse(bytes(data), name.display)
        try:
            await run_in_threadpool(self.store_getter().put_manifest, name, manifest)
        except st.BlobNotFound as e:
            return _error(400, "MANIFEST_BLOB_UNKNOWN", str(e))
        loc = f"/v2/{name.namespace}/{name.model}/manifests/{name.tag}"
        return Response(status_code=201, headers={"Location": loc, "Docker-Content-Digest": dg.of_bytes(bytes(data))})


__all__ = [
    "BlobMismatch",
    "InsufficientSpace",
    "MirrorError",
    "RegistryError",
    "commit_partial",
    "find_manifest",
    "parse_range",
    "registry_enabled",
    "registry_routes",
    "uploads_allowed",
]
