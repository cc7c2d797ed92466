"""Export / import bundles (directory and tar), Ollama models directories, hostile archives, pulls from folders."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

import store as st
from localrt.distribution import bundle as bd
from localrt.distribution import pull as pl
from localrt.distribution.registry import BlobMismatch

from _mirror import blob_bytes, make_model, tree


@pytest.fixture()
def src(tmp_path):
    s = st.Store(tmp_path / "src")
    manifest = make_model(s, "tiny:1", tmp_path / "work", n_bytes=300_000)
    return s, manifest


def _same_model(a: st.Store, b: st.Store, name: str, b_name: str | None = None) -> None:
    ma = a.get(name).manifest
    mb = b.get(b_name or name).manifest
    assert ma.digests == mb.digests
    for d in ma.digests:
        assert blob_bytes(a, d) == blob_bytes(b, d)
    rec = b.model_record(b_name or name)
    assert rec.template is not None and rec.model_path is not None


@pytest.mark.parametrize("kind", ["dir", "tar"])
def test_export_import_roundtrip(src, tmp_path, kind):
    s, manifest = src
    dest = tmp_path / ("out.tar" if kind == "tar" else "out")
    assert bd.export(s, "tiny:1", dest) == dest
    if kind == "dir":
        files = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
        sums = dict(line.split("  ")[::-1] for line in (dest / bd.SUMS).read_text().splitlines())
        assert files == set(sums) | {bd.SUMS}
        for rel, h in sums.items():
            assert hashlib.sha256((dest / rel).read_bytes()).hexdigest() == h  # `sha256sum -c` would pass
    else:
        with tarfile.open(dest) as t:
            names = t.getnames()
        assert names[-1] == bd.SUMS and bd.MARKER in names
    other = st.Store(tmp_path / "other")
    assert bd.import_bundle(other, dest) == ["tiny:1"]
    _same_model(s, other, "tiny:1")
    assert bd.import_bundle(other, dest) == ["tiny:1"]  # idempotent
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".out")]  # no temp left behind


def test_export_refuses_existing_and_corrupt(src, tmp_path):
    s, manifest = src
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    with pytest.raises(bd.BundleError, match="exists"):
        bd.export(s, "tiny:1", tmp_path / "taken")
    p = s.blob_path(manifest.layers[0].digest)
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(BlobMismatch, match="corrupt"):
        bd.export(s, "tiny:1", tmp_path / "bad.tar")
    assert not (tmp_path / "bad.tar").exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".bad")] == []


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)])
def test_export_modes_follow_umask(src, tmp_path, umask, file_mode, dir_mode):
    """A bundle gets the mode the umask gives an ordinary new file/folder, not mkstemp's 0600 / mkdtemp's 0700,
    so a colleague can import it from a shared folder."""
    s, _ = src
    old = os.umask(umask)
    try:
        tar = bd.export(s, "tiny:1", tmp_path / "out.tar")
        folder = bd.export(s, "tiny:1", tmp_path / "out")
    finally:
        os.umask(old)
    assert tar.stat().st_mode & 0o777 == file_mode
    assert folder.stat().st_mode & 0o777 == dir_mode
    inside = list(folder.rglob("*"))
    assert any(p.is_file() for p in inside) and any(p.is_dir() for p in inside)
    for p in inside:
        assert p.stat().st_mode & 0o777 == (dir_mode if p.is_dir() else file_mode), p


def test_import_verifies_before_registering(src, tmp_path):
    s, manifest = src
    dest = tmp_path / "out"
    bd.export(s, "tiny:1", dest)
    tpl = dest / "blobs" / st.digest.to_filename(manifest.layers[1].digest)
    tpl.write_bytes(tpl.read_bytes()[:-1] + b"?")
    other = st.Store(tmp_path / "other")
    with pytest.raises(BlobMismatch):
        bd.import_bundle(other, dest)
    assert not other.list() and not list(other._blobs.digests())  # the good blob copied first was removed again
    # A changed manifest no longer matches the SHA256SUMS list.
    bd.export(s, "tiny:1", tmp_path / "out2")
    mpath = next((tmp_path / "out2" / "manifests").rglob("1"))
    mpath.write_bytes(mpath.read_bytes().replace(b'"schemaVersion":2', b'"schemaVersion":2 '))
    with pytest.raises(BlobMismatch, match="SHA256SUMS"):
        bd.import_bundle(other, tmp_path / "out2")
    os.unlink(tmp_path / "out2" / bd.SUMS)
    with pytest.raises(bd.BundleError, match="without its SHA256SUMS"):
        bd.import_bundle(other, tmp_path / "out2")


def _tar_with(path, members: list[tuple[tarfile.TarInfo, bytes | None]]):
    with tarfile.open(path, "w") as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize(
    "member, match",
    [
        (_file("../../evil"), "outside the store"),
        (_file("manifests/../../evil"), "outside the store"),
        (_file("/etc/cron.d/evil"), "absolute"),
        (_file("C:/evil"), "absolute"),
        (_file("blobs\\..\\evil"), "absolute or non-portable"),
        (_link("blobs/sha256-" + "a" * 64, "/etc/passwd"), "link or special"),
        (_link("manifests/x", "/etc/passwd", tarfile.LNKTYPE), "link or special"),
        (_file("notes.txt"), "not part of a models directory"),
        (_file("blobs/evil.sh"), "not part of a models directory"),
    ],
)
def test_hostile_archive_members_refused(src, tmp_path, member, match):
    s, _ = src
    good = tmp_path / "good.tar"
    bd.export(s, "tiny:1", good)
    with tarfile.open(good) as t:
        members = [(m, t.extractfile(m).read()) for m in t.getmembers()]
    bad = _tar_with(tmp_path / "bad.tar", members[:2] + [member] + members[2:])
    other = st.Store(tmp_path / "other")
    before = tree(tmp_path)
    with pytest.raises(bd.BundleError, match=match):
        bd.import_bundle(other, bad)
    assert tree(tmp_path) == before


def test_duplicate_member_and_compressed_archive_refused(src, tmp_path):
    s, _ = src
    bd.export(s, "tiny:1", tmp_path / "good.tar")
    with tarfile.open(tmp_path / "good.tar") as t:
        members = [(m, t.extractfile(m).read()) for m in t.getmembers()]
    _tar_with(tmp_path / "dup.tar", members + [members[1]])
    with pytest.raises(bd.BundleError, match="twice"):
        bd.import_bundle(st.Store(tmp_path / "o"), tmp_path / "dup.tar")
    with tarfile.open(tmp_path / "gz.tar", "w:gz") as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data))
    with pytest.raises(bd.BundleError, match="uncompressed"):
        bd.import_bundle(st.Store(tmp_path / "o"), tmp_path / "gz.tar")


def test_import_ollama_models_dir_whole_and_single(tmp_path):
    ollama = st.Store(tmp_path / "ollama" / "models")  # the layout Ollama writes: manifests/ + blobs/
    make_model(ollama, "llama3.2:1b", tmp_path / "w1", seed=1)
    make_model(ollama, "someone/coder:7b", tmp_path / "w2", seed=2)
    (ollama.root / "blobs" / "sha256-abc-partial").write_bytes(b"leftover")  # strays are ignored
    mine = st.Store(tmp_path / "mine")
    assert sorted(bd.import_bundle(mine, ollama.root)) == ["llama3.2:1b", "someone/coder:7b"]
    _same_model(ollama, mine, "someone/coder:7b")
    one = st.Store(tmp_path / "one")
    manifest_file = ollama.get("llama3.2:1b").path
    assert bd.import_bundle(one, manifest_file) == ["llama3.2:1b"]
    assert [e.name.display for e in one.list()] == ["llama3.2:1b"]
    two = st.Store(tmp_path / "two")
    assert bd.import_bundle(two, ollama.root, model="someone/coder:7b") == ["someone/coder:7b"]
    with pytest.raises(st.ManifestNotFound):
        bd.import_bundle(two, ollama.root, model="nope:1")


def test_import_tar_of_models_dir_with_top_folder(tmp_path):
    ollama = st.Store(tmp_path / "home" / "models")
    make_model(ollama, "tiny:1", tmp_path / "w")
    with tarfile.open(tmp_path / "models.tar", "w") as t:
        t.add(ollama.root, arcname="models")  # `tar -C ~/.ollama -cf models.tar models`
    mine = st.Store(tmp_path / "mine")
    assert bd.import_bundle(mine, tmp_path / "models.tar") == ["tiny:1"]
    _same_model(ollama, mine, "tiny:1")


def test_pull_from_bundle_folder_and_file_url(src, tmp_path):
    s, manifest = src
    make_model(s, "other:2", tmp_path / "work2", seed=5)
    bd.export(s, "tiny:1", tmp_path / "usb" / "tiny.tar")
    dst = st.Store(tmp_path / "dst")
    events = list(pl.pull(dst, f"file://{tmp_path / 'usb' / 'tiny.tar'}"))
    blobs = [layer.digest for layer in manifest.layers] + [manifest.config.digest]
    statuses = list(dict.fromkeys(e["status"] for e in events))
    assert statuses == ["pulling manifest"] + [f"pulling {d[7:19]}" for d in blobs] + [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    _same_model(s, dst, "tiny:1")
    # A plain store folder with two models: name the one wanted, or configure the folder as the default mirror.
    with pytest.raises(bd.BundleError, match="holds 2 models"):
        list(pl.pull(st.Store(tmp_path / "d2"), str(s.root)))
    d3 = st.Store(tmp_path / "d3")
    assert list(pl.pull(d3, f"{s.root}#other:2"))[-1] == {"status": "success"}
    d4 = st.Store(tmp_path / "d4")
    assert list(pl.pull(d4, "other:2", default_registry=f"file://{s.root}"))[-1] == {"status": "success"}
    _same_model(s, d4, "other:2")


def test_folder_source_refuses_fifo_and_wrong_size(src, tmp_path):
    s, manifest = src
    bd.export(s, "tiny:1", tmp_path / "b")
    blob = tmp_path / "b" / "blobs" / st.digest.to_filename(manifest.layers[0].digest)
    blob.unlink()
    os.mkfifo(blob)  # a FIFO planted in a share would hang a naive reader
    with pytest.raises(Exception, match="not a regular file"):
        list(pl.pull(st.Store(tmp_path / "d"), str(tmp_path / "b")))
    blob.unlink()
    blob.write_bytes(b"short")
    with pytest.raises(BlobMismatch, match="does not have the") as e:
        list(pl.pull(st.Store(tmp_path / "d"), str(tmp_path / "b")))
    assert " 5 " not in str(e.value)  # the size of a file the caller did not send is not told


def test_folder_source_follows_no_link_out_and_tells_no_size_or_hash(src, tmp_path):
    """A daemon may read what its caller may not: a blob linked to another file (or a folder on the way linked
    elsewhere) is refused, and no message carries the size or sha256 of a file the caller did not send."""
    s, manifest = src
    bd.export(s, "tiny:1", tmp_path / "b")
    blob = tmp_path / "b" / "blobs" / st.digest.to_filename(manifest.layers[0].digest)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root-only secret " * 254 + b"end")  # 4321 bytes
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    blob.unlink()
    blob.symlink_to(secret)
    with pytest.raises(Exception, match="is a link; refused") as e:
        list(pl.pull(st.Store(tmp_path / "d"), str(tmp_path / "b")))
    assert "4321" not in str(e.value) and digest not in str(e.value)
    blob.unlink()
    os.link(secret, blob)  # a hard link is a regular file of the folder: read, but its hash and size stay untold
    with pytest.raises(Exception) as e:
        list(pl.pull(st.Store(tmp_path / "d"), str(tmp_path / "b")))
    assert "4321" not in str(e.value) and digest not in str(e.value), str(e.value)
    blobs = tmp_path / "b" / "blobs"
    blobs.rename(tmp_path / "elsewhere")
    blobs.symlink_to(tmp_path / "elsewhere")  # the folder itself leads out
    with pytest.raises(Exception, match="leads out of"):
        list(pl.pull(st.Store(tmp_path / "d"), str(tmp_path / "b")))


def test_path_sources_are_no_existence_oracle(tmp_path):
    (tmp_path / "plain.txt").write_text("not a tar")
    (tmp_path / "somedir").mkdir()
    messages = set()
    for path in (tmp_path / "missing", tmp_path / "plain.txt", tmp_path / "somedir"):
        with pytest.raises(bd.BundleError) as e:
            list(pl.pull(st.Store(tmp_path / "d"), str(path)))
        messages.add(str(e.value).replace(str(path), "<path>"))
    assert messages == {"<path> is not a models folder, bundle or tar archive"}
