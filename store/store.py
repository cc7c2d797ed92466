"""The models directory: manifests + blobs in Ollama's layout, plus read-only extra roots.

Layout under each root: `manifests/<host>/<namespace>/<model>/<tag>` and `blobs/sha256-<hex>`.
Writes go only to the first root; read-only roots are listed and read, never written, locked or pruned.
Manifest writes and garbage collection hold one store lock, so a blob that a new manifest is about to
reference cannot be collected in between."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from . import digest as dg
from . import holds
from . import manifests as mf
from . import names
from .blobs import BlobDir, BlobInfo, _fsync_dir
from .errors import (
    BlobNotFound,
    CorruptBlob,
    InvalidManifest,
    InvalidName,
    ManifestNotFound,
    ReadOnlyStore,
    StoreError,
    UnsafePath,
)
from .locks import locked, store_lock_file
from .names import ModelName

log = logging.getLogger(__name__)
MAX_TEXT_LAYER = 16 << 20  # template/system/params/messages/license blobs above this are not text layers


@dataclass(frozen=True)
class ModelEntry:
    """One stored model: what list() returns."""

    name: ModelName
    manifest: mf.Manifest
    digest: str  # hex sha256 of the manifest file bytes, no 'sha256:' prefix (as /api/tags shows it)
    size: int
    modified_at: datetime  # manifest mtime, UTC
    path: Path
    readonly: bool


@dataclass(frozen=True)
class ModelRecord:
    """Everything the runtime needs about one model, read from its manifest and small layers."""

    entry: ModelEntry
    model_path: Path | None
    adapter_paths: tuple[Path, ...]
    projector_paths: tuple[Path, ...]
    template: str | None
    system: str | None
    params: dict
    messages: list
    licenses: tuple[str, ...]
    config: dict
    parent_model: str

    @property
    def name(self) -> ModelName:
        return self.entry.name

    @property
    def details(self) -> dict:
        return mf.details(self.config, self.parent_model)


@dataclass
class VerifyReport:
    corrupt: list[str] = field(default_factory=list)  # digests whose bytes no longer hash to their name
    unreferenced: list[str] = field(default_factory=list)  # blobs of the writable root no manifest needs
    missing: dict[str, list[str]] = field(default_factory=dict)  # model display name -> absent digests
    invalid_manifests: dict[str, str] = field(default_factory=dict)  # manifest path -> error
    temp_files: list[str] = field(default_factory=list)  # leftovers of interrupted writes
    partial: list[str] = field(default_factory=list)  # files of pulls that did not finish: -partial, -partial.json
    partial_active: list[str] = field(default_factory=list)  # digests whose pull is running now (never collected)
    removed: list[str] = field(default_factory=list)  # what prune() deleted (digests or paths)
    renamed: list[str] = field(default_factory=list)  # legacy `sha256:<hex>` blob files prune() renamed

    @property
    def ok(self) -> bool:
        return not (self.corrupt or self.missing or self.invalid_manifests)


def _as_name(name: str | ModelName) -> ModelName:
    return name if isinstance(name, ModelName) else names.parse(name)


class Store:
    def __init__(self, root: str | os.PathLike, readonly_roots: Iterable[str | os.PathLike] = ()):
        self.root = Path(root)
        self.readonly_roots = tuple(Path(r) for r in readonly_roots)
        self._blobs = BlobDir(self.root, writable=True)
        self._ro_blobs = tuple(BlobDir(r, writable=False) for r in self.readonly_roots)

    # ----- paths -------------------------------------------------------------------------------------

    @staticmethod
    def _manifest_base(root: Path) -> Path:
        return root / "manifests"

    def _manifest_file(self, root: Path, name: ModelName) -> Path:
        """The manifest path of `name` in `root`, reusing the casing of an existing one (case-insensitive)."""
        base = self._manifest_base(root)
        path = base
        for part in name.path_parts:
            exact = path / part
            if exact.exists():
                path = exact
                continue
            try:
                found = [e for e in os.listdir(path) if e.lower() == part.lower()]
            except (FileNotFoundError, NotADirectoryError):
                found = []
            path = path / (sorted(found)[0] if found else part)
        # Parts are validated (no separators, no '..'), so this holds; check it anyway.
        norm_base = os.path.normpath(os.path.abspath(base))
        norm = os.path.normpath(os.path.abspath(path))
        if os.path.commonpath([norm_base, norm]) != norm_base or norm == norm_base:
            raise UnsafePath(str(path))
        return path

    def _roots(self) -> list[tuple[Path, bool]]:
        return [(self.root, False)] + [(r, True) for r in self.readonly_roots]

    # ----- manifests ---------------------------------------------------------------------------------

    def _entry(self, path: Path, name: ModelName, readonly: bool) -> ModelEntry:
        data = path.read_bytes()
        manifest = mf.parse(data, name.display)
        mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
        return ModelEntry(name, manifest, dg.of_bytes(data)[7:], manifest.size, mtime, path, readonly)

    def _stored_name(self, root: Path, path: Path) -> ModelName:
        rel = path.relative_to(self._manifest_base(root)).parts
        return names.from_path_parts(rel)

    def get(self, name: str | ModelName) -> ModelEntry:
        """The stored model `name` (writable root first). Raises ManifestNotFound, InvalidName, InvalidManifest."""
        n = _as_name(name)
        for root, readonly in self._roots():
            path = self._manifest_file(root, n)
            if path.is_file():
                return self._entry(path, self._stored_name(root, path), readonly)
        raise ManifestNotFound(n.display)

    def exists(self, name: str | ModelName) -> bool:
        try:
            self.get(name)
        except ManifestNotFound:
            return False
        return True

    def manifest(self, name: str | ModelName) -> mf.Manifest:
        return self.get(name).manifest

    def _walk(self, root: Path) -> Iterable[Path]:
        base = self._manifest_base(root)
        if not base.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(base):
            depth = len(Path(dirpath).relative_to(base).parts)
            if depth >= 3:
                dirnames[:] = []
            if depth == 3:
                for f in filenames:
                    yield Path(dirpath) / f

    def list(self) -> list[ModelEntry]:
        """All models, newest first. A writable model hides a read-only one of the same name.
        Files that are not valid names (temp files, strays) are skipped; broken manifests too (see verify)."""
        seen: dict[tuple, ModelEntry] = {}
        for root, readonly in self._roots():
            for path in self._walk(root):
                try:
                    name = self._stored_name(root, path)
                except InvalidName:
                    continue  # temp files and strays are not models
                try:
                    entry = self._entry(path, name, readonly)
                except (StoreError, OSError) as e:
                    log.warning("skipping unreadable manifest %s: %s", path, e)
                    continue
                seen.setdefault(name.key, entry)
        return sorted(seen.values(), key=lambda e: e.modified_at, reverse=True)

    def put_manifest(self, name: str | ModelName, manifest: mf.Manifest) -> mf.Manifest | None:
        """Write `manifest` for `name` atomically in the writable root; returns the manifest it replaced.
        Every blob it references must be stored already (BlobNotFound otherwise)."""
        n = _as_name(name)
        data = manifest.to_bytes()
        mf.parse(data, n.display)  # never write what we could not read back
        with locked(store_lock_file(self.root)):
            for d in manifest.digests:
                self.blob_path(d)
            path = self._manifest_file(self.root, n)
            old = None
            if path.is_file():
                try:
                    old = mf.parse(path.read_bytes(), n.display)
                except InvalidManifest:
                    old = None
            self._write_atomic(path, data)
        return old

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A dot name is not a valid tag, so a leftover temp never lists as a model.
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def copy(self, src: str | ModelName, dst: str | ModelName) -> ModelEntry:
        """Copy the manifest file of `src` to `dst` (byte for byte; blobs are shared)."""
        d = _as_name(dst)
        entry = self.get(src)
        data = entry.path.read_bytes()
        with locked(store_lock_file(self.root)):
            path = self._manifest_file(self.root, d)
            if path.exists() and os.path.samefile(path, entry.path):
                return entry
            self._write_atomic(path, data)
        return self.get(d)

    def delete(self, name: str | ModelName) -> list[str]:
        """Remove the model's manifest, then the blobs no remaining manifest references. Returns removed digests."""
        n = _as_name(name)
        with locked(store_lock_file(self.root)):
            path = self._manifest_file(self.root, n)
            if not path.is_file():
                for root in self.readonly_roots:
                    if self._manifest_file(root, n).is_file():
                        raise ReadOnlyStore(f"model '{n.display}'")
                raise ManifestNotFound(n.display)
            try:
                candidates = mf.parse(path.read_bytes(), n.display).digests
            except InvalidManifest:
                candidates = []  # a broken manifest is still deletable; prune() collects its blobs later
            path.unlink()
            _fsync_dir(path.parent)
            self._remove_empty_dirs(path.parent)
            return self._collect(candidates)

    def hold(self, digest: str) -> None:
        """Keep blob `digest` from being collected by this process until `release` (see store.holds)."""
        holds.acquire(self.root, digest)

    def release(self, digest: str) -> None:
        holds.release(self.root, digest)

    def remove_unreferenced(self, digests: Iterable[str]) -> list[str]:
        """Delete those of `digests` that no manifest references any more (after a model was replaced) and no work
        in this process holds."""
        with locked(store_lock_file(self.root)):
            return self._collect(list(digests))

    def _collect(self, candidates: list[str]) -> list[str]:
        if not candidates:
            return []
        referenced = self.referenced_digests()
        removed = []
        for d in dict.fromkeys(candidates):
            if d not in referenced and not holds.held(self.root, d) and self._blobs.remove(d):
                removed.append(d)
        return removed

    def _remove_empty_dirs(self, start: Path) -> None:
        base = self._manifest_base(self.root)
        p = start
        while p != base and base in p.parents:
            try:
                p.rmdir()
            except OSError:
                return
            p = p.parent

    def referenced_digests(self) -> set[str]:
        """Every digest some manifest (in any root) references. Unreadable manifests reference nothing."""
        out: set[str] = set()
        for root, _ in self._roots():
            for path in self._walk(root):
                try:
                    out.update(mf.parse(path.read_bytes(), str(path)).digests)
                except (StoreError, OSError):
                    continue
        return out

    # ----- blobs -------------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Path of a stored blob (writable root first). Raises InvalidDigest or BlobNotFound."""
        d = dg.normalize(digest)
        for blobs in (self._blobs, *self._ro_blobs):
            p = blobs.find(d)
            if p is not None:
                return p
        raise BlobNotFound(d)

    def has_blob(self, digest: str) -> bool:
        try:
            self.blob_path(digest)
        except BlobNotFound:
            return False
        return True

    def write_blob(
        self,
        src: BinaryIO | bytes,
        expected_digest: str | None = None,
        expected_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> BlobInfo:
        """Store bytes from a stream (one streaming pass: hash + copy) in the writable root."""
        d = dg.normalize(expected_digest) if expected_digest is not None else None
        return self._blobs.write(src, d, expected_size, progress)

    def import_file(self, path: str | os.PathLike, progress: Callable[[int], None] | None = None) -> BlobInfo:
        """Store a local file: read once, hashed while copied into the blobs directory."""
        with open(path, "rb") as f:
            return self._blobs.write(f, None, None, progress)

    def new_temp_file(self) -> Path:
        """An empty temp file inside the blobs directory (same file system), to be passed to `adopt_file`."""
        return self._blobs.new_temp()

    def adopt_file(self, tmp: Path, progress: Callable[[int], None] | None = None) -> BlobInfo:
        """Turn a temp file from `new_temp_file` into a blob by renaming it (hashed in one pass, never copied)."""
        return self._blobs.adopt(Path(tmp), progress)

    def read_blob(self, digest: str, max_bytes: int = MAX_TEXT_LAYER) -> bytes:
        p = self.blob_path(digest)
        if p.stat().st_size > max_bytes:
            raise CorruptBlob(digest, f"larger than {max_bytes} bytes, too big for a text layer")
        return p.read_bytes()

    # ----- models ------------------------------------------------------------------------------------

    def details(self, entry: ModelEntry) -> dict:
        """The `details` object of /api/tags for a listed model (from its config blob; {} fields if unreadable)."""
        try:
            config = mf.parse_config(self.read_blob(entry.manifest.config.digest))
        except StoreError:
            config = {}
        return mf.details(config)

    def _layer_text(self, layer: mf.Layer) -> str:
        data = self.read_blob(layer.digest)
        if len(data) != layer.size:
            raise CorruptBlob(layer.digest, f"{len(data)} bytes, the manifest says {layer.size}")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptBlob(layer.digest, "a text layer is not UTF-8") from None

    def _layer_json(self, layer: mf.Layer, kind: type) -> object:
        try:
            value = json.loads(self._layer_text(layer))
        except json.JSONDecodeError as e:
            raise CorruptBlob(layer.digest, f"a {layer.media_type} layer is not JSON ({e})") from None
        except RecursionError:
            raise CorruptBlob(layer.digest, f"a {layer.media_type} layer is JSON nested too deeply") from None
        if not isinstance(value, kind):
            raise CorruptBlob(layer.digest, f"a {layer.media_type} layer is not a JSON {kind.__name__}")
        return value

    def _sized_path(self, layer: mf.Layer) -> Path:
        p = self.blob_path(layer.digest)
        size = p.stat().st_size
        if size != layer.size:
            raise CorruptBlob(layer.digest, f"{size} bytes on disk, the manifest says {layer.size}")
        return p

    def model_record(self, name: str | ModelName) -> ModelRecord:
        """Read a model's manifest, config and text layers. Big layers are returned as paths, unread."""
        entry = self.get(name)
        m = entry.manifest
        models = m.layers_of(mf.MODEL)
        templates = m.layers_of(mf.TEMPLATE, mf.PROMPT)
        systems = m.layers_of(mf.SYSTEM)
        params: dict = {}
        for layer in m.layers_of(mf.PARAMS):
            params.update(self._layer_json(layer, dict))  # type: ignore[arg-type]
        messages: list = []
        for layer in m.layers_of(mf.MESSAGES):
            messages.extend(self._layer_json(layer, list))  # type: ignore[arg-type]
        config = mf.parse_config(self.read_blob(m.config.digest))
        return ModelRecord(
            entry=entry,
            model_path=self._sized_path(models[0]) if models else None,
            adapter_paths=tuple(self._sized_path(x) for x in m.layers_of(mf.ADAPTER)),
            projector_paths=tuple(self._sized_path(x) for x in m.layers_of(mf.PROJECTOR)),
            template=self._layer_text(templates[-1]) if templates else None,
            system=self._layer_text(systems[-1]) if systems else None,
            params=params,
            messages=messages,
            licenses=tuple(self._layer_text(x) for x in m.layers_of(mf.LICENSE)),
            config=config,
            parent_model=(models[0].from_ or "") if models else "",
        )

    # ----- integrity ---------------------------------------------------------------------------------

    def verify(self, rehash: bool = True) -> VerifyReport:
        """Re-hash every blob (all roots) and report corrupt, unreferenced, missing blobs and bad manifests."""
        report = VerifyReport()
        referenced: set[str] = set()
        for root, _ in self._roots():
            for path in self._walk(root):
                try:
                    name = self._stored_name(root, path)
                    manifest = mf.parse(path.read_bytes(), str(path))
                except InvalidName:
                    continue  # temp files and strays are not models
                except (StoreError, OSError) as e:
                    report.invalid_manifests[str(path)] = str(e)
                    continue
                referenced.update(manifest.digests)
                absent = [d for d in manifest.digests if not self.has_blob(d)]
                if absent:
                    report.missing.setdefault(name.display, absent)
        for blobs in (self._blobs, *self._ro_blobs):
            for d in blobs.digests():
                if rehash and blobs.rehash(d) != d:
                    report.corrupt.append(d)
                if blobs.writable and d not in referenced:
                    report.unreferenced.append(d)
        report.temp_files = [str(p) for p in self._blobs.temp_files()]
        for d, files in self._blobs.partial_files().items():
            report.partial += [str(p) for p in files]
            if self._blobs.partial_in_use(d):
                report.partial_active.append(d)
        return report

    def prune(self, grace_s: float = 600.0, remove_corrupt: bool = False, rehash: bool = True) -> VerifyReport:
        """verify(), then delete unreferenced blobs and stale temp files older than `grace_s` seconds
        (younger ones may belong to a write in progress), the files of pulls that no pull holds any more (a
        running pull's lock keeps its files), and corrupt blobs if asked. Writable root only."""
        import time

        with locked(store_lock_file(self.root)):
            report = self.verify(rehash=rehash)
            report.renamed = self._blobs.migrate_legacy()
            now = time.time()
            doomed = list(report.unreferenced)
            if remove_corrupt:
                doomed += [d for d in report.corrupt if self._blobs.exists(d)]
            for d in dict.fromkeys(doomed):
                p = self._blobs.find(d)
                if p is None:
                    continue
                old_enough = now - p.stat().st_mtime >= grace_s and not holds.held(self.root, d)
                if (old_enough or d in report.corrupt) and self._blobs.remove(d):
                    report.removed.append(d)
            for p in self._blobs.stale_temp_files(grace_s):
                p.unlink(missing_ok=True)
                report.removed.append(str(p))
            for d in self._blobs.partial_files():
                gone = self._blobs.remove_partial(d, grace_s)  # None: a pull holds it
                report.removed += [str(p) for p in gone or ()]
        return report
