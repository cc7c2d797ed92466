"""Folders and archives that hold models: the sources of offline pulls and imports (a store, an Ollama models
directory, a localrt bundle, a tar of any of these, one manifest file). Everything in them is untrusted: names
are checked, members are bounded, blobs are hashed on the way into the store."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import tarfile
import threading
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator

import store as st
from store import digest as dg
from store import manifests as mf
from store import names

from .. import errors
from .registry import BlobMismatch, InsufficientSpace, MirrorError, RegistryError

MARKER = "localrt-bundle.json"
SUMS = "SHA256SUMS"
MAX_MEMBERS = 100_000  # a real bundle has a few files per model
MAX_SUMS_BYTES = 16 << 20
COPY_CHUNK = 4 << 20
_SUM_LINE = re.compile(r"([0-9a-f]{64}) [ *](\S.*)")


class BundleError(RegistryError):
    pass


def _sha256_of(f: BinaryIO, sink=None) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    while block := f.read(COPY_CHUNK):
        h.update(block)
        n += len(block)
        if sink is not None:
            sink(block)
    return h.hexdigest(), n


def _parse_sums(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, line in enumerate(data.decode("utf-8", "strict").splitlines(), 1):
        if not line.strip():
            continue
        m = _SUM_LINE.fullmatch(line.strip())
        if not m:
            raise BundleError(f"{SUMS} line {i} is not '<sha256>  <path>'")
        out[m.group(2)] = m.group(1)
    return out


def _pick(models: list[tuple[names.ModelName, str]], pick: str | None) -> tuple[names.ModelName, str]:
    """The one model `pick` names (full name first, then namespace/model:tag under any host), or the only one."""
    if pick is None:
        if len(models) == 1:
            return models[0]
        listed = ", ".join(sorted(n.display for n, _ in models)) or "none"
        raise BundleError(f"the source holds {len(models)} models ({listed}); name one with '#<model>'")
    want = names.parse(pick)
    for n, rel in models:
        if n.key == want.key:
            return n, rel
    for n, rel in models:
        if n.key[1:] == want.key[1:]:
            return n, rel
    raise st.ManifestNotFound(want.display)


class Source:
    """Models readable from a folder or archive. Subclasses provide `_files()`, `_read()`, `_open()`."""

    def __init__(self, where: str):
        self.where = where
        self.sums: dict[str, str] | None = None
        self.is_bundle = False

    def models(self) -> list[tuple[names.ModelName, str]]:
        out = []
        for rel in self._files():
            parts = PurePosixPath(rel).parts
            if len(parts) == 5 and parts[0] == "manifests":
                try:
                    out.append((names.from_path_parts(parts[1:]), rel))
                except st.InvalidName:
                    continue  # temp files and strays in a models directory are not models
        return out

    def manifest(self, pick: str | None) -> tuple[names.ModelName, bytes]:
        name, rel = _pick(self.models(), pick)
        data = self._read(rel, mf.MAX_MANIFEST_BYTES)
        self._check_sum(rel, hashlib.sha256(data).hexdigest())
        return name, data

    def _check_sum(self, rel: str, hex_digest: str) -> None:
        if self.sums is None:
            return
        listed = self.sums.get(rel)
        if listed is None:
            raise BundleError(f"{rel} is not listed in the bundle's {SUMS}")
        if listed != hex_digest:
            raise BlobMismatch(f"{rel} does not match its {SUMS} entry")  # no hash of a file the caller did not send

    def _blob_rel(self, digest: str) -> str:
        return f"blobs/{dg.to_filename(digest)}"

    @contextlib.contextmanager
    def open_blob(self, digest: str, size: int) -> Iterator[BinaryIO]:
        rel = self._blob_rel(digest)
        if self.sums is not None and self.sums.get(rel) not in (None, digest[7:]):
            raise BlobMismatch(f"{rel} is listed in {SUMS} with another hash")
        with self._open(rel, size) as f:
            yield f

    def _load_sums(self) -> None:
        files = set(self._files())
        if SUMS in files:
            self.sums = _parse_sums(self._read(SUMS, MAX_SUMS_BYTES))
        self.is_bundle = MARKER in files
        if self.is_bundle and self.sums is None:
            raise BundleError(f"{self.where} is a localrt bundle without its {SUMS} list")

    def close(self) -> None:
        pass


class DirSource(Source):
    def __init__(self, root: Path):
        super().__init__(str(root))
        self.root = root
        self._real_root = os.path.realpath(root)  # what every file's folder must resolve inside (_open_regular)
        if not (root / "manifests").is_dir():
            raise BundleError(f"{root} holds no models (no manifests/ directory)")
        self._listing: list[str] | None = None
        self._load_sums()

    def _files(self) -> list[str]:
        if self._listing is None:
            out = [n for n in (MARKER, SUMS) if (self.root / n).is_file()]
            base = self.root / "manifests"
            for dirpath, dirnames, filenames in os.walk(base):
                depth = len(Path(dirpath).relative_to(base).parts)
                if depth >= 3:
                    dirnames[:] = []
                if depth == 3:
                    out += [Path(dirpath, f).relative_to(self.root).as_posix() for f in filenames]
            self._listing = out
        return self._listing

    def _open_regular(self, path: Path) -> BinaryIO:
        """A regular file inside the folder, opened without following a link: the daemon may read what the caller
        may not (a blob linked to a root-only file), so a link, or a folder on the way that leads out, is refused."""
        # O_NONBLOCK: opening a FIFO planted in a shared folder must not hang; only regular files are read.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
        parent = os.path.realpath(path.parent)
        if parent != self._real_root and not parent.startswith(self._real_root + os.sep):
            raise MirrorError(f"{path.relative_to(self.root)} leads out of {self.root} through a link; refused")
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise st.BlobNotFound(path.name) from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
                raise MirrorError(f"{path.relative_to(self.root)} is a link; refused") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise MirrorError(f"{path} is not a regular file; refused")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    def _read(self, rel: str, cap: int) -> bytes:
        with self._open_regular(self.root / rel) as f:
            data = f.read(cap + 1)
        if len(data) > cap:
            raise MirrorError(f"{rel} is larger than {cap} bytes; refused")
        return data

    def _blob_file(self, rel: str) -> Path:
        p = self.root / rel
        if not p.exists():
            legacy = p.with_name(p.name.replace("sha256-", "sha256:", 1))  # old Ollama on Linux/macOS
            if legacy.exists():
                return legacy
        return p

    @contextlib.contextmanager
    def _open(self, rel: str, size: int) -> Iterator[BinaryIO]:
        f = self._open_regular(self._blob_file(rel))
        with f:
            have = os.fstat(f.fileno()).st_size
            if have != size:
                # not how many it has: the caller did not send this file
                raise BlobMismatch(f"{rel} in {self.where} does not have the {size} bytes the manifest says")
            yield f


def _member_name(member: tarfile.TarInfo) -> str:
    """The member's name if it is safe to consider at all; refuses links, devices and paths that climb out."""
    name = member.name
    if "\x00" in name or "\\" in name or name.startswith("/") or re.match(r"[A-Za-z]:", name):
        raise BundleError(f"archive member {name!r} has an absolute or non-portable path; refused")
    parts = [p for p in PurePosixPath(name).parts if p not in (".", "")]
    if any(p == ".." for p in parts):
        raise BundleError(f"archive member {name!r} would land outside the store; refused")
    if not (member.isreg() or member.isdir()):
        raise BundleError(f"archive member {name!r} is a link or special file; refused")
    return "/".join(parts)


