"""Byte-level BPE as llama.cpp's `llm_tokenizer_bpe_session` does it.

Each pre-tokenized fragment is byte-encoded (GPT-2 `bytes_to_unicode`), then adjacent symbols are merged
lowest-rank-first (ties: leftmost) using `tokenizer.ggml.merges`. Final symbols missing from the vocabulary
emit the tokens of their single ASCII characters; other bytes are dropped, as llama.cpp drops them.
"""

from __future__ import annotations

import heapq

from . import pretokenize
from .vocab import Vocab
from .wordcache import WordCache


def bytes_to_unicode() -> list[str]:
    """byte -> the printable character GPT-2 uses for it."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    extra = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(0x100 + extra)  # the 68 unprintable bytes, in increasing order, from U+0100
            extra += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# latin-1 character (one per byte) -> GPT-2 character, for str.translate.
_LATIN1_TO_GPT2 = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(text: str) -> str:
    return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_GPT2)


class BpeEncoder:
    def __init__(self, vocab: Vocab):
        merges = vocab.merges if isinstance(vocab.merges, list) else vocab.merges.tolist()  # one bulk decode
        # "left right" -> rank; reversed so that the first of duplicate entries wins, as with emplace().
        self._ranks = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1)))
        self._get = vocab.token_to_id.get
        self._patterns = pretokenize.compiled(vocab.pretok.kind)
        self._ignore_merges = vocab.pretok.ignore_merges
        self._cache = WordCache(lambda frag: self._word(byte_encode(frag)))

    def encode(self, text: str, out: list[int], limit: int | None = None) -> None:
        """Tokenize one raw-text fragment into `out`; with `limit`, stop once `out` holds more than limit ids."""
        self._cache.encode(pretokenize.iter_split(text, self._patterns), out, limit)

    def _word(self, word: str) -> tuple[int, ...]:
        if self._ignore_merges:
            tid = self._get(word)
            if tid is not None:
                return (tid,)
        return self._emit(self._merge(word))

    def _merge(self, word: str) -> list[str]:
        ranks = self._ranks
        syms = list(word)  # (n,) symbol texts; "" once merged into its left neighbour
        n = len(syms)
        nxt = list(range(1, n + 1))  # (n,) next live symbol, n meaning none
        prev = list(range(-1, n - 1))  # (n,) previous live symbol, -1 meaning none
        heap = []  # (rank, left, right, merged text)
        for i in range(n - 1):
            rank = ranks.get(syms[i] + " " + syms[i + 1])
            if rank is not None:
                heap.append((rank, i, i + 1, syms[i] + syms[i + 1]))
        heapq.heapify(heap)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            lt, rt = syms[left], syms[right]
            if not lt or not rt or lt + rt != text:
                continue  # stale: one side has merged since this pair was pushed
            syms[left] = text
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after < n:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                rank = ranks.get(syms[before] + " " + text)
                if rank is not None:
                    heapq.heappush(heap, (rank, before, left, syms[before] + text))
            if after < n:
                rank = ranks.get(text + " " + syms[after])
                if rank is not None:
                    heapq.heappush(heap, (rank, left, after, text + syms[after]))
        return [s for s in syms if s]

    def _emit(self, syms: list[str]) -> tuple[int, ...]:
        get = self._get
        ids: list[int] = []
        for sym in syms:
            tid = get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            for ch in sym:
                # llama.cpp looks up each UTF-8 byte as a 1-byte string: only ASCII can be a token text.
                tid = get(ch) if ord(ch) < 0x80 else None
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)
