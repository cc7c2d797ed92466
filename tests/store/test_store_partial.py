"""Leftovers of failed pulls (issue 12, part 6): `verify` reports `-partial` files and their state, `prune` collects
them unless a pull in progress holds them (the download lock: flock on the partial file, held here by another
process as a running pull would), and `localrt verify` / `localrt prune` do both on the local store."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import store as st
from cli import app

HEX_A, HEX_B, HEX_C = "a" * 64, "b" * 64, "c" * 64


def _partial(store: st.Store, hex_: str, data: bytes = b"x" * 100, state: bool = True) -> list:
    blobs = store.root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    files = [blobs / f"sha256-{hex_}-partial"]
    files[0].write_bytes(data)
    if state:
        files.append(blobs / f"sha256-{hex_}-partial.json")
        files[1].write_text(json.dumps({"digest": f"sha256:{hex_}", "size": 200, "parts": [[0, 200, 100]]}))
    return files


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def held_pull():
    """A process holding a partial file's download lock, as a pull in progress does."""
    procs = []

    def hold(path):
        p = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        procs.append(p)

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def test_verify_reports_partial_files_and_their_state(tmp_path):
    s = st.Store(tmp_path)
    files = _partial(s, HEX_A)
    r = s.verify()
    assert sorted(r.partial) == sorted(str(p) for p in files)
    assert r.partial_active == [] and r.ok  # leftovers, not damage


@pytest.mark.skipif(os.name != "posix", reason="the pull lock is flock")
def test_prune_collects_failed_pulls_but_not_a_running_one(tmp_path, held_pull):
    s = st.Store(tmp_path)
    failed = _partial(s, HEX_A)
    running = _partial(s, HEX_B)
    orphan_state = _partial(s, HEX_C)[1]
    (tmp_path / "blobs" / f"sha256-{HEX_C}-partial").unlink()  # a state file whose data is gone
    held_pull(running[0])
    r = s.verify()
    assert r.partial_active == [f"sha256:{HEX_B}"]
    r = s.prune(grace_s=600)
    assert sorted(r.removed) == sorted(str(p) for p in failed + [orphan_state])
    assert all(p.exists() for p in running) and not any(p.exists() for p in failed)
    assert s.verify().partial == [str(p) for p in running]


def test_a_pull_resumes_or_restarts_after_prune_removed_its_file(tmp_path):
    """prune deletes under the lock; the download protocol re-opens a file that vanished while it waited."""
    from localrt.distribution.download import partial_done

    s = st.Store(tmp_path)
    _partial(s, HEX_A)
    assert partial_done(s, f"sha256:{HEX_A}", 200) == 100
    s.prune(grace_s=0)
    assert partial_done(s, f"sha256:{HEX_A}", 200) == 0  # a new pull starts over cleanly


@pytest.mark.skipif(os.name != "posix", reason="the pull lock is flock")
def test_cli_verify_and_prune(tmp_path, held_pull):
    env = {"LOCALRT_MODELS": str(tmp_path), "LOCALRT_MODELS_READONLY": ""}
    s = st.Store(tmp_path)
    failed = _partial(s, HEX_A)
    running = _partial(s, HEX_B)
    held_pull(running[0])
    runner = CliRunner()
    r = runner.invoke(app, ["verify"], env=env, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert f"partial pull: {failed[0]}" in r.output and f"pull in progress: sha256:{HEX_B}" in r.output
    r = runner.invoke(app, ["prune"], env=env, catch_exceptions=False)
    assert (
        r.exit_code == 0
        and f"removed: {failed[0]}" in r.output
        and str(running[0]) not in r.output.replace(f"partial pull: {running[0]}", "")
    )
    assert not failed[0].exists() and running[0].exists()


def test_cli_verify_exits_1_on_a_corrupt_blob(tmp_path):
    s = st.Store(tmp_path)
    info = s.write_blob(b"hello")
    s.blob_path(info.digest).write_bytes(b"jello")
    r = CliRunner().invoke(app, ["verify"], env={"LOCALRT_MODELS": str(tmp_path)}, catch_exceptions=False)
    assert r.exit_code == 1 and f"corrupt: {info.digest}" in r.output
    r = CliRunner().invoke(
        app, ["prune", "--grace", "0", "--corrupt"], env={"LOCALRT_MODELS": str(tmp_path)}, catch_exceptions=False
    )
    assert f"removed: {info.digest}" in r.output
