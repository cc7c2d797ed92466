"""Inter-thread and inter-process locks for the store: a thread lock plus an advisory file lock.

File locks use flock(2) on POSIX (held per open file, so two threads of one process exclude each other
too) and msvcrt.locking on Windows. Lock files live in `<root>/.locks/`, a fixed set of 256 files keyed by
the first two hex digits of a digest, so they never pile up and never need deleting (deleting lock files
that others may be waiting on is racy)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    with _thread_locks_guard:
        lock = _thread_locks.get(key)
        if lock is None:
            lock = _thread_locks[key] = threading.Lock()
        return lock


def _lock_fd(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
    else:
        # msvcrt.LK_LOCK retries for about 10 s and then raises; loop until it succeeds.
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
                return
            except OSError:
                continue


def _unlock_fd(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` (created if missing) against other threads and processes."""
    with _thread_lock(str(lock_file)):
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock_fd(fd)
            try:
                yield
            finally:
                _unlock_fd(fd)
        finally:
            os.close(fd)


def digest_lock_file(root: Path, hex_digest: str) -> Path:
    return root / ".locks" / f"blob-{hex_digest[:2]}.lock"


def store_lock_file(root: Path) -> Path:
    return root / ".locks" / "store.lock"
