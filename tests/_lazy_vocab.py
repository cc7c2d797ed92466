"""Tokenizer metadata as the engine's loader reads it: string arrays as gguf_io.StringArrays from a real file."""

from __future__ import annotations

import gguf_io
from gguf_io import GGUFValueType as VT


def _lazy_metadata(md: dict, tmp_path) -> dict:
    """md with every list of str turned into a StringArray read back from a GGUF file."""
    keys = [k for k, v in md.items() if isinstance(v, list) and v and all(isinstance(s, str) for s in v)]
    path = tmp_path / "lazy.gguf"
    gguf_io.write(path, {k: md[k] for k in keys}, [], metadata_types={k: (VT.ARRAY, VT.STRING) for k in keys})
    with gguf_io.open(path, lazy_strings=True) as f:
        return {**md, **{k: f.metadata[k] for k in keys}}
