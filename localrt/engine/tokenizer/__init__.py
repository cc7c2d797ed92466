"""Tokenizers built from GGUF metadata alone, token-for-token identical to llama.cpp (SPM, byte-level BPE, WPM,
UGM)."""

from __future__ import annotations

from .stream import StreamDecoder
from .tokenizer import Tokenizer

__all__ = ["Tokenizer", "StreamDecoder"]
