"""Unigram tokenization as llama.cpp's `llm_tokenizer_ugm_session` does it (`tokenizer.ggml.model` "t5": T5 and the
XLM-RoBERTa family, bge-m3, bge-reranker-v2-m3, multilingual-e5, snowflake-arctic-embed2).

Normalization works on the UTF-8 bytes of each raw-text fragment. At every position, in this order:
- a user-defined token's trie: the deepest trie path that the input follows (even a path that ends no token, even
  one that stops inside a character) is copied unchanged;
- sentencepiece's precompiled charsmap: the longest key that is a prefix of the input is replaced by its value;
- otherwise one character is copied, or, where the bytes are not valid UTF-8, one byte becomes U+FFFD.
Spaces in that output then become U+2581: with remove_extra_whitespaces every run of non-spaces gets one U+2581 in
front and the spaces go; without it each space is one U+2581, and add_space_prefix puts one before the first
non-space.

The ids are the best-scoring segmentation (Viterbi, scores summed as doubles, ties kept by the first candidate)
over the normal, user-defined (score 0) and unused tokens of the file's token types; a character no token covers on
its own may be the unknown token at (lowest normal score - 10), and consecutive unknown tokens are one.

The charsmap is `uint32 size`, a XOR-compressed double array of `size` bytes, then NUL-terminated values. It is
checked whole at load (every unit a walk from any reachable node may read), so that a hostile file is refused then
(ModelLoadError naming the key), not mid-request; it is walked as llama.cpp walks it. When no vocabulary token
holds U+2581 after its first character, no token crosses the start of a U+2581 and each such word is segmented (and
cached) on its own: the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import regex

from ...errors import InvalidRequest, ModelLoadError
from .wordcache import LIMIT, TEXT

KEY = "tokenizer.ggml.precompiled_charsmap"
SPACE = "\u2581"
_SPACE_B = SPACE.encode()
_FFFD = "\ufffd".encode()
_WORDS = regex.compile(f"{SPACE}[^{SPACE}]*|[^{SPACE}]+")
_DBL_MAX = 1.7976931348623157e308
_CHUNK = 4096  # node offsets checked at once
_FLT_MAX = float(np.finfo(np.float32).max)
# llama_token_attr bits (vocab.py's; not imported: vocab.py imports this module)
_NORMAL, _USER_DEFINED, _UNUSED = 1 << 2, 1 << 4, 1 << 1


@dataclass
class UgmTables:
    """What llama.cpp's `llm_tokenizer_ugm` builds at load, from the token types as the file gives them."""

    charsmap: Charsmap | None  # None: no normalization rules
    matchable: bytearray  # (n_vocab,) 1 for normal / user-defined / unused tokens: the Viterbi's tokens
    user_prefixes: frozenset[bytes]  # every prefix of every user-defined token's bytes
    unknown_score: float  # float32(min normal score) - 10, in float32


def build_tables(md: dict, tokens, type_attrs: np.ndarray, scores: np.ndarray) -> UgmTables:
    """type_attrs: (n,) the attributes of the file's token types, before llama.cpp's text-based overrides."""
    blob = md.get(KEY)
    charsmap = parse_charsmap(blob) if blob is not None else None
    matchable = bytearray(((type_attrs & (_NORMAL | _USER_DEFINED | _UNUSED)) != 0).astype(np.uint8).tobytes())
    user = {b""}
    for tid in np.flatnonzero(type_attrs & _USER_DEFINED).tolist():
        raw = tokens[tid].encode("utf-8")
        user.update(raw[:k] for k in range(1, len(raw) + 1))
    normal = scores[(type_attrs & _NORMAL) != 0].astype(np.float32)
    normal = normal[~np.isnan(normal)]  # std::min keeps its first argument against a NaN
    lowest = np.float32(min(float(normal.min()), _FLT_MAX)) if len(normal) else np.float32(_FLT_MAX)
    with np.errstate(over="ignore"):
        unknown = float(np.float32(lowest - np.float32(10.0)))
    return UgmTables(charsmap, matchable, frozenset(user), unknown)


