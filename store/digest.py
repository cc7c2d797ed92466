"""Digest grammar and streaming sha256. A digest is `sha256:` + 64 lowercase hex; file names use `sha256-`."""

from __future__ import annotations

import hashlib
import re
from typing import BinaryIO, Callable

from .errors import InvalidDigest

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_FILENAME = re.compile(r"sha256-[0-9a-f]{64}")
CHUNK = 4 << 20  # bytes per read while hashing/copying: big enough to amortise syscalls, small in memory


def validate(digest: object) -> str:
    """Return `digest` unchanged if it is `sha256:<64 lowercase hex>`, else raise InvalidDigest."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidDigest(digest if not isinstance(digest, str) else digest[:100])
    return digest


def is_digest(text: str) -> bool:
    return bool(_DIGEST.fullmatch(text))


def normalize(digest: object) -> str:
    """Accept `sha256:<hex>` or the file-name form `sha256-<hex>`; return the `sha256:` form."""
    if isinstance(digest, str) and _FILENAME.fullmatch(digest):
        return "sha256:" + digest[7:]
    return validate(digest)


def to_filename(digest: str) -> str:
    """`sha256:<hex>` -> `sha256-<hex>` (no ':' in file names on any OS)."""
    return "sha256-" + validate(digest)[7:]


def from_filename(filename: str) -> str | None:
    """`sha256-<hex>` -> `sha256:<hex>`; None for any other file name (temp files, strays)."""
    if _FILENAME.fullmatch(filename):
        return "sha256:" + filename[7:]
    return None


def of_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def of_stream(
    src: BinaryIO, sink: Callable[[bytes], object] | None = None, progress: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """Hash `src` to its end in one pass, passing each chunk to `sink` too. Returns (digest, size)."""
    h = hashlib.sha256()
    size = 0
    while chunk := src.read(CHUNK):
        h.update(chunk)
        if sink is not None:
            sink(chunk)
        size += len(chunk)
        if progress is not None:
            progress(size)
    return "sha256:" + h.hexdigest(), size


def of_file(path, progress: Callable[[int], None] | None = None) -> tuple[str, int]:
    with open(path, "rb") as f:
        return of_stream(f, progress=progress)