_STRAY = re.compile(r"\.locks(/.*)?|blobs/(\.tmp-[^/]*|sha256-[0-9a-f]{64}-partial(\.json)?)")


def _stray(rel: str) -> bool:
    """Leftovers a live models directory holds (lock files, temp files, partial downloads): never read."""
    return bool(_STRAY.fullmatch(rel))


def _allowed(rel: str) -> bool:
    parts = rel.split("/")
    if rel in (MARKER, SUMS, "manifests", "blobs"):
        return True
    if parts[0] == "blobs":
        return len(parts) == 2 and dg.from_filename(parts[1]) is not None
    if parts[0] == "manifests":
        return 2 <= len(parts) <= 5
    return False


class TarSource(Source):
    def __init__(self, path: Path):
        super().__init__(str(path))
        try:
            self.tar = tarfile.open(path, mode="r:")  # uncompressed only: members are read in place, by offset
        except tarfile.ReadError as e:
            raise BundleError(f"{path} is not an uncompressed tar archive ({e})") from None
        self.members: dict[str, tarfile.TarInfo] = {}
        try:
            self._index()
            self._load_sums()
        except BaseException:
            self.tar.close()
            raise

    def _index(self) -> None:
        found: list[tuple[str, tarfile.TarInfo]] = []
        for i, member in enumerate(self.tar):
            if i >= MAX_MEMBERS:
                raise BundleError(f"the archive has more than {MAX_MEMBERS} members; refused")
            rel = _member_name(member)
            if rel:
                found.append((rel, member))
        # `tar -C ~/.ollama -cf x.tar models` wraps everything in one folder: look through it.
        tops = {rel.split("/")[0] for rel, _ in found}
        prefix = ""
        if len(tops) == 1 and not _allowed(next(iter(tops))):
            prefix = next(iter(tops)) + "/"
        for rel, member in found:
            if prefix and rel + "/" == prefix:
                continue
            rel = rel[len(prefix) :]
            if _stray(rel):
                continue
            if not _allowed(rel):
                raise BundleError(f"archive member {member.name!r} is not part of a models directory; refused")
            if rel in self.members:
                raise BundleError(f"archive member {member.name!r} appears twice; refused")
            self.members[rel] = member
        if not any(r.startswith("manifests/") for r in self.members):
            raise BundleError(f"{self.where} holds no models (no manifests/ entries)")

    def _files(self) -> list[str]:
        return [r for r, m in self.members.items() if m.isreg()]

    def _member(self, rel: str) -> tarfile.TarInfo:
        m = self.members.get(rel)
        if m is None or not m.isreg():
            if rel.startswith("blobs/"):
                raise st.BlobNotFound(dg.from_filename(rel[6:]) or rel)
            raise BundleError(f"{rel} is missing from {self.where}")
        return m

    def _read(self, rel: str, cap: int) -> bytes:
        m = self._member(rel)
        if m.size > cap:
            raise MirrorError(f"{rel} is larger than {cap} bytes; refused")
        f = self.tar.extractfile(m)
        assert f is not None  # a regular member always has a file object
        return f.read()

    @contextlib.contextmanager
    def _open(self, rel: str, size: int) -> Iterator[BinaryIO]:
        m = self._member(rel)
        if m.size != size:
            raise BlobMismatch(f"{rel} in {self.where} does not have the {size} bytes the manifest says")
        f = self.tar.extractfile(m)
        assert f is not None
        with f:
            yield f

    def close(self) -> None:
        self.tar.close()


