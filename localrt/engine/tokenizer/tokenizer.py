"""The public tokenizer: llama.cpp's `llama_tokenize` / `llama_detokenize` from GGUF metadata alone (SPM, BPE, WPM,
UGM)."""

from __future__ import annotations

from typing import Iterable

from ...errors import InvalidRequest
from .bpe import CHAR_TO_BYTE, BpeEncoder
from .specials import SpecialMatcher
from .spm import SPACE, SpmEncoder
from .stream import StreamDecoder, clean_spaces
from .vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    BPE,
    SPM,
    UGM,
    WPM,
    Vocab,
    load_vocab,
)
from .ugm import UgmEncoder
from .wpm import WpmEncoder

_HIDDEN = ATTR_CONTROL | ATTR_UNKNOWN  # rendered only when special=True


class Tokenizer:
    """Token ids identical to llama.cpp's `llama_tokenize(text, add_special, parse_special)`.

    `decode` is `llama_detokenize(ids, remove_special=False, unparse_special=False)`: control and unknown tokens
    (BOS, `<end_of_turn>`, `<|im_end|>` ...) render as nothing, user-defined tokens as their text.
    """

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._specials = SpecialMatcher(vocab)
        self._encoder = {SPM: SpmEncoder, BPE: BpeEncoder, WPM: WpmEncoder, UGM: UgmEncoder}[vocab.kind](vocab)
        self._pieces: dict[int, bytes] = {}
        self.clean_spaces = vocab.kind == WPM or (vocab.kind == BPE and vocab.pretok.clean_spaces)

    @classmethod
    def from_gguf(cls, metadata: dict) -> "Tokenizer":
        return cls(load_vocab(metadata))

    # -- properties -------------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        return self.vocab.ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.ids["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.ids["eot"]

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def sep_id(self) -> int | None:
        return self.vocab.ids["sep"]

    @property
    def add_sep(self) -> bool:
        return self.vocab.add_sep

    def is_control(self, token_id: int) -> bool:
        return bool(self.vocab.attrs[self._check(token_id)] & ATTR_CONTROL)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog_ids

    def token_id(self, text: str) -> int | None:
        return self.vocab.token_to_id.get(text)

    # -- encode -----------------------------------------------------------------------------------------
    def encode(
        self, text: str, add_special: bool = True, parse_special: bool = True, limit: int | None = None
    ) -> list[int]:
        """With `limit`, the work stops once more than limit ids are out: the ids so far are returned, the start
        of the full answer (every fragment before the stop whole) and longer than limit, which is enough to refuse
        a prompt longer than the context without tokenizing all of it."""
        if not isinstance(text, str):
            raise InvalidRequest(f"text to tokenize must be a str, got {type(text).__name__}")
        # Lone surrogates cannot be UTF-8; llama.cpp reads invalid UTF-8 as U+FFFD.
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace") if _has_surrogate(text) else text
        v = self.vocab
        wpm = v.kind == WPM
        if add_special and wpm:
            _check_wpm_specials(v)
        out: list[int] = []
        if add_special and (v.add_bos or wpm):  # WPM: [CLS] whatever the flag says
            out.append(v.ids["bos"])
        frags = self._specials.partition(text, parse_special)
        if v.kind == SPM:
            self._encode_spm(frags, out, limit)
        else:
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    self._encoder.encode(frag, out, limit)
                if limit is not None and len(out) > limit:
                    return out
        if limit is not None and len(out) > limit:
            return out
        if add_special and wpm:
            out.append(v.ids["sep"])  # WPM: [SEP], not EOS, and whatever add_eos says
        elif add_special and v.add_eos:
            out.append(v.ids["eos"])
        return out

    def _encode_spm(self, frags: list[str | int], out: list[int], limit: int | None = None) -> None:
        prefix = self.vocab.add_space_prefix
        prev_special = True  # the first fragment gets the space prefix too
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if prefix and prev_special:
                frag = " " + frag
            self._encoder.encode(frag.replace(" ", SPACE), out, limit)
            prev_special = False
            if limit is not None and len(out) > limit:
                return

    # -- decode -----------------------------------------------------------------------------------------
    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes of one token (llama_token_to_piece); control/unknown tokens are empty unless `special`."""
        attr = self.vocab.attrs[self._check(token_id)]
        if attr & _HIDDEN and not special:
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._render(token_id, attr)
        return piece

    def _render(self, token_id: int, attr: int) -> bytes:
        text = self.vocab.tokens[token_id]
        if attr & (_HIDDEN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self.vocab.kind != BPE:  # SPM, WPM and UGM: the U+2581 word marker is a space
                return text.replace(SPACE, " ").encode("utf-8")
            return _gpt2_decode(text)
        if attr & ATTR_BYTE:
            return bytes([_byte_of(text, self.vocab.kind)])
        return b""  # UNUSED / UNDEFINED tokens render as nothing

    def _piece_for_stream(self, token_id: int, lstrip: bool) -> bytes:
        piece = self.token_to_piece(token_id)
        return piece[1:] if lstrip and piece[:1] == b" " else piece

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        ids = list(ids)
        raw = b"".join(self.token_to_piece(t) for t in ids)
        if self.vocab.add_space_prefix and ids and self.token_to_piece(ids[0])[:1] == b" ":
            raw = raw[1:]  # llama_detokenize strips one leading space from the first piece
        return clean_spaces(raw) if self.clean_spaces else raw

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", "replace")

    def stream_decoder(self, as_detokenize: bool = False) -> StreamDecoder:
        """Incremental text for generated tokens; it never emits part of a UTF-8 sequence.

        By default it concatenates pieces as llama.cpp's generation output does (`common_token_to_piece`):
        no leading-space strip, no `clean_spaces`. With `as_detokenize=True` its output equals `decode(ids)`.
        The two agree whenever add_space_prefix and clean_spaces are both off, as for Gemma 3 and SmolLM2.
        """
        if not as_detokenize:
            return StreamDecoder(self._piece_for_stream, False, False)
        return StreamDecoder(self._piece_for_stream, self.vocab.add_space_prefix, self.clean_spaces)

    def _check(self, token_id: int) -> int:
        if not 0 <= token_id < self.vocab.n_vocab:
            raise InvalidRequest(f"token id {token_id} is outside the vocabulary (0..{self.vocab.n_vocab - 1})")
        return token_id


def _check_wpm_specials(v: Vocab) -> None:
    # llama.cpp asserts (aborts) here; a request that needs the missing token is refused instead.
    for name, text in (("bos", "[CLS]"), ("sep", "[SEP]")):
        if v.ids[name] is None:
            raise InvalidRequest(f"this WordPiece vocabulary has no {name} ({text}) token to add")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _gpt2_decode(text: str) -> bytes:
    out = bytearray()
    for ch in text:
        b = CHAR_TO_BYTE.get(ch)
        if b is None:
            # llama.cpp writes a marker for a character outside the byte table instead of failing.
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
        else:
            out.append(b)
    return bytes(out)


def _byte_of(text: str, kind: str) -> int:
    # BYTE tokens are "<0xHH>" in SPM vocabularies; llama.cpp reads the two hex digits at offset 3.
    if kind == WPM:
        raise InvalidRequest(f"byte token {text!r} in a WordPiece vocabulary (llama.cpp aborts on these)")
    try:
        return int(text[3:5], 16)
    except ValueError:
        raise InvalidRequest(f"byte token {text!r} is not of the form <0xHH>") from None
