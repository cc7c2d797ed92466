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

import contextlib
import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import threading
import time
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import httpx

import store as st
from store import digest as dg
from store import manifests as mf
from store import names

from . import errors
from .registry import BlobMismatch, InsufficientSpace, MirrorError, RegistryError, commit_partial
from .security import is_loopback

try:
    import fcntl
except ImportError:  # Windows: a process-local lock stands in for flock
    fcntl = None  # type: ignore[assignment]

STREAMS = 4  # at most this many range requests per blob at once (Ollama's newest default)
SLOW_STREAM_BPS = 32 << 20  # below this per stream the link is the limit and another stream may help
MAX_PARTS = 16
PART_MIN = 16 << 20  # bytes; smaller blobs download in one request
PART_MAX = 1000 * 10**6
CHUNK = 256 << 10  # bytes per read from a response: progress granularity on slow links
RETRIES = 6  # per part, counted only while no byte arrives
BACKOFF_S = 0.5
BACKOFF_MAX_S = 8.0
STALL_S = 30.0  # no byte for this long: the request is dropped and retried
PERSIST_S = 1.0  # how often the part state is saved
PROGRESS_S = 0.06  # progress event cadence, as Ollama
FREE_RESERVE = 32 << 20  # bytes kept free after a pull, for the manifest and everyone else
MAX_REDIRECTS = 5
USER_AGENT = "localrt (ollama-compatible)"


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


def pull(store: st.Store, name: str, *, insecure: bool = False, default_registry: str | None = None,
         cancel: threading.Event | None = None, token: str | None = None) -> Transfer:
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


def _registry_base(spec: str, insecure: bool, configured: bool) -> str:
    """`http(s)://host[:port]` from a host or URL. A plain-http URL needs `insecure`, unless it was configured."""
    scheme = "http" if insecure else "https"
    if "://" in spec:
        scheme, spec = spec.split("://", 1)
        if scheme not in ("http", "https"):
            raise RegistryError(f"unsupported registry scheme {scheme!r}")
        if scheme == "http" and not (insecure or configured):
            raise RegistryError("insecure protocol http")
    host = spec.rstrip("/")
    if not host or "/" in host:
        raise RegistryError(f"a registry is host[:port] with no path, got {spec!r}")
    return f"{scheme}://{host}"


def resolve(name: str, insecure: bool, default_registry: str | None, token: str | None):
    """(source, local model name or None for 'as the source names it', model selector for local sources)."""
    from .bundle import open_source

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


def _check_redirect(origin: str, target: str, insecure: bool) -> None:
    o, t = urllib.parse.urlparse(origin), urllib.parse.urlparse(target)
    if t.scheme not in ("http", "https"):
        raise MirrorError(f"refusing redirect to {target!r}: not http(s)")
    if (o.hostname or "").lower() != (t.hostname or "").lower():
        raise MirrorError(f"refusing redirect from {o.hostname} to another host ({t.hostname}): blobs are only "
                          "fetched from the mirror's own host")
    if o.scheme == "https" and t.scheme == "http" and not insecure:
        raise MirrorError(f"refusing redirect from https to plain http ({target})")


