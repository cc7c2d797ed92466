"""Detokenizer text clean-up and an incremental decoder that only emits complete UTF-8."""

from __future__ import annotations

import codecs
import re
from typing import Callable

_SPACE_BEFORE_PUNCT = re.compile(rb" (?=[?!.,])")
_LONE_APOSTROPHE = re.compile(rb" ' ")
_SPACE_CONTRACTION = re.compile(rb" (?='(?:[sm]|re|ve))")
# Bytes at the end of the text whose clean-up can still change when more text arrives.
_CLEAN_LOOKBEHIND = 3


def clean_spaces(text: bytes) -> bytes:
    """llama_detokenize's `clean_spaces` passes: " ?"->"?" (also !.,), " ' "->"'", " 's"->"'s" (also 'm 're 've)."""
    text = _SPACE_BEFORE_PUNCT.sub(b"", text)
    text = _LONE_APOSTROPHE.sub(b"'", text)
    return _SPACE_CONTRACTION.sub(b"", text)


class StreamDecoder:
    """Feed token ids one at a time; `add` returns only text that can no longer change.

    An incomplete UTF-8 sequence is held back until its last byte arrives; `flush` renders what is left with
    U+FFFD. With `first_lstrip` and `clean` set as the vocabulary says, the concatenation of every `add` and the
    final `flush` equals `Tokenizer.decode(all ids)`.
    """

    def __init__(self, piece: Callable[[int, bool], bytes], first_lstrip: bool, clean: bool):
        self._piece = piece
        self._lstrip = first_lstrip  # strip one leading space from the first piece (add_space_prefix)
        self._clean = clean
        self._raw = bytearray()  # (n_bytes,) every piece so far; kept only when clean-up needs context
        self._sent = 0  # bytes of the cleaned text already turned into output
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, token_id: int) -> str:
        piece = self._piece(token_id, self._lstrip)
        self._lstrip = False
        if not self._clean:
            return self._utf8.decode(piece)
        self._raw += piece
        cleaned = clean_spaces(bytes(self._raw))
        ready = len(cleaned) - _CLEAN_LOOKBEHIND
        if ready <= self._sent:
            return ""
        out = cleaned[self._sent : ready]
        self._sent = ready
        return self._utf8.decode(out)

    def flush(self) -> str:
        tail = b""
        if self._clean:
            cleaned = clean_spaces(bytes(self._raw))
            tail, self._sent = cleaned[self._sent :], len(cleaned)
        return self._utf8.decode(tail, final=True)
