"""One registry blob into the store, resumably: parallel `Range` parts into `blobs/sha256-<hex>-partial`, with a
state file `...-partial.json` saying how far each part got (data is fsynced before the state that vouches for
it), so a pull killed or cut off anywhere resumes from what is on disk. One exclusive lock on the partial file
makes concurrent pulls of one blob (threads or processes) do one transfer. A finished blob is hashed before it
is renamed into the store; a mismatch deletes that blob's data only."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import store as st
from store import digest as dg

from .. import errors
from .registry import BlobMismatch, InsufficientSpace, MirrorError, commit_partial
from .transport import (
    STREAMS,
    RegistrySource,
    _BlobResponse,
    _NoRanges,
    _refuse_encoding,
    _Transient,
)

try:
    import fcntl
except ImportError:  # Windows: a process-local lock stands in for flock
    fcntl = None  # type: ignore[assignment]


SLOW_STREAM_BPS = 32 << 20  # below this per stream the link is the limit and another stream may help
MAX_PARTS = 16
PART_MIN = 16 << 20  # bytes; smaller blobs download in one request
PART_MAX = 1000 * 10**6
CHUNK = 256 << 10  # bytes per read from a response: progress granularity on slow links
RETRIES = 6  # per part, counted only while no byte arrives
BACKOFF_S = 0.5
BACKOFF_MAX_S = 8.0
PERSIST_S = 1.0  # how often the part state is saved


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
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
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
                    raise MirrorError(
                        f"the mirror sent more bytes than the {self.size} the manifest declares for "
                        f"{self.digest}; refused"
                    )
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
                raise MirrorError(
                    f"the mirror answered Content-Range {r.headers.get('content-range')!r} for a "
                    f"request of {want}; refused"
                )
        else:
            raise MirrorError(f"unexpected HTTP {code} for blob {self.digest}: {r.peek()}")
        _refuse_encoding(r, f"blob {self.digest}")
        length = r.headers.get("content-length")
        if length is not None and length.strip() != str(end - start + 1):
            raise MirrorError(
                f"the mirror declares {length} bytes for bytes {start}-{end} of {self.digest} "
                f"(the manifest says the blob has {self.size}); refused"
            )

    def _raise_os(self, e: OSError) -> None:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientSpace(
                f"disk full while pulling {self.digest}: the partial download is kept in {self.partial.parent} and "
                "resumes on the next pull once space is freed"
            ) from None
        raise e

    # -- verification ------------------------------------------------------------------------------------------

    def _verify_and_commit(self, fd: int) -> None:
        assert self.hasher is not None  # made by _download
        actual, pos = self.hasher.finish(self.stop)
        if actual != self.digest or pos != self.size:
            self.partial.unlink(missing_ok=True)
            self.state.unlink(missing_ok=True)
            raise BlobMismatch(
                f"digest mismatch, file must be downloaded again: want {self.digest}, got {actual}; "
                "its data was discarded, the model's other blobs are kept"
            )
        os.fsync(fd)
        commit_partial(self.store, self.partial, self.digest)
        self.state.unlink(missing_ok=True)
