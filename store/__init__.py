"""Content-addressed model store in Ollama's on-disk layout (manifests + blobs), and the model-name grammar.

A leaf package: stdlib only, never imports localrt."""

from . import digest, manifests, names
from .blobs import BlobInfo
from .errors import (
    BlobNotFound,
    CorruptBlob,
    DigestMismatch,
    InvalidDigest,
    InvalidManifest,
    InvalidName,
    ManifestNotFound,
    ReadOnlyStore,
    SizeMismatch,
    StoreError,
    UnsafePath,
)
from .manifests import Layer, Manifest
from .names import ModelName
from .store import ModelEntry, ModelRecord, Store, VerifyReport

__all__ = [
    "BlobInfo",
    "BlobNotFound",
    "CorruptBlob",
    "DigestMismatch",
    "InvalidDigest",
    "InvalidManifest",
    "InvalidName",
    "Layer",
    "Manifest",
    "ManifestNotFound",
    "ModelEntry",
    "ModelName",
    "ModelRecord",
    "ReadOnlyStore",
    "SizeMismatch",
    "Store",
    "StoreError",
    "UnsafePath",
    "VerifyReport",
    "digest",
    "manifests",
    "names",
]