def open_source(path: Path) -> Source:
    """A folder holding a store or bundle, or a tar of one. Raises BundleError when it is neither.

    Missing, unreadable and unrelated paths all get the same message, so /api/pull with a path cannot be used
    to probe which files exist on the daemon's machine (the CVE-2024-39719 oracle)."""
    path = Path(path)
    nothing = BundleError(f"{path} is not a models folder, bundle or tar archive")
    try:
        if path.is_dir() and (path / "manifests").is_dir():
            return DirSource(path)
        if path.is_file() and tarfile.is_tarfile(path):
            return TarSource(path)
    except OSError:
        raise nothing from None
    raise nothing


def _manifest_file_source(path: Path) -> tuple[Source, str] | None:
    """`<models>/manifests/<host>/<ns>/<model>/<tag>`: the models directory and that one model."""
    parents = path.resolve().parents
    if path.is_file() and len(parents) >= 5 and parents[3].name == "manifests":
        parts = path.resolve().parts[-4:]
        return DirSource(parents[4]), names.from_path_parts(parts).full
    return None


# ----- export -----------------------------------------------------------------------------------------------------


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
        except (st.DigestMismatch, st.SizeMismatch):
            # not what was read instead: the caller did not send the file, and its hash or size would tell its content
            raise BlobMismatch(f"{digest} does not match the file read for it; nothing was stored for it") from None
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise InsufficientSpace(f"disk full while importing {digest}; nothing was stored for it") from None
            raise
