"""WordPiece tokenization as llama.cpp's `llm_tokenizer_wpm_session` does it (`tokenizer.ggml.model` "bert").

llama.cpp's GGUF BERT vocabularies carry a "phantom space": a word-initial HF token "abc" is stored as "\u2581abc",
a continuation "##abc" as "abc", control tokens ([CLS], [SEP] ...) unchanged.

Preprocessing, per code point of the text (llama.cpp's `preprocess`):
- with strip_accents, the code point is first replaced by the first code point of its NFD decomposition (one
  code point in, one out: "é" becomes "e", a Hangul syllable its leading jamo);
- llama.cpp's whitespace set ends the current word;
- NUL, U+FFFD and category C[cfos] ("control": controls, format characters such as U+200B, private use) are
  dropped; unassigned code points (Cn) are not;
- with strip_accents, marks (M*) are dropped;
- punctuation (P*), ASCII symbols (S* below U+007F) and CJK ideographs become words of their own;
- with lowercase, the code point is replaced by its simple lowercase mapping (one code point, never two).
Then each word, with U+2581 in front, is covered left to right by the longest vocabulary token at each position
(any token, whatever its type); a word that cannot be covered to its end is one unknown token instead.

Character properties come from Python's `unicodedata`. llama.cpp's tables are Unicode 15.1; the code points that
Unicode 15.0/15.1 assigned as marks, format characters or punctuation (which this rule treats apart from the
unassigned ones) are listed in _UNICODE_15 for Pythons whose data is older (3.11 ships 14.0). On a Python with
Unicode 16 or later data, code points assigned after 15.1 may be classed differently from llama.cpp.
"""

from __future__ import annotations

import unicodedata

from ...errors import InvalidRequest
from .vocab import Vocab
from .wordcache import WordCache

SPACE = "\u2581"
_SEP = " "  # word separator in the preprocessed text; no kept character maps to it
# llama.cpp's whitespace (Unicode White_Space): a narrower set than str.isspace, which adds U+001C..U+001F.
WHITESPACE = frozenset(
    map(
        chr,
        [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000],
    )
)
_CONTROL = frozenset(("Cc", "Cf", "Co", "Cs"))
# CJK ideograph blocks that BERT splits into one-character words (the 0x2B920 start follows HF's tokenizers).
_CHINESE = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
# (first, last, category): assigned by Unicode 15.0/15.1 as M*/C*/P*; consulted only where unicodedata says "Cn".
_UNICODE_15 = (
    (0x0CF3, 0x0CF3, "Mc"),
    (0x0ECE, 0x0ECE, "Mn"),
    (0x10EFD, 0x10EFF, "Mn"),
    (0x11241, 0x11241, "Mn"),
    (0x11B00, 0x11B09, "Po"),
    (0x11F00, 0x11F01, "Mn"),
    (0x11F03, 0x11F03, "Mc"),
    (0x11F34, 0x11F3A, "Mn"),
    (0x11F3E, 0x11F42, "Mn"),
    (0x11F43, 0x11F4F, "Po"),
    (0x13439, 0x1343F, "Cf"),
    (0x13440, 0x13440, "Mn"),
    (0x13447, 0x13455, "Mn"),
    (0x1E08F, 0x1E08F, "Mn"),
    (0x1E4EC, 0x1E4EF, "Mn"),
)
_CHAR_CACHE_LIMIT = 1 << 16  # distinct characters remembered per option set; a hostile text could name them all


def is_chinese_char(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CHINESE)


def category(ch: str) -> str:
    """ch's general category as llama.cpp's Unicode 15.1 tables have it (see _UNICODE_15)."""
    cat = unicodedata.category(ch)
    if cat == "Cn":
        cp = ord(ch)
        for lo, hi, newer in _UNICODE_15:
            if lo <= cp <= hi:
                return newer
    return cat


def nfd_first(ch: str) -> str:
    """The first code point of ch's canonical decomposition (ch itself when it has none)."""
    return unicodedata.normalize("NFD", ch)[0]


