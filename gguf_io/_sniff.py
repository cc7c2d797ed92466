"""Says what a file that is not a GGUF probably is, for the error message."""

from __future__ import annotations

_HINTS = (
    (
        b"version https://git-lfs",
        "a git-lfs pointer file, not the model itself (run `git lfs pull`, or download the real file)",
    ),
    (b"PK\x03\x04", "a zip archive (a PyTorch checkpoint?), not a GGUF model"),
    (b"\x89HDF", "an HDF5 file, not a GGUF model"),
    (b"GGML", "an old GGML/GGJT model, which predates GGUF; convert it to GGUF"),
    (b"ggjt", "an old GGJT model, which predates GGUF; convert it to GGUF"),
    (b"lmgg", "an old GGML model, which predates GGUF; convert it to GGUF"),
)


def describe_non_gguf(head: bytes, size: int) -> str:
    """Message for a file whose first bytes are not the GGUF magic; `head` is up to its first 1 KiB."""
    for prefix, what in _HINTS:
        if head.startswith(prefix):
            return f"not a GGUF file: it is {what}"
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head")) or b"<html" in text:
        return (
            "not a GGUF file: it is an HTML page (a download that returned an error or login page instead of the model)"
        )
    if head[8:9] == b"{" and int.from_bytes(head[:8], "little") < size:
        return "not a GGUF file: it looks like a safetensors file; convert it to GGUF"
    if size < 4:
        return f"not a GGUF file: only {size} bytes long"
    return f"not a GGUF file: magic is {head[:4]!r}, expected b'GGUF'"
