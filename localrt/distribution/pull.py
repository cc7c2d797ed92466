"""Pulling a model into the store: from a registry over HTTP(S), or from a folder / bundle with no daemon behind it.

Progress events are Ollama's: `pulling manifest`, `pulling <hex12>` (digest/total/completed), `verifying sha256
digest`, `writing manifest`, [`removing unused layers`], `success`.

A registry blob downloads into `blobs/sha256-<hex>-partial` in parallel `Range` parts, with a state file
`...-partial.json` saying how far each part got (data is fsynced before the state that vouches for it), so a pull
killed or cut off anywhere resumes from what is on disk. One exclusive lock on the partial file makes concurrent
pulls of one blob (threads or processes) do one transfer: the others wait, report its progress, then find the blob.
A finished blob is hashed before it is renamed into the store; a mismatch deletes that blob's data only.

Mirror answers are untrusted. Manifests are capped and validated by `store.manifests.parse` (digest grammar, sizes,
layer count); bodies are requested with `Accept-Encoding: identity` and any encoded body is refused; a body longer
than its declared size is cut off at the first extra byte, a shorter one is retried then refused. Redirects are
followed for blob downloads only, at most MAX_REDIRECTS hops, only to the same host name (Ollama's rule: the port
may differ), never from https to plain http; a redirect to any other host is an error, so a mirror cannot point
us at internal addresses. Nothing is written anywhere but the store's blobs directory and manifests.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import store as st
from store import manifests as mf
from store import names

from .. import errors
from .download import BlobDownload, partial_done
from .registry import BlobMismatch, InsufficientSpace, MirrorError, RegistryError
from .sources import fetch_local, open_source
from .transport import RegistrySource, _registry_base

PROGRESS_S = 0.06  # progress event cadence, as Ollama
FREE_RESERVE = 32 << 20  # bytes kept free after a pull, for the manifest and everyone else


class Transfer:
    """An iterator of progress events with a thread-safe `cancel()`."""

    def __init__(self, gen_fn: Callable[[threading.Event], Iterator[dict]], cancel: threading.Event | None):
        self._stop = cancel if cancel is not None else threading.Event()
        self._gen = gen_fn(self._stop)

    def __iter__(self) -> "Transfer":
        return self

    def __next__(self) -> dict:
        return next(self._gen)

    def cancel(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._gen.close()


def pull(
    store: st.Store,
    name: str,
    *,
    insecure: bool = False,
    default_registry: str | None = None,
    cancel: threading.Event | None = None,
    token: str | None = None,
) -> Transfer:
    """Pull `name` into `store`. `name` is a model name (`[host:port/]namespace/model:tag`, short names going to
    `default_registry`), a `file://` URL or a path of a folder holding a store or a bundle, optionally with
    `#model:tag` to pick one of several models. `token` is sent as a bearer token to the registry."""
    return Transfer(lambda stop: _pull(store, name, insecure, default_registry, stop, token), cancel)


# ----- sources ----------------------------------------------------------------------------------------------------


def is_path(text: str) -> bool:
    return text.startswith(("file://", "/", "./", "../", "~", "\\\\")) or bool(re.match(r"[A-Za-z]:[\\/]", text))


def local_path(text: str) -> Path:
    if text.startswith("file://"):
        parsed = urllib.parse.urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise RegistryError(f"file URL {text!r} names a remote host; mount the share and give its path")
        return Path(urllib.parse.unquote(parsed.path))
    return Path(os.path.expanduser(text))


def resolve(name: str, insecure: bool, default_registry: str | None, token: str | None):
    """(source, local model name or None for 'as the source names it', model selector for local sources)."""
    if not isinstance(name, str) or not name:
        raise errors.InvalidRequest("model is required")
    if is_path(name):
        path, _, pick = name.partition("#")
        return open_source(local_path(path)), None, pick or None
    rest = name
    explicit_http = rest.startswith("http://")
    rest = rest.split("://", 1)[1] if "://" in rest else rest
    n = names.parse(rest)
    has_host = rest.count("/") == 2
    if not has_host and default_registry:
        reg = default_registry.strip()
        if is_path(reg):
            return open_source(local_path(reg)), n, n.display
        return RegistrySource(_registry_base(reg, insecure, True), n, token, insecure), n, None
    if explicit_http and not insecure:
        raise RegistryError("insecure protocol http")
    base = _registry_base(n.host, insecure or explicit_http, False)
    return RegistrySource(base, n, token, insecure or explicit_http), n, None


# ----- the pull ---------------------------------------------------------------------------------------------------


def free_bytes(path: Path) -> int:
    """Free bytes on the file system holding `path` (a seam for tests)."""
    return shutil.disk_usage(path).free


def preflight(store: st.Store, needed: list[tuple[str, int]]) -> None:
    """Fail fast when the blobs still to fetch cannot fit."""
    blobs = store.root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    need = sum(size - partial_done(store, d, size) for d, size in needed)
    free = free_bytes(blobs)
    if need and need + FREE_RESERVE > free:
        raise InsufficientSpace(
            f"not enough disk space: this pull needs {need} more bytes (+{FREE_RESERVE} "
            f"reserve) but {blobs} has {free} bytes free"
        )


def _stored_size(store: st.Store, digest: str) -> int | None:
    try:
        return store.blob_path(digest).stat().st_size
    except st.BlobNotFound:
        return None


def _blob_list(manifest: mf.Manifest) -> list[tuple[str, int]]:
    """(digest, size) of every blob, layers then config as Ollama pulls them, each once."""
    seen: dict[str, int] = {}
    for layer in (*manifest.layers, manifest.config):
        if seen.setdefault(layer.digest, layer.size) != layer.size:
            raise MirrorError(f"the manifest gives {layer.digest} two different sizes")
    return list(seen.items())


def _event(digest: str, total: int, completed: int) -> dict:
    return {"status": f"pulling {digest[7:19]}", "digest": digest, "total": total, "completed": completed}


def _run_fetch(fetch: Callable, digest: str, size: int, stop: threading.Event) -> Iterator[dict]:
    """Run one blob fetch in a worker thread, yielding its progress every PROGRESS_S."""
    done = [0]
    failure: list[BaseException] = []

    def work() -> None:
        try:
            fetch(lambda n: done.__setitem__(0, n))
        except BaseException as e:  # noqa: BLE001 - handed to the iterating thread
            failure.append(e)

    worker = threading.Thread(target=work, name=f"pull-{digest[7:19]}", daemon=True)
    worker.start()
    last = -1
    try:
        while worker.is_alive():
            worker.join(PROGRESS_S)
            if done[0] != last and worker.is_alive():
                last = done[0]
                yield _event(digest, size, last)
    except BaseException:
        stop.set()  # the consumer went away: the worker stops at its next chunk
        worker.join()
        raise
    if failure:
        raise failure[0]
    yield _event(digest, size, size)


def _fetcher(source, store: st.Store, digest: str, size: int, stop: threading.Event) -> Callable:
    if isinstance(source, RegistrySource):
        return lambda progress: BlobDownload(source, store, digest, size, progress, stop).run()
    return lambda progress: fetch_local(source, store, digest, size, progress, stop)


def _pull(
    store: st.Store, name: str, insecure: bool, default_registry: str | None, stop: threading.Event, token: str | None
) -> Iterator[dict]:
    source, local_name, pick = resolve(name, insecure, default_registry, token)
    try:
        yield from _pull_from(store, source, local_name, pick, stop)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientSpace(
                f"disk full while pulling {name}; the store is unchanged apart from resumable partial downloads"
            ) from None
        raise
    finally:
        source.close()


def _missing(store: st.Store, blobs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The blobs not stored yet. A stored blob of another size than the manifest says means the manifest lies."""
    out = []
    for d, size in blobs:
        have = _stored_size(store, d)
        if have is not None and have != size:
            raise MirrorError(
                f"the manifest says {d} has {size} bytes, but the stored blob with that digest has {have}"
            )
        if have is None:
            out.append((d, size))
    return out