class RegistrySource:
    def __init__(self, base: str, name: names.ModelName, token: str | None, insecure: bool):
        self.base = base
        self.name = name
        self.insecure = insecure
        host = urllib.parse.urlparse(base).hostname or ""
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.headers = headers
        self.client = httpx.Client(
            headers=headers, follow_redirects=False,
            timeout=httpx.Timeout(connect=10.0, read=STALL_S, write=60.0, pool=None),
            limits=httpx.Limits(max_connections=STREAMS * 4, max_keepalive_connections=STREAMS * 4),
            trust_env=not is_loopback(host),  # a proxy setting must never capture a loopback mirror
        )
        self.direct: dict[str, str] = {}  # blob digest -> URL after redirects (one discovery per blob)

    def close(self) -> None:
        self.client.close()

    def _repo(self) -> str:
        return f"{self.base}/v2/{self.name.namespace}/{self.name.model}"

    def manifest(self) -> tuple[names.ModelName, bytes]:
        url = f"{self._repo()}/manifests/{self.name.tag}"
        try:
            with self.client.stream("GET", url, headers={"Accept": mf.MANIFEST_MEDIA_TYPE}) as r:
                if r.status_code == 404:
                    raise RegistryError("pull model manifest: file does not exist")
                if r.status_code in (401, 403):
                    raise RegistryError(f"{self.base} refused the manifest request (HTTP {r.status_code}): "
                                        "the mirror requires a token")
                if 300 <= r.status_code < 400:
                    raise MirrorError(f"refusing redirect for a manifest ({r.headers.get('location', '')!r})")
                if r.status_code != 200:
                    raise RegistryError(f"pull model manifest: {r.status_code}: {_peek(r)}")
                _refuse_encoding(r, "manifest")
                data = _read_capped(r, mf.MAX_MANIFEST_BYTES, "manifest")
        except httpx.TransportError as e:
            raise RegistryError(f"cannot reach {self.base}: {e}") from None
        claimed = r.headers.get("docker-content-digest")
        if claimed and claimed != dg.of_bytes(data):
            raise MirrorError(f"the manifest does not hash to the Docker-Content-Digest the mirror sent ({claimed})")
        return self.name, data

    def open_blob(self, digest: str, headers: dict) -> "_BlobResponse":
        """A GET of the blob, following allowed redirects. The caller closes the response.
        Network failures come out as _Transient."""
        url = self.direct.get(digest) or f"{self._repo()}/blobs/{digest}"
        for _ in range(MAX_REDIRECTS + 1):
            r = _BlobResponse.get(url, {**self.headers, **headers})
            location = r.headers.get("location")
            if r.status_code in (301, 302, 303, 307, 308) and location:
                r.close()
                target = urllib.parse.urljoin(url, location)
                _check_redirect(url, target, self.insecure)
                url = target
                continue
            self.direct[digest] = url
            return r
        raise MirrorError(f"more than {MAX_REDIRECTS} redirects for blob {digest}")

    def fetch(self, store: st.Store, digest: str, size: int, progress, stop: threading.Event) -> None:
        BlobDownload(self, store, digest, size, progress, stop).run()


def _peek(r: httpx.Response) -> str:
    try:
        return _read_capped(r, 4096, "error body", strict=False).decode("utf-8", "replace").strip()
    except (httpx.HTTPError, MirrorError):
        return ""


def _refuse_encoding(r, what: str) -> None:
    enc = r.headers.get("content-encoding", "identity").strip().lower()
    if enc not in ("", "identity"):
        raise MirrorError(f"the mirror sent the {what} {enc}-encoded although identity was requested; refused "
                          "(a compressed body can expand without bound)")


def _read_capped(r: httpx.Response, cap: int, what: str, strict: bool = True) -> bytes:
    buf = bytearray()
    for chunk in r.iter_raw(65536):
        buf += chunk
        if len(buf) > cap:
            if not strict:
                return bytes(buf[:cap])
            raise MirrorError(f"the {what} is larger than {cap} bytes; refused")
    return bytes(buf)


class _Transient(Exception):
    """A failure worth retrying: connection dropped, body ended early, server busy."""


class _NoRanges(Exception):
    """The mirror ignores Range; the blob is fetched in one request from byte 0."""


def _proxy_for(url: urllib.parse.ParseResult) -> urllib.parse.ParseResult | None:
    if is_loopback(url.hostname or "") or urllib.request.proxy_bypass(url.hostname or ""):
        return None
    proxy = urllib.request.getproxies().get(url.scheme)
    return urllib.parse.urlparse(proxy) if proxy else None


