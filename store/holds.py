"""Blobs that work in this process is using before a manifest references them (a create reading its source and
writing its layers): collecting unreferenced blobs passes them over, so one create cleaning up after itself never
deletes what a concurrent one still needs. Counted per (store root, digest): two creates may hold the same blob.

In-process only, as the daemon is the one process that creates; other processes (a `localrt prune` beside it) keep
to the prune grace period."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

_lock = threading.Lock()
_held: Counter[tuple[str, str]] = Counter()


def _key(root: Path, digest: str) -> tuple[str, str]:
    return os.path.realpath(root), digest


def acquire(root: Path, digest: str) -> None:
    with _lock:
        _held[_key(root, digest)] += 1


def release(root: Path, digest: str) -> None:
    with _lock:
        key = _key(root, digest)
        _held[key] -= 1
        if _held[key] <= 0:
            del _held[key]


def held(root: Path, digest: str) -> bool:
    with _lock:
        return _held[_key(root, digest)] > 0
