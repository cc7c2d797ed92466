"""The commands that work on the local store directly, with no daemon: export, import, verify and prune (cli.py
registers them)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _fail(msg: str) -> None:
    typer.echo(f"Error: {msg}", err=True)
    raise typer.Exit(1)


def _local_store():
    """The daemon's store, opened directly: export and import need no daemon."""
    import store as st
    from localrt import config

    cfg = config.load()
    return st.Store(cfg.models_dir, cfg.readonly_models_dirs)


def export_model(model: str, path: Path) -> None:
    """Write MODEL as a bundle (a directory, or a single file if PATH ends in .tar) with a SHA256SUMS list."""
    from localrt.cli.progress import ProgressView, blob_progress
    from localrt.distribution.bundle import export
    from localrt.errors import LocalrtError
    from store import StoreError

    try:
        with ProgressView() as view:
            dest = export(_local_store(), model, path, progress=blob_progress(view, "writing"))
    except (LocalrtError, StoreError, OSError) as e:
        _fail(str(e))
    typer.echo(f"exported '{model}' to {dest}")


def import_model(
    path: Path,
    model: Optional[str] = typer.Option(None, "--model", help="Import only this model from the bundle or folder"),
) -> None:
    """Import a bundle, an Ollama models directory (or one manifest file in it), or a tar of either."""
    from localrt.cli.progress import ProgressView, blob_progress
    from localrt.distribution.bundle import import_bundle
    from localrt.errors import LocalrtError
    from store import StoreError

    try:
        with ProgressView() as view:
            imported = import_bundle(_local_store(), path, model=model, progress=blob_progress(view, "copying"))
    except (LocalrtError, StoreError, OSError) as e:
        _fail(str(e))
    for name in imported:
        typer.echo(f"imported '{name}'")


def _print_report(r, verb: str) -> None:
    rows = [
        ("corrupt", r.corrupt),
        ("missing", [f"{m}: {', '.join(d)}" for m, d in r.missing.items()]),
        ("invalid manifest", [f"{p}: {e}" for p, e in r.invalid_manifests.items()]),
        ("unreferenced", r.unreferenced),
        ("temp file", r.temp_files),
        ("partial pull", r.partial),
        ("pull in progress", r.partial_active),
        (verb, r.removed),
    ]
    for label, items in rows:
        for item in items:
            typer.echo(f"{label}: {item}")
    typer.echo("store ok" if r.ok else "store has problems")


def verify(rehash: bool = typer.Option(True, help="Re-hash every blob (slow on big models)")) -> None:
    """Check the local store (no daemon needed): corrupt/missing blobs, bad manifests, leftovers of pulls."""
    from store import StoreError

    try:
        r = _local_store().verify(rehash=rehash)
    except (StoreError, OSError) as e:
        _fail(str(e))
    _print_report(r, "removed")
    raise typer.Exit(0 if r.ok else 1)


def prune(
    grace: float = typer.Option(600.0, help="Keep temp and unreferenced files younger than this (s)"),
    corrupt: bool = typer.Option(False, "--corrupt", help="Also delete corrupt blobs"),
) -> None:
    """Delete unreferenced blobs, stale temp files and the files of failed pulls (not those of a running pull)."""
    from store import StoreError

    try:
        r = _local_store().prune(grace_s=grace, remove_corrupt=corrupt)
    except (StoreError, OSError) as e:
        _fail(str(e))
    _print_report(r, "removed")