def _pull_from(
    store: st.Store, source, local_name: names.ModelName | None, pick: str | None, stop: threading.Event
) -> Iterator[dict]:
    yield {"status": "pulling manifest"}
    src_name, raw = source.manifest() if isinstance(source, RegistrySource) else source.manifest(pick)
    local_name = local_name or src_name
    try:
        manifest = mf.parse(raw, local_name.display)
    except st.InvalidManifest as e:
        raise MirrorError(f"the source sent a bad manifest: {e}") from None
    blobs = _blob_list(manifest)
    missing = _missing(store, blobs)
    preflight(store, missing)
    for d, size in blobs:
        if (d, size) in missing:
            yield from _run_fetch(_fetcher(source, store, d, size, stop), d, size, stop)
        else:
            yield _event(d, size, size)  # already stored: one line, as Ollama reports a cache hit
    yield {"status": "verifying sha256 digest"}
    if _missing(store, blobs):
        raise BlobMismatch("a blob is missing after the download; pull again")
    yield {"status": "writing manifest"}
    old = store.put_manifest(local_name, manifest)
    unused = [d for d in old.digests if d not in manifest.digests] if old is not None else []
    if unused:
        yield {"status": "removing unused layers"}
        store.remove_unreferenced(unused)
    yield {"status": "success"}
