"""Export / import bundles, and reading a folder or archive that holds models (the sources of offline pulls).

A bundle is a directory or an uncompressed `.tar` laid out like a models directory, so a bundle directory is
itself a store another machine can pull from:

    localrt-bundle.json                      {"format": "localrt-bundle", "version": 1, "models": [...]}
    manifests/<host>/<namespace>/<model>/<tag>
    blobs/sha256-<hex>
    SHA256SUMS                               `sha256sum -c` format, one line per file above

Import reads a bundle, an Ollama models directory (`manifests/` + `blobs/`), one manifest file inside one, or a
tar of either. Every blob is hashed and size-checked while it is copied into the store; manifests are registered
only after every blob of every selected model is in; on failure the blobs this import added are removed again.
Archive members are never extracted by path: each must be a regular file or directory with one of the names
above, else the whole archive is refused."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import secrets
import tarfile
import threading
from pathlib import Path
from typing import BinaryIO, Callable

import store as st
from store import digest as dg
from store import manifests as mf
from store import names

from .registry import BlobMismatch, fsync_dir
from .sources import (
    MARKER,
    SUMS,
    BundleError,
    Source,
    _manifest_file_source,
    _pick,
    _sha256_of,
    fetch_local,
    open_source,
)


class _Writer:
    """Writes bundle files into a directory or a tar, recording each file's sha256."""

    def __init__(self, dest: Path, as_tar: bool):
        self.sums: list[tuple[str, str]] = []
        self.as_tar = as_tar
        self.dest = dest
        self.tmp = _new_temp(dest, as_tar)
        if as_tar:
            self.tar = tarfile.open(self.tmp, mode="w", format=tarfile.PAX_FORMAT)

    def add_bytes(self, rel: str, data: bytes) -> None:
        self.add_stream(rel, io.BytesIO(data), len(data))

    def add_stream(self, rel: str, src: BinaryIO, size: int) -> str:
        if self.as_tar:
            info = tarfile.TarInfo(rel)
            info.size, info.mode = size, 0o644
            h = hashlib.sha256()
            self.tar.addfile(info, _HashingReader(src, h))
            hex_digest = h.hexdigest()
        else:
            out = self.tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "wb") as f:
                hex_digest, _ = _sha256_of(src, f.write)
                f.flush()
                os.fsync(f.fileno())
        self.sums.append((hex_digest, rel))
        return hex_digest

    def finish(self) -> None:
        body = "".join(f"{h}  {rel}\n" for h, rel in self.sums).encode()
        if self.as_tar:
            info = tarfile.TarInfo(SUMS)
            info.size, info.mode = len(body), 0o644
            self.tar.addfile(info, io.BytesIO(body))
            self.tar.close()
            with open(self.tmp, "rb+") as f:
                os.fsync(f.fileno())
        else:
            (self.tmp / SUMS).write_bytes(body)
        os.replace(self.tmp, self.dest)
        fsync_dir(self.dest.parent)

    def abort(self) -> None:
        if self.as_tar:
            self.tar.close()
            self.tmp.unlink(missing_ok=True)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _new_temp(dest: Path, as_file: bool) -> Path:
    """A new temp file or folder beside `dest`, made with the mode an ordinary new file (0o666) or folder (0o777)
    gets under the process's umask, so a team's shared folder can read the bundle; mkstemp/mkdtemp would give
    0600/0700 whatever the umask. The kernel applies the umask (no os.umask round trip racing other threads)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        tmp = dest.parent / f".{dest.name}.{secrets.token_hex(6)}.tmp"
        try:
            if as_file:
                os.close(os.open(tmp, flags, 0o666))
            else:
                os.mkdir(tmp, 0o777)
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name beside {dest}")


class _HashingReader:
    def __init__(self, src: BinaryIO, h):
        self.src, self.h = src, h

    def read(self, n: int = -1) -> bytes:
        data = self.src.read(n)
        self.h.update(data)
        return data


class _CountingReader:
    """Reports the bytes read so far to `progress` after each read."""

    def __init__(self, src: BinaryIO, progress: Callable[[int], None]):
        self.src, self.progress, self.done = src, progress, 0

    def read(self, n: int = -1) -> bytes:
        data = self.src.read(n)
        self.done += len(data)
        self.progress(self.done)
        return data


def export(
    store: st.Store, name: str, path: str | os.PathLike, progress: Callable[[str, int, int], None] | None = None
) -> Path:
    """Write model `name` as a bundle at `path`: a single tar if it ends in `.tar`, else a new directory.
    `progress(digest, bytes written, blob size)` is called as each blob is written.

    Every blob is re-hashed on the way out; a blob that no longer matches its digest stops the export
    (exporting corruption would only move the problem). The bundle appears atomically (temp + rename)."""
    entry = store.get(name)
    dest = Path(path)
    as_tar = dest.suffix.lower() == ".tar"
    if dest.exists() and not (dest.is_dir() and not as_tar and not any(dest.iterdir())):
        raise BundleError(f"{dest} exists already; export writes a new bundle")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir():
        dest.rmdir()  # an empty directory is replaced by the finished bundle
    raw = entry.path.read_bytes()
    manifest = entry.manifest
    rel_manifest = "manifests/" + "/".join(entry.name.path_parts)
    w = _Writer(dest, as_tar)
    try:
        marker = {
            "format": "localrt-bundle",
            "version": 1,
            "models": [{"name": entry.name.full, "manifest": rel_manifest, "size": manifest.size}],
        }
        w.add_bytes(MARKER, (json.dumps(marker, indent=1) + "\n").encode())
        w.add_bytes(rel_manifest, raw)
        for d in dict.fromkeys(manifest.digests):
            p = store.blob_path(d)
            size = p.stat().st_size
            with open(p, "rb") as f:
                src = f if progress is None else _CountingReader(f, lambda n, d=d, size=size: progress(d, n, size))
                got = w.add_stream(f"blobs/{dg.to_filename(d)}", src, size)
            if got != d[7:]:
                raise BlobMismatch(f"stored blob {d} is corrupt (hashes to sha256:{got}); export stopped")
        w.finish()
    except BaseException:
        w.abort()
        raise
    return dest


# ----- import -----------------------------------------------------------------------------------------------------


def import_bundle(
    store: st.Store,
    path: str | os.PathLike,
    model: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[str]:
    """Import every model of a bundle / Ollama models directory / tar (or only `model`, or the one model whose
    manifest file `path` is). Returns the imported names (display form). `progress(digest, bytes stored, blob
    size)` is called as each blob is copied in (once, complete, for a blob the store has already)."""
    path = Path(path)
    picked = _manifest_file_source(path) if path.is_file() and path.suffix.lower() != ".tar" else None
    source, model = picked if picked else (open_source(path), model)
    try:
        chosen = [_pick(source.models(), model)] if model is not None else source.models()
        if not chosen:
            raise BundleError(f"{path} holds no models")
        manifests: list[tuple[names.ModelName, mf.Manifest]] = []
        for n, _rel in chosen:
            _, raw = source.manifest(n.full)
            try:
                manifests.append((n, mf.parse(raw, n.display)))
            except st.InvalidManifest as e:
                raise BundleError(str(e)) from None
        _import_blobs(store, source, manifests, progress)
    finally:
        source.close()
    for n, m in manifests:
        store.put_manifest(n, m)
    return [n.display for n, _ in manifests]


def _import_blobs(store: st.Store, source: Source, manifests, progress) -> None:
    wanted: dict[str, int] = {}
    for _, m in manifests:
        for layer in (m.config, *m.layers):
            if wanted.setdefault(layer.digest, layer.size) != layer.size:
                raise BundleError(f"{layer.digest} is given two different sizes")
    created: list[str] = []
    never = threading.Event()
    try:
        for d, size in wanted.items():
            if store.has_blob(d):
                have = store.blob_path(d).stat().st_size
                if have != size:
                    raise BlobMismatch(f"the manifest says {d} has {size} bytes, the stored blob has {have}")
                if progress is not None:
                    progress(d, size, size)
                continue
            report = (lambda n, d=d, size=size: progress(d, n, size)) if progress is not None else (lambda n: None)
            fetch_local(source, store, d, size, report, never)
            created.append(d)
    except BaseException:
        store.remove_unreferenced(created)  # nothing half-imported stays behind
        raise
