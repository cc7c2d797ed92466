"""One daemon per port and data directory: an OS lock held for the daemon's whole life, and beside it a record
of that daemon (pid, address, log, version) for `serve --status`, `serve --stop` and the auto-start of `run`.

The lock is fcntl.flock on POSIX and msvcrt.locking on Windows. Both belong to the open file and the OS drops
them when the process ends, however it ends, so a crash never leaves a stale lock for the next start to
second-guess; and the record is believed only while its lock is held (a pid alone may have been reused).
The lock files themselves are never deleted: unlinking a lock file lets two processes lock two different files.

No HTTP and no heavy imports here: `localrt serve` takes the lock before it imports the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt

CLAIM_WAIT_S = 1.0  # a status probe holds the lock for microseconds: a starting daemon retries this long first
RECORD_WAIT_S = 1.0  # the record is written just after the lock is taken: a reader waits this long for it
POLL_S = 0.02


class LockError(RuntimeError):
    """The lock file cannot be created or locked (a read-only data directory, a file system without locks)."""


class AlreadyRunning(RuntimeError):
    """Another daemon of this data directory holds the port."""

    def __init__(self, info: DaemonInfo):
        pid = f"pid {info.pid}" if info.pid else "pid unknown yet"
        super().__init__(f"already running ({pid}) on {info.url}")
        self.info = info


@dataclass(frozen=True)
class DaemonInfo:
    pid: int | None  # None only while the daemon that holds the lock has not written its record yet
    url: str
    log: str | None  # the file its output goes to; None when that is a terminal or a pipe
    version: str
    started: float  # time.time() at its start


def _paths(config) -> tuple[Path, Path, Path]:
    """(daemon lock, record, start lock) of config's port in config's data directory."""
    run = Path(config.data_dir) / "run"
    stem = f"daemon-{config.port}"
    return run / f"{stem}.lock", run / f"{stem}.json", run / f"{stem}.start.lock"


def _try_lock(fd: int) -> bool:
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as e:
            raise LockError(f"cannot lock a file: {e.strerror}") from None
        return True
    os.lseek(fd, 0, os.SEEK_SET)  # msvcrt locks bytes from the file position: always byte 0
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:  # EACCES / EDEADLOCK: another process holds it
        return False
    return True


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def _open(path: Path, create: bool) -> int | None:
    """The lock file's descriptor (not inherited by children); None when it does not exist and not `create`."""
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        if create:
            raise LockError(f"cannot create {path}") from None
        return None
    except OSError as e:
        raise LockError(f"cannot create {path}: {e.strerror}") from None


def _lock(path: Path, wait: float) -> int | None:
    """Lock `path` (created if missing), retrying for up to `wait` seconds; its descriptor, or None if held."""
    fd = _open(path, create=True)
    deadline = time.monotonic() + wait
    while not _try_lock(fd):
        if time.monotonic() >= deadline:
            os.close(fd)
            return None
        time.sleep(POLL_S)
    return fd


def _release(fd: int) -> None:
    try:
        _unlock(fd)
    finally:
        os.close(fd)


def _write_record(path: Path, info: DaemonInfo) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(info)), encoding="utf-8")
    os.replace(tmp, path)  # whole or absent for a reader, never half written


def _read_record(path: Path) -> DaemonInfo | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return DaemonInfo(**data)
    except (OSError, ValueError, TypeError):
        return None


class Claim:
    """This process is the daemon of its port and data directory until release()."""

    def __init__(self, fd: int, record: Path):
        self._fd: int | None = fd
        self._record = record

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self._record.unlink()  # first: a record without its lock must not outlive the lock by much
        _release(self._fd)
        self._fd = None


def claim(config, log: str | None, version: str, wait: float = CLAIM_WAIT_S) -> Claim:
    """Take the port's lock and write this process's record. Raises AlreadyRunning, LockError."""
    lock, record, _ = _paths(config)
    fd = _lock(lock, wait)
    if fd is None:
        raise AlreadyRunning(_holder(config, record))
    try:
        _write_record(record, DaemonInfo(os.getpid(), config.base_url, log, version, time.time()))
    except OSError as e:
        _release(fd)
        raise LockError(f"cannot write {record}: {e.strerror}") from None
    return Claim(fd, record)


def _holder(config, record: Path) -> DaemonInfo:
    """The record of the daemon that holds the lock, waiting a moment for one that has just taken it."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while True:
        info = _read_record(record)
        if info is not None or time.monotonic() >= deadline:
            return info or DaemonInfo(None, config.base_url, None, "", 0.0)
        time.sleep(POLL_S)


def running(config) -> DaemonInfo | None:
    """The record of this data directory's daemon on config's port, or None when none runs. Creates nothing."""
    lock, record, _ = _paths(config)
    fd = _open(lock, create=False)
    if fd is None:
        return None
    try:
        if _try_lock(fd):
            _unlock(fd)
            return None
    finally:
        os.close(fd)
    return _holder(config, record)


def recorded(config) -> DaemonInfo | None:
    """The record as it is on disk, without asking the lock (it may be a dead daemon's): for a client that
    waits for the daemon it started to write its own."""
    return _read_record(_paths(config)[1])


@contextlib.contextmanager
def starting(config, wait: float) -> Iterator[bool]:
    """Held by a client while it decides to start a daemon and until that daemon holds its lock, so that two
    clients starting at once start one daemon. Yields False when it could not be had within `wait` seconds
    (the daemon's own lock still keeps it to one daemon)."""
    fd = _lock(_paths(config)[2], wait)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            _release(fd)
