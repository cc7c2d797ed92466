"""Typed errors of the store. All are ValueError subclasses; the server maps them to HTTP status codes."""

from __future__ import annotations


class StoreError(ValueError):
    """Base of every error the store raises on purpose."""


class InvalidName(StoreError):
    def __init__(self, name: object, why: str):
        super().__init__(f"invalid model name {name!r}: {why}")
        self.name = name
        self.why = why


class InvalidDigest(StoreError):
    def __init__(self, digest: object, why: str = "expected 'sha256:' followed by 64 lowercase hex digits"):
        super().__init__(f"invalid digest {digest!r}: {why}")
        self.digest = digest


class DigestMismatch(StoreError):
    def __init__(self, expected: str, actual: str):
        super().__init__(f'digest mismatch, expected "{expected}", got "{actual}"')
        self.expected = expected
        self.actual = actual


class SizeMismatch(StoreError):
    def __init__(self, digest: str, expected: int, actual: int):
        super().__init__(f"blob {digest} should be {expected} bytes but is {actual} bytes")
        self.expected = expected
        self.actual = actual


class BlobNotFound(StoreError):
    def __init__(self, digest: str):
        super().__init__(f'blob "{digest}" not found')
        self.digest = digest


class ManifestNotFound(StoreError):
    def __init__(self, name: str):
        super().__init__(f"model '{name}' not found")
        self.name = name


class InvalidManifest(StoreError):
    def __init__(self, where: str, why: str):
        super().__init__(f"invalid manifest {where}: {why}")
        self.where = where


class UnsafePath(StoreError):
    """A path built from a name or digest would leave the store (CVE-2024-37032 class)."""

    def __init__(self, path: object):
        super().__init__(f"refusing path outside the models directory: {path!r}")


class ReadOnlyStore(StoreError):
    def __init__(self, what: str):
        super().__init__(f"{what} lives in a read-only models directory and cannot be changed")


class CorruptBlob(StoreError):
    def __init__(self, digest: str, why: str):
        super().__init__(f"blob {digest} is corrupt: {why}")
        self.digest = digest
