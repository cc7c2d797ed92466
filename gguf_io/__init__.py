"""GGUF v2/v3 reader (read-only mmap, zero-copy tensor views, hardened against malformed files) and writer.

`open(path)` opens one file, or every part of a split set when given its first part
(`<prefix>-00001-of-0000N.gguf`). It raises `InvalidGGUF` (a ValueError) for any malformed file and only that; an OSError
(FileNotFoundError, PermissionError, IsADirectoryError) still escapes for a path that cannot be opened,
since that is about the path, not the file's content.
"""
from __future__ import annotations

from ._tensors import TensorInfo
from .constants import BLOCK_SIZES, GGMLType, GGUFValueType, InvalidGGUF
from .reader import GGUFFile, open_file
from .split import open_model
from .writer import GGUFWriter, write

open = open_model  # noqa: A001 - the public name the contract fixes

__all__ = [
    "BLOCK_SIZES", "GGMLType", "GGUFFile", "GGUFValueType", "GGUFWriter", "InvalidGGUF", "TensorInfo",
    "open", "write",
]