class _BlobResponse:
    """One blob GET over http.client: its `readinto` fills a reused buffer straight from the socket, about
    2.5x the throughput of httpx's streaming on this path (the bulk of a pull)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self.conn, self.resp = conn, resp
        self.status_code = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    @classmethod
    def get(cls, url: str, headers: dict) -> "_BlobResponse":
        u = urllib.parse.urlparse(url)
        proxy = _proxy_for(u)
        # Through an http proxy the request line carries the whole URL; otherwise (or tunnelled) just the path.
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        target = url if proxy is not None and u.scheme == "http" else path
        via = proxy or u
        conn_cls = http.client.HTTPSConnection if via.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(via.hostname, via.port, timeout=STALL_S)
        if proxy is not None and u.scheme == "https":
            conn.set_tunnel(u.hostname, u.port or 443)
        try:
            conn.request("GET", target, headers=headers)
            return cls(conn, conn.getresponse())
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _Transient(f"{type(e).__name__}: {e}") from None

    def chunks(self, buf: memoryview) -> Iterator[memoryview]:
        while True:
            try:
                n = self.resp.readinto(buf)
            except (OSError, http.client.HTTPException) as e:
                raise _Transient(f"{type(e).__name__}: {e}") from None
            if not n:
                return
            yield buf[:n]

    def peek(self) -> str:
        try:
            return self.resp.read(4096).decode("utf-8", "replace").strip()
        except (OSError, http.client.HTTPException):
            return ""

    def close(self) -> None:
        self.conn.close()


@dataclass
class _Part:
    start: int
    size: int
    done: int = 0


def _plan(size: int) -> list[_Part]:
    part = min(max(-(-size // MAX_PARTS), PART_MIN), PART_MAX)
    return [_Part(s, min(part, size - s)) for s in range(0, size, part)] or [_Part(0, 0)]


def partial_paths(store: st.Store, digest: str) -> tuple[Path, Path]:
    base = store.root / "blobs" / dg.to_filename(digest)
    return base.with_name(base.name + "-partial"), base.with_name(base.name + "-partial.json")


def _load_state(path: Path, digest: str, size: int) -> list[_Part] | None:
    """The saved parts, if the state file describes this blob consistently; else None (start over)."""
    try:
        obj = json.loads(path.read_text())
        if obj.get("digest") != digest or obj.get("size") != size:
            return None
        parts = [_Part(int(a), int(b), int(c)) for a, b, c in obj["parts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    pos = 0
    for p in parts:
        if p.start != pos or p.size < 0 or not 0 <= p.done <= p.size:
            return None
        pos += p.size
    return parts if pos == size else None


def partial_done(store: st.Store, digest: str, size: int) -> int:
    parts = _load_state(partial_paths(store, digest)[1], digest, size)
    return sum(p.done for p in parts) if parts else 0


_seek_lock = threading.Lock()  # only where os.pwrite/os.pread are missing (Windows): seek+io must not interleave


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        if hasattr(os, "pwrite"):
            n = os.pwrite(fd, view, offset)
        else:
            with _seek_lock:
                os.lseek(fd, offset, os.SEEK_SET)
                n = os.write(fd, view)
        view, offset = view[n:], offset + n


def _read_at(fd: int, n: int, offset: int) -> bytes:
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    with _seek_lock:
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, n)


class _TrailingHash:
    """sha256 of a blob's contiguous downloaded prefix, computed in its own thread while the parts are still
    downloading (pread and hashlib release the GIL), so verifying mostly overlaps the transfer."""

    def __init__(self, fd: int, size: int, frontier: Callable[[], int]):
        self.fd, self.size, self.frontier = fd, size, frontier
        self.h = hashlib.sha256()
        self.pos = 0
        self.failed = False
        self.quit = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pull-hash", daemon=True)
        self.thread.start()

    def _step(self, end: int) -> bool:
        if end <= self.pos:
            return False
        block = _read_at(self.fd, min(dg.CHUNK, end - self.pos), self.pos)
        if not block:
            return False
        self.h.update(block)
        self.pos += len(block)
        return True

    def _run(self) -> None:
        try:
            while not self.quit.is_set():
                if not self._step(self.frontier()):
                    self.quit.wait(0.02)
        except OSError:
            self.failed = True  # finish() starts over in the calling thread, where the error surfaces

    def close(self) -> None:
        self.quit.set()
        self.thread.join()

    def finish(self, stop: threading.Event) -> tuple[str, int]:
        """Hash the rest (all parts are done) and return (digest, bytes hashed)."""
        self.close()
        if self.failed:
            self.h, self.pos = hashlib.sha256(), 0
        while self._step(self.size):
            if stop.is_set():
                raise errors.Cancelled()
        return "sha256:" + self.h.hexdigest(), self.pos


_local_locks: dict[str, threading.Lock] = {}
_local_guard = threading.Lock()


class BlobDownload:
    def __init__(self, src: RegistrySource, store: st.Store, digest: str, size: int, progress, stop):
        self.src, self.store, self.digest, self.size = src, store, digest, size
        self.progress, self.stop = progress, stop
        self.abort = threading.Event()  # one part failed: the others stop
        self.partial, self.state = partial_paths(store, digest)
        self.final = store.root / "blobs" / dg.to_filename(digest)
        self.parts: list[_Part] = []
        self.state_lock = threading.Lock()
        self.hasher: _TrailingHash | None = None

    # -- locking ---------------------------------------------------------------------------------------------

    def _try_lock(self, fd: int) -> bool:
        if fcntl is None:
            with _local_guard:
                lock = _local_locks.setdefault(str(self.partial), threading.Lock())
            return lock.acquire(blocking=False)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _unlock(self, fd: int) -> None:
        if fcntl is None:
            _local_locks[str(self.partial)].release()
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _wait_lock(self, fd: int) -> None:
        """Take the blob's download lock; while another pull holds it, report that pull's progress."""
        while not self._try_lock(fd):
            if self.stop.is_set():
                raise errors.Cancelled()
            parts = _load_state(self.state, self.digest, self.size)
            if parts:
                self.progress(sum(p.done for p in parts))
            time.sleep(0.05)

    def run(self) -> None:
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.partial, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
            try:
                self._wait_lock(fd)
                try:
                    if self._settled(fd):
                        return
                    if not self._same_file(fd):
                        continue  # the file we locked was renamed or removed meanwhile: open the new one
                    self._download(fd)
                    self._verify_and_commit(fd)
                    return
                finally:
                    if self.hasher is not None:
                        self.hasher.close()
                    self._unlock(fd)
            finally:
                os.close(fd)

    def _same_file(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.partial))
        except FileNotFoundError:
            return False

    def _settled(self, fd: int) -> bool:
        """True when the blob is in the store already (another pull finished it while we waited)."""
        if not self.final.is_file():
            return False
        if self._same_file(fd):
            self.partial.unlink(missing_ok=True)  # the empty file we created; nobody writes it (we hold its lock)
            self.state.unlink(missing_ok=True)
        self.progress(self.size)
        return True

    # -- transfer --------------------------------------------------------------------------------------------

    def _persist(self, fd: int) -> None:
        with self.state_lock:
            os.fsync(fd)  # the bytes the state vouches for are on disk before the state is
            obj = {"digest": self.digest, "size": self.size, "parts": [[p.start, p.size, p.done] for p in self.parts]}
            tmp = self.state.with_name(self.state.name + ".tmp")
            tmp.write_text(json.dumps(obj))
            os.replace(tmp, self.state)

    def _report(self) -> None:
        self.progress(self._done())

    def _download(self, fd: int) -> None:
        self.parts = _load_state(self.state, self.digest, self.size) or _plan(self.size)
        if os.fstat(fd).st_size != self.size:
            if any(p.done for p in self.parts):
                self.parts = _plan(self.size)  # state without its data (file replaced): start over
            try:
                os.ftruncate(fd, self.size)  # sparse: parts write at their offsets
            except OSError as e:
                self._raise_os(e)
        self._persist(fd)
        self._report()
        self.hasher = _TrailingHash(fd, self.size, self._frontier)
        try:
            self._run_parts(fd)
        except _NoRanges:
            self.hasher.close()  # the single request rewrites from byte 0: hash what it writes
            self.parts = [_Part(0, self.size)]
            self._persist(fd)
            self.hasher = _TrailingHash(fd, self.size, self._frontier)
            self._run_parts(fd)

    def _frontier(self) -> int:
        """Bytes from offset 0 that are on disk without a gap."""
        n = 0
        for p in self.parts:
            n += p.done
            if p.done < p.size:
                break
        return n

    def _run_parts(self, fd: int) -> None:
        """Fetch the unfinished parts in offset order from a shared queue. One stream to start with; another is
        added (up to STREAMS) while each stream is slower than SLOW_STREAM_BPS, i.e. the link, not this machine,
        is the limit. Parts taken in order keep the written prefix contiguous for the trailing hash."""
        todo = deque(p for p in self.parts if p.done < p.size)
        if not todo:
            return
        self.abort.clear()
        failures: list[BaseException] = []
        guard = threading.Lock()
        ended = threading.Event()  # a stream finished or failed: the coordinator looks again

        def worker() -> None:
            try:
                while not self.abort.is_set():
                    with guard:
                        if not todo:
                            return
                        part = todo.popleft()
                    self._fetch_part(fd, part)
            except BaseException as e:  # noqa: BLE001 - collected, re-raised by the coordinating thread
                failures.append(e)
                self.abort.set()  # the other streams stop at their next chunk
            finally:
                ended.set()

        threads: list[threading.Thread] = []

        def add_stream() -> None:
            t = threading.Thread(target=worker, name=f"pull-part-{len(threads)}", daemon=True)
            threads.append(t)
            t.start()

        add_stream()
        try:
            last_done, last_t = self._done(), time.monotonic()
            while any(t.is_alive() for t in threads):
                ended.wait(PERSIST_S)
                ended.clear()
                self._persist(fd)
                now, done = time.monotonic(), self._done()
                active = sum(t.is_alive() for t in threads)
                rate = (done - last_done) / max(now - last_t, 1e-6) / max(active, 1)
                if todo and len(threads) < STREAMS and rate < SLOW_STREAM_BPS and not self.abort.is_set():
                    add_stream()
                last_done, last_t = done, now
        finally:
            self.abort.set()  # no-op when all finished; on unwinding, the streams stop
            for t in threads:
                t.join()
            self._persist(fd)
        if failures:
            # The most telling error first: a refusal beats the cancellations it caused in the other streams.
            failures.sort(key=lambda e: isinstance(e, errors.Cancelled))
            raise failures[0]

    def _done(self) -> int:
        return sum(p.done for p in self.parts)

    def _fetch_part(self, fd: int, p: _Part) -> None:
        attempts = 0
        while p.done < p.size:
            if self.stop.is_set() or self.abort.is_set():
                raise errors.Cancelled()
            before = p.done
            try:
                self._stream_part(fd, p)
            except _Transient as e:
                attempts = 1 if p.done > before else attempts + 1
                if attempts > RETRIES:
                    raise MirrorError(f"downloading {self.digest} failed after {RETRIES} retries: {e}") from None
                if self.stop.wait(min(BACKOFF_S * 2 ** (attempts - 1), BACKOFF_MAX_S)):
                    raise errors.Cancelled() from None

    def _stream_part(self, fd: int, p: _Part) -> None:
        start, end = p.start + p.done, p.start + p.size - 1
        buf = memoryview(bytearray(CHUNK))  # (CHUNK,) bytes reused for every read of this request
        with contextlib.closing(self.src.open_blob(self.digest, {"Range": f"bytes={start}-{end}"})) as r:
            self._check_reply(r, start, end)
            for chunk in r.chunks(buf):
                if p.done + len(chunk) > p.size:
                    raise MirrorError(f"the mirror sent more bytes than the {self.size} the manifest declares for "
                                      f"{self.digest}; refused")
                try:
                    _write_at(fd, chunk, p.start + p.done)
                except OSError as e:
                    self._raise_os(e)
                p.done += len(chunk)
                self._report()
                if self.stop.is_set() or self.abort.is_set():
                    raise errors.Cancelled()
        if p.done < p.size:
            raise _Transient(f"the connection ended {p.size - p.done} bytes early")

    def _check_reply(self, r: "_BlobResponse", start: int, end: int) -> None:
        code = r.status_code
        if code in (408, 429, 500, 502, 503, 504):
            raise _Transient(f"HTTP {code}")
        if code == 404:
            raise MirrorError(f"the mirror has no blob {self.digest}")
        if code == 200:
            if start != 0 or end != self.size - 1:
                raise _NoRanges()
        elif code == 206:
            want = f"bytes {start}-{end}/{self.size}"
            if r.headers.get("content-range", "").strip() != want:
                raise MirrorError(f"the mirror answered Content-Range {r.headers.get('content-range')!r} for a "
                                  f"request of {want}; refused")
        else:
            raise MirrorError(f"unexpected HTTP {code} for blob {self.digest}: {r.peek()}")
        _refuse_encoding(r, f"blob {self.digest}")
        length = r.headers.get("content-length")
        if length is not None and length.strip() != str(end - start + 1):
            raise MirrorError(f"the mirror declares {length} bytes for bytes {start}-{end} of {self.digest} "
                              f"(the manifest says the blob has {self.size}); refused")

    def _raise_os(self, e: OSError) -> None:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientSpace(
                f"disk full while pulling {self.digest}: the partial download is kept in {self.partial.parent} and "
                "resumes on the next pull once space is freed") from None
        raise e

    # -- verification ------------------------------------------------------------------------------------------

    def _verify_and_commit(self, fd: int) -> None:
        assert self.hasher is not None  # made by _download
        actual, pos = self.hasher.finish(self.stop)
        if actual != self.digest or pos != self.size:
            self.partial.unlink(missing_ok=True)
            self.state.unlink(missing_ok=True)
            raise BlobMismatch(f"digest mismatch, file must be downloaded again: want {self.digest}, got {actual}; "
                               "its data was discarded, the model's other blobs are kept")
        os.fsync(fd)
        commit_partial(self.store, self.partial, self.digest)
        self.state.unlink(missing_ok=True)


class _Bounded:
    """A reader that yields at most `limit + 1` bytes (one extra byte proves the source is too long) and stops
    on cancel."""

    def __init__(self, f: BinaryIO, limit: int, stop: threading.Event):
        self.f, self.left, self.stop = f, limit + 1, stop

    def read(self, n: int = -1) -> bytes:
        if self.stop.is_set():
            raise errors.Cancelled()
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n) if n > 0 else b""
        self.left -= len(data)
        return data


def fetch_local(source, store: st.Store, digest: str, size: int, progress, stop: threading.Event) -> None:
    """Copy one blob from a folder or bundle into the store, hashed and size-checked on the way."""
    with source.open_blob(digest, size) as f:
        try:
            store.write_blob(_Bounded(f, size, stop), digest, size, progress)
        except (st.DigestMismatch, st.SizeMismatch) as e:
            raise BlobMismatch(f"{e}; nothing was stored for it") from None
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise InsufficientSpace(f"disk full while importing {digest}; nothing was stored for it") from None
            raise


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
        raise InsufficientSpace(f"not enough disk space: this pull needs {need} more bytes (+{FREE_RESERVE} "
                                f"reserve) but {blobs} has {free} bytes free")


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
        return lambda progress: source.fetch(store, digest, size, progress, stop)
    return lambda progress: fetch_local(source, store, digest, size, progress, stop)


def _pull(store: st.Store, name: str, insecure: bool, default_registry: str | None, stop: threading.Event,
          token: str | None) -> Iterator[dict]:
    source, local_name, pick = resolve(name, insecure, default_registry, token)
    try:
        yield from _pull_from(store, source, local_name, pick, stop)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientSpace(f"disk full while pulling {name}; the store is unchanged apart from "
                                    "resumable partial downloads") from None
        raise
    finally:
        source.close()


def _missing(store: st.Store, blobs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The blobs not stored yet. A stored blob of another size than the manifest says means the manifest lies."""
    out = []
    for d, size in blobs:
        have = _stored_size(store, d)
        if have is not None and have != size:
            raise MirrorError(f"the manifest says {d} has {size} bytes, but the stored blob with that digest "
                              f"has {have}")
        if have is None:
            out.append((d, size))
    return out


def _pull_from(store: st.Store, source, local_name: names.ModelName | None, pick: str | None,
               stop: threading.Event) -> Iterator[dict]:
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