def simple_lower(ch: str) -> str:
    """ch's simple lowercase mapping; str.lower's full mapping differs only where it gives two code points
    (U+0130 -> "i\u0307"), and the simple mapping there is the first of them."""
    low = ch.lower()
    return low if len(low) == 1 else low[0]


def char_rule(ch: str, lowercase: bool = True, strip_accents: bool = True) -> str:
    """What one input character becomes in the preprocessed text: _SEP (ends a word), "" (dropped),
    _SEP + c + _SEP (a word of its own), or the character to append to the current word."""
    if strip_accents:
        ch = nfd_first(ch)
    if ch in WHITESPACE:
        return _SEP
    cat = category(ch)
    if ch == "\0" or ch == "\ufffd" or cat in _CONTROL:
        return ""
    if strip_accents and cat[0] == "M":
        return ""
    out = simple_lower(ch) if lowercase else ch
    if cat[0] == "P" or (cat[0] == "S" and ord(ch) < 0x7F) or is_chinese_char(ch):
        return _SEP + out + _SEP
    return out


class _CharRules(dict):
    """str.translate table: character -> char_rule, computed on first sight and kept for the next text."""

    def __init__(self, lowercase: bool, strip_accents: bool):
        super().__init__()
        self._opts = (lowercase, strip_accents)

    def __missing__(self, cp: int) -> str:
        if len(self) >= _CHAR_CACHE_LIMIT:
            self.clear()
        rule = self[cp] = char_rule(chr(cp), *self._opts)
        return rule


_RULES: dict[tuple[bool, bool], _CharRules] = {}


def preprocess(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """The words llama.cpp's WPM preprocess makes of text (see the module docstring), in order, none empty."""
    rules = _RULES.get((lowercase, strip_accents))
    if rules is None:
        rules = _RULES.setdefault((lowercase, strip_accents), _CharRules(lowercase, strip_accents))
    return [w for w in text.translate(rules).split(_SEP) if w]


def longest_by_prefix(tokens) -> dict[str, int]:
    """First two characters -> length in characters of the longest token that starts with them (tokens of two or
    more characters; tokens: a list of str or a StringArray). This bounds the longest-match search at a position
    far tighter than the longest token overall, so a long word costs a few lookups per token, not one per length."""
    out: dict[str, int] = {}
    for text in tokens:
        size = len(text)
        if size > 1 and size > out.get(text[:2], 0):
            out[text[:2]] = size
    return out


def greedy_cover(word: str, get, longest: dict[str, int]) -> list[int] | None:
    """Token ids covering word left to right, the longest vocabulary match first at each position (`longest` as
    longest_by_prefix gives it); None when some position starts no token."""
    ids: list[int] = []
    n = len(word)
    i = 0
    while i < n:
        for j in range(min(n, i + longest.get(word[i : i + 2], 1)), i, -1):
            tid = get(word[i:j])
            if tid is not None:
                break
        else:
            return None
        ids.append(tid)
        i = j
    return ids


class WpmEncoder:
    def __init__(self, vocab: Vocab):
        self._get = vocab.token_to_id.get
        self._unk = vocab.ids["unk"]
        self._longest = longest_by_prefix(vocab.tokens)  # a few thousand entries for a 30k vocabulary
        self._opts = (vocab.lowercase, vocab.strip_accents)
        self._cache = WordCache(self._word)

    def encode(self, text: str, out: list[int], limit: int | None = None) -> None:
        """Tokenize one raw-text fragment into `out`; with `limit`, stop once `out` holds more than limit ids."""
        self._cache.encode(preprocess(text, *self._opts), out, limit)

    def _word(self, word: str) -> tuple[int, ...]:
        ids = greedy_cover(SPACE + word, self._get, self._longest)
        if ids is not None:
            return tuple(ids)
        # llama.cpp pushes its unknown id even when there is none (-1); refusing is the honest equivalent.
        if self._unk is None:
            raise InvalidRequest(f"word {word[:40]!r} has no WordPiece cover and the vocabulary has no unknown token")
        return (self._unk,)