def parse_charsmap(blob) -> Charsmap:
    """The precompiled charsmap, checked whole; ModelLoadError for anything llama.cpp's walk could trip on."""
    if isinstance(blob, (bytes, bytearray)):
        raw = bytes(blob)
    else:
        arr = np.asarray(blob)
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or (arr.size and (arr.min() < -128 or arr.max() > 255)):
            raise ModelLoadError(f"{KEY} must be an array of bytes (int8 or uint8)")
        raw = (arr.astype(np.int64) & 0xFF).astype(np.uint8).tobytes()
    if len(raw) < 4:
        raise ModelLoadError(f"{KEY} is too small ({len(raw)} bytes) for its size header")
    size = int.from_bytes(raw[:4], "little")
    if size + 4 >= len(raw):
        raise ModelLoadError(f"{KEY}: its double array ({size} bytes) does not fit in its {len(raw)} bytes")
    units = np.frombuffer(raw, "<u4", size // 4, 4).astype(np.int64)
    values = raw[4 + size :]
    return Charsmap(units.tolist(), values, _check(units, values) if len(units) else frozenset())


def _base(u):
    return (u >> 10) << ((u & (1 << 9)) >> 6)


def _check(units: np.ndarray, values: bytes) -> frozenset[int]:
    """Visit every node offset the walk can reach (each once: a node's behaviour is its offset alone, and darts-clone
    shares nodes) and check every unit the walk may read there; returns the bytes that start a path."""
    n = len(units)
    labels = np.arange(1, 256, dtype=np.int64)  # byte 0 ends llama.cpp's walk: never a label
    last_nul = values.rfind(b"\0")
    seen = np.zeros(n + 1, dtype=bool)
    offsets = _base(units[:1])  # (k,) where the children of each node of this level lie
    first = None
    while len(offsets):
        if len(offsets) > _CHUNK:  # a level at a time, in slices: (k, 255) int64 stays a few MB
            offsets, rest = offsets[:_CHUNK], offsets[_CHUNK:]
        else:
            rest = offsets[:0]
        idx = offsets[:, None] ^ labels[None, :]  # (k, 255)
        if int(idx.max()) >= n:
            raise ModelLoadError(f"{KEY}: a node's children lie outside its double array of {n} entries")
        seen[offsets] = True
        rows, cols = np.nonzero((units[idx] & 0x800000FF) == labels[None, :])
        if first is None:
            first = frozenset((cols + 1).tolist())
        child = idx[rows, cols]
        cu = units[child]
        nxt = child ^ _base(cu)
        leaf = nxt[((cu >> 8) & 1) == 1]
        if len(leaf) and int(leaf.max()) >= n:
            raise ModelLoadError(f"{KEY}: a replacement index lies outside its double array of {n} entries")
        at = units[leaf] & 0x7FFFFFFF
        if len(at) and int(at.max()) > last_nul:
            raise ModelLoadError(
                f"{KEY}: a replacement at offset {int(at.max())} is outside or unterminated "
                f"({len(values)} bytes of replacements)"
            )
        nxt = np.unique(nxt)
        if len(nxt) and int(nxt.max()) > n:
            raise ModelLoadError(f"{KEY}: a node points outside its double array of {n} entries")
        seen[rest] = True
        offsets = np.concatenate([rest, nxt[~seen[nxt]]])
    return first or frozenset()


class Charsmap:
    """sentencepiece's normalization rules as llama.cpp walks them: the longest key that prefixes the input."""

    def __init__(self, units: list[int], values: bytes, first: frozenset[int]):
        self._units = units  # (n,) bit-packed double-array units, every reachable read checked in range
        self._values = values  # NUL-terminated replacements
        self.first = first  # bytes with which some key starts
        self._root = _base(units[0]) if units else 0
        self._cache: dict[int, bytes] = {}

    def match(self, buf: bytes, p: int) -> tuple[bytes, int] | None:
        """(replacement, bytes matched) for the longest key at buf[p:], None when no key matches."""
        units, node, size, at = self._units, self._root, 0, 0
        for q in range(p, len(buf)):
            c = buf[q]
            if c == 0:
                break
            node ^= c
            u = units[node]
            if u & 0x800000FF != c:
                break
            node ^= (u >> 10) << ((u & 0x200) >> 6)
            if u & 0x100:
                size, at = q - p + 1, units[node] & 0x7FFFFFFF
        if not size:
            return None
        value = self._cache.get(at)
        if value is None:
            value = self._cache[at] = self._values[at : self._values.index(b"\0", at)]
        return value, size


def _longest_by_prefix(tokens) -> dict[str, int]:
    """First two characters -> length of the longest token that starts with them (as wpm.longest_by_prefix; not
    imported: wpm imports vocab, which imports this module)."""
    out: dict[str, int] = {}
    for text in tokens:
        size = len(text)
        if size > 1 and size > out.get(text[:2], 0):
            out[text[:2]] = size
    return out


def _utf8_len(buf: bytes, p: int) -> int:
    """Length of the valid UTF-8 character at p (llama.cpp's unicode_cpt_from_utf8), 0 when invalid."""
    b = buf[p]
    if b < 0x80:
        return 1
    if b < 0xC0:
        return 0
    size = 2 if b < 0xE0 else 3 if b < 0xF0 else 4 if b < 0xF8 else 0
    if size == 0 or p + size > len(buf) or any(buf[p + k] & 0xC0 != 0x80 for k in range(1, size)):
        return 0
    return size


def _lead_len(b: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[b >> 4]


class UgmEncoder:
    def __init__(self, vocab):
        t: UgmTables = vocab.ugm
        self._get = vocab.token_to_id.get
        self._scores = vocab.scores
        self._attrs = vocab.attrs  # user-defined (score 0) as llama.cpp asks at tokenize time
        self._ok = t.matchable
        self._unk = vocab.ids["unk"]
        self._unk_score = t.unknown_score
        self._prefix = vocab.add_space_prefix
        self._merge = vocab.remove_extra_whitespaces
        self._user = t.user_prefixes
        self._map = t.charsmap
        first = set(t.charsmap.first if t.charsmap else ()) | {p[0] for p in self._user if p}
        # Runs of bytes that start neither a key nor a user-defined token are copied as they are; a continuation
        # byte among those starts would make a run end inside a character, so then every position is looked at.
        self._run = None
        if not any(0x80 <= b < 0xC0 for b in first):
            cls = b"".join(regex.escape(bytes((b,))) for b in sorted(first))
            self._run = regex.compile(b"[^" + cls + b"]+" if cls else b"(?s).+")
        self._longest = _longest_by_prefix(vocab.tokens)
        self._cut = not any(SPACE in text[1:] for tid, text in enumerate(vocab.tokens) if t.matchable[tid])
        self._cache: dict[str, tuple[int, ...]] = {}
        self._tokens = vocab.tokens
        self._max_bytes: int | None = None  # longest matchable token in bytes, for the rare byte-level pass

    # -- normalization ----------------------------------------------------------------------------------
    def normalize(self, text: str) -> bytes:
        """The fragment as llama.cpp's UGM normalize leaves it (U+2581 for spaces)."""
        buf = text.encode("utf-8")
        parts: list[bytes] = []
        p, n, run = 0, len(buf), self._run
        while p < n:
            if run is not None and not 0x80 <= buf[p] < 0xC0:
                m = run.match(buf, p)
                if m is not None:
                    parts.append(m.group())
                    p = m.end()
                    continue
            piece, used = self._step(buf, p)
            parts.append(piece)
            p += used
        return self._spaces(b"".join(parts))

    def _step(self, buf: bytes, p: int) -> tuple[bytes, int]:
        user, k = self._user, 0
        while p + k < len(buf) and buf[p : p + k + 1] in user:
            k += 1
        if k:
            return buf[p : p + k], k
        found = self._map.match(buf, p) if self._map is not None else None
        if found is not None:
            return found
        size = _utf8_len(buf, p)
        return (buf[p : p + size], size) if size else (_FFFD, 1)

    def _spaces(self, s: bytes) -> bytes:
        if self._merge:
            return b"".join(_SPACE_B + w for w in s.split(b" ") if w)
        lead = len(s) - len(s.lstrip(b" "))
        if not self._prefix or lead == len(s):
            return s.replace(b" ", _SPACE_B)
        return _SPACE_B * (lead + 1) + s[lead:].replace(b" ", _SPACE_B)

    # -- segmentation -----------------------------------------------------------------------------------
    def encode(self, text: str, out: list[int], limit: int | None = None) -> None:
        """Tokenize one raw-text fragment into `out`; with `limit`, stop once `out` holds more than limit ids."""
        norm = self.normalize(text)
        if not norm:
            return
        try:
            words = [norm.decode("utf-8")]
        except UnicodeDecodeError:  # a user-defined path ended inside a character: llama.cpp's byte steps
            self._extend(out, self._viterbi_bytes(norm), False)
            return
        if self._cut:
            words = _WORDS.findall(words[0])
        first = True
        cache = self._cache
        for word in words:
            ids = cache.get(word)
            if ids is None:
                ids = self._viterbi(word)
                if len(word) <= TEXT:
                    if len(cache) >= LIMIT:
                        cache.clear()
                    cache[word] = ids
            self._extend(out, ids, not first)
            first = False
            if limit is not None and len(out) > limit:
                return

    def _extend(self, out: list[int], ids, joined: bool) -> None:
        if None in ids:
            raise InvalidRequest("the text needs the unknown token and this vocabulary has none")
        if joined and ids and ids[0] == self._unk and out and out[-1] == self._unk:
            ids = ids[1:]  # an unknown run across words is one unknown token, as in one pass
        out.extend(ids)

    def _viterbi(self, word: str) -> tuple[int, ...]:
        n = len(word)
        get, ok, attrs, scores, unk = self._get, self._ok, self._attrs, self._scores, self._unk
        best = [-_DBL_MAX] * (n + 1)
        tok: list[int | None] = [unk] * (n + 1)
        start = [0] * (n + 1)
        best[0] = 0.0
        for i in range(n):
            cur, single = best[i], False
            for j in range(i + 1, min(n, i + self._longest.get(word[i : i + 2], 1)) + 1):
                tid = get(word[i:j])
                if tid is None or not ok[tid]:
                    continue
                single = single or j == i + 1
                score = cur + (0.0 if attrs[tid] & _USER_DEFINED else scores[tid])
                if score > best[j]:
                    best[j], tok[j], start[j] = score, tid, i
            if not single and cur + self._unk_score > best[i + 1]:
                best[i + 1], tok[i + 1], start[i + 1] = cur + self._unk_score, unk, i
        return self._backtrack(tok, start, n)

    def _viterbi_bytes(self, buf: bytes) -> tuple[int, ...]:
        n = len(buf)
        if self._max_bytes is None:
            self._max_bytes = max(
                (len(t.encode("utf-8")) for tid, t in enumerate(self._tokens) if self._ok[tid]), default=0
            )
        longest = self._max_bytes
        ok, attrs, scores, unk = self._ok, self._attrs, self._scores, self._unk
        best = [-_DBL_MAX] * (n + 1)
        tok: list[int | None] = [unk] * (n + 1)
        start = [0] * (n + 1)
        best[0] = 0.0
        i = 0
        while i < n:
            cur, single, units = best[i], False, min(_lead_len(buf[i]), n - i)
            for j in range(i + 1, min(n, i + longest) + 1):
                tid = _get_bytes(self._get, buf[i:j])
                if tid is None or not ok[tid]:
                    continue
                single = single or j - i == units
                score = cur + (0.0 if attrs[tid] & _USER_DEFINED else scores[tid])
                if score > best[j]:
                    best[j], tok[j], start[j] = score, tid, i
            if not single and cur + self._unk_score > best[i + units]:
                best[i + units], tok[i + units], start[i + units] = cur + self._unk_score, unk, i
            i += units
        return self._backtrack(tok, start, n)

    def _backtrack(self, tok: list, start: list[int], n: int) -> tuple[int, ...]:
        ids: list[int | None] = []
        prev_unk, j = False, n
        while True:
            is_unk = tok[j] == self._unk
            if not (prev_unk and is_unk):
                ids.append(tok[j])
            if start[j] == 0:
                break
            prev_unk, j = is_unk, start[j]
        return tuple(reversed(ids))


def _get_bytes(get, raw: bytes) -> int | None:
    try:
        return get(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None
