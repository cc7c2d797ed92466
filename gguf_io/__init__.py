"""GGUF v2/v3 reader (read-only mmap, zero-copy tensor views, hardened against malformed files) and writer.

`open(path)` opens one file, or every part of a split set when given its first part
(`<prefix>-00001-of-0000N.gguf`). It raises `InvalidGGUF` (a ValueError) for any malformed file and
only that; an OSError (FileNotFoundError, PermissionError, IsADirectoryError) still escapes for a path
that cannot be opened, since that is about the path, not the file's content.

`metadata_types[key]` is a GGUFValueType for a scalar, `(ARRAY, element_type)` for a flat array, and
`(ARRAY, ARRAY, (spec_0, spec_1, ...))` for an array of arrays (one spec per element); the writer takes
the same specs, so `write(path, f.metadata, ..., metadata_types=f.metadata_types)` re-creates a file
byte for byte. Numeric arrays in `metadata` are copies (they outlive `close()`); tensor views are not:
`close()` unmaps once no caller still holds a view. `open(path, lazy_strings=True)` gives string arrays as
`StringArray`s (offsets into the mapping, decoded per item; they keep it mapped) instead of lists of str.
"""

from __future__ import annotations

from ._strings import StringArray
from ._tensors import TensorInfo
from .constants import BLOCK_SIZES, GGMLType, GGUFValueType, InvalidGGUF
from .reader import GGUFFile, open_file
from .split import open_model
from .writer import GGUFWriter, write

open = open_model  # noqa: A001 - the public name the contract fixes

__all__ = [
    "BLOCK_SIZES",
    "GGMLType",
    "GGUFFile",
    "GGUFValueType",
    "GGUFWriter",
    "InvalidGGUF",
    "StringArray",
    "TensorInfo",
    "open",
    "write",
]
