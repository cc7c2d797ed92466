"""Content-addressed blob files `<root>/blobs/sha256-<hex>`.

A write never exposes a partial blob: bytes are hashed while they stream into a temp file in the blobs
directory, the file is fsynced, then renamed into place atomically. A per-digest lock (thread + file)
makes two writers of the same blob do one write; both see success."""

from __future__ import annotations

import io
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from . import digest as dg
from .errors import BlobNotFound, DigestMismatch, ReadOnlyStore, SizeMismatch, UnsafePath
from .locks import digest_lock_file, locked

try:
    import fcntl
except ImportError:  # Windows: no way to see another process's pull; its partial files are judged by age
    fcntl = None  # type: ignore[assignment]

# A pull's resumable download (localrt/distribution/download.py): `sha256-<hex>-partial`, its state file
# `-partial.json` and that file's temp `-partial.json.tmp`. A pull in progress holds flock on the data file.
_PARTIAL = re.compile(r"sha256-([0-9a-f]{64})-partial(\.json(\.tmp)?)?")
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".partial"
BLOB_MODE = 0o644  # readable by other users of a shared models directory, as Ollama writes them


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int
    created: bool  # False when the blob was already stored (nothing written)


def _fsync_dir(path: Path) -> None:
    # Makes a rename durable on POSIX; directories cannot be opened this way on Windows.
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobDir:
    """The `blobs/` directory of one models root."""

    def __init__(self, root: Path, writable: bool = True):
        self.root = Path(root)
        self.dir = self.root / "blobs"
        self.writable = writable

    def path(self, digest: str) -> Path:
        """Where the blob with this (validated) digest lives in this root, existing or not."""
        p = self.dir / dg.to_filename(digest)
        base = os.path.realpath(self.dir)
        # The file name is pure hex, so this only fails if something is badly wrong; never trust it blindly.
        if os.path.dirname(os.path.join(base, p.name)) != base:
            raise UnsafePath(str(p))
        return p

    def _legacy_path(self, digest: str) -> Path | None:
        # Old Ollama versions named blobs `sha256:<hex>` (':' is not allowed in Windows file names).
        return self.dir / dg.validate(digest) if os.name == "posix" else None

    def find(self, digest: str) -> Path | None:
        """The stored file of `digest` in this root (the `sha256-` name, else a legacy `sha256:` one), or None."""
        p = self.path(digest)
        if p.is_file():
            return p
        legacy = self._legacy_path(digest)
        return legacy if legacy is not None and legacy.is_file() else None

    def exists(self, digest: str) -> bool:
        return self.find(digest) is not None

    def size(self, digest: str) -> int:
        p = self.find(digest)
        if p is None:
            raise BlobNotFound(digest)
        return p.stat().st_size

    def digests(self) -> Iterator[str]:
        """Every validly named blob file in this root (each digest once)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return
        seen = set()
        for name in sorted(names):
            d = dg.from_filename(name) or (name if dg.is_digest(name) else None)
            if d is not None and d not in seen and (self.dir / name).is_file():
                seen.add(d)
                yield d

    def migrate_legacy(self) -> list[str]:
        """Rename legacy `sha256:<hex>` blob files to `sha256-<hex>` (what Ollama does at start-up)."""
        if not self.writable or os.name != "posix":
            return []
        moved = []
        for name in os.listdir(self.dir) if self.dir.is_dir() else []:
            if dg.is_digest(name):
                with locked(digest_lock_file(self.root, name[7:])):
                    if self.path(name).exists():
                        (self.dir / name).unlink()
                    else:
                        os.replace(self.dir / name, self.path(name))
                moved.append(name)
        return moved

    def temp_files(self) -> list[Path]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return [self.dir / n for n in names if n.startswith(TEMP_PREFIX) and n.endswith(TEMP_SUFFIX)]

    def write(
        self,
        src: BinaryIO | bytes,
        expected_digest: str | None = None,
        expected_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> BlobInfo:
        """Store the bytes of `src` (a readable binary stream or bytes) and return their digest.

        With `expected_digest` the blob is written under its lock, skipped without reading `src` if it is
        already stored, and rejected (DigestMismatch, nothing stored) if the bytes hash differently."""
        if not self.writable:
            raise ReadOnlyStore(str(self.root))
        if isinstance(src, (bytes, bytearray, memoryview)):
            src = io.BytesIO(bytes(src))
        if expected_digest is not None:
            dg.validate(expected_digest)
            with locked(digest_lock_file(self.root, expected_digest[7:])):
                if self.exists(expected_digest):
                    return self._existing(expected_digest, expected_size)
                tmp, digest, size = self._stream_to_temp(src, progress)
                return self._commit(tmp, digest, size, expected_digest, expected_size)
        tmp, digest, size = self._stream_to_temp(src, progress)
        with locked(digest_lock_file(self.root, digest[7:])):
            return self._commit(tmp, digest, size, None, expected_size)

    def _existing(self, digest: str, expected_size: int | None) -> BlobInfo:
        size = self.size(digest)
        if expected_size is not None and size != expected_size:
            raise SizeMismatch(digest, expected_size, size)
        return BlobInfo(digest, size, created=False)

    def _stream_to_temp(self, src: BinaryIO, progress) -> tuple[Path, str, int]:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=self.dir)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                digest, size = dg.of_stream(src, sink=out.write, progress=progress)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, BLOB_MODE)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp, digest, size

    def _commit(self, tmp: Path, digest: str, size: int, expected: str | None, expected_size: int | None) -> BlobInfo:
        try:
            if expected is not None and digest != expected:
                raise DigestMismatch(expected, digest)
            if expected_size is not None and size != expected_size:
                raise SizeMismatch(digest, expected_size, size)
            if self.exists(digest):
                return BlobInfo(digest, size, created=False)
            os.replace(tmp, self.path(digest))
            _fsync_dir(self.dir)
            return BlobInfo(digest, size, created=True)
        finally:
            tmp.unlink(missing_ok=True)

    def new_temp(self) -> Path:
        """A fresh, empty temp file in the blobs directory, for a producer that writes a blob itself
        (e.g. quantization output) and then hands it to `adopt`."""
        if not self.writable:
            raise ReadOnlyStore(str(self.root))
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=self.dir)
        os.close(fd)
        return Path(name)

    def adopt(self, tmp: Path, progress: Callable[[int], None] | None = None) -> BlobInfo:
        """Hash a finished temp file from `new_temp` and rename it into place (no copy). The temp is gone after."""
        if Path(tmp).parent.resolve() != self.dir.resolve():
            tmp.unlink(missing_ok=True)
            raise UnsafePath(str(tmp))
        try:
            with open(tmp, "r+b") as f:
                digest, size = dg.of_stream(f, progress=progress)
                os.fsync(f.fileno())
            os.chmod(tmp, BLOB_MODE)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with locked(digest_lock_file(self.root, digest[7:])):
            return self._commit(tmp, digest, size, None, None)

    def remove(self, digest: str) -> bool:
        if not self.writable:
            raise ReadOnlyStore(str(self.root))
        with locked(digest_lock_file(self.root, digest[7:])):
            p = self.find(digest)
            if p is None:
                return False
            p.unlink()
            return True

    def rehash(self, digest: str) -> str:
        p = self.find(digest)
        if p is None:
            raise BlobNotFound(digest)
        return dg.of_file(p)[0]

    def partial_files(self) -> dict[str, list[Path]]:
        """Files of pulls that did not finish (or are running), by digest."""
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return {}
        out: dict[str, list[Path]] = {}
        for n in names:
            m = _PARTIAL.fullmatch(n)
            if m:
                out.setdefault("sha256:" + m.group(1), []).append(self.dir / n)
        return out

    def _partial_lock(self, digest: str, grace_s: float) -> int | None:
        """An fd holding the pull lock of `digest`'s partial file; None while a pull holds it (or, without flock,
        while the file is younger than `grace_s`). -1 when there is no data file, only state files."""
        data = self.dir / (dg.to_filename(digest) + "-partial")
        try:
            fd = os.open(data, os.O_RDWR | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            return -1
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif time.time() - os.fstat(fd).st_mtime < grace_s:
                raise BlockingIOError
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def partial_in_use(self, digest: str, grace_s: float = 600.0) -> bool:
        fd = self._partial_lock(digest, grace_s)
        if fd is not None and fd >= 0:
            os.close(fd)  # closing releases the lock
        return fd is None

    def remove_partial(self, digest: str, grace_s: float = 600.0) -> list[Path] | None:
        """Delete a pull's leftovers under its lock; None (nothing deleted) while a pull holds them. The pull
        protocol tolerates this: a pull that opened the file before it was unlinked sees that once it gets the
        lock, and starts over on a new file."""
        if not self.writable:
            raise ReadOnlyStore(str(self.root))
        fd = self._partial_lock(digest, grace_s)
        if fd is None:
            return None
        try:
            removed = []
            for p in self.partial_files().get(digest, []):
                try:
                    p.unlink()
                    removed.append(p)
                except FileNotFoundError:
                    continue
            return removed
        finally:
            if fd >= 0:
                os.close(fd)

    def stale_temp_files(self, older_than_s: float) -> list[Path]:
        now = time.time()
        out = []
        for p in self.temp_files():
            try:
                if now - p.stat().st_mtime >= older_than_s:
                    out.append(p)
            except FileNotFoundError:
                continue
        return out
