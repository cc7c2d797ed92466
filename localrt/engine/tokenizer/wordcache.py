"""The per-word cache every encoder (SPM, BPE, WPM) tokenizes through: a word is tokenized once and its ids reused,
within bounds a hostile prompt cannot push (at most LIMIT entries, cleared when full; words longer than TEXT
characters are never kept, so a megabyte word does not stay in memory)."""

from __future__ import annotations

from typing import Callable, Iterable

LIMIT = 1 << 16  # entries; with TEXT, a few MB at most
TEXT = 64  # longer words are not cached


class WordCache:
    def __init__(self, tokenize: Callable[[str], tuple[int, ...]]):
        self._tokenize = tokenize  # one word -> its ids
        self._cache: dict[str, tuple[int, ...]] = {}

    def __iter__(self):
        """The words held now."""
        return iter(self._cache)

    def encode(self, words: Iterable[str], out: list[int], limit: int | None = None) -> None:
        """Each word's ids onto `out`, in order; with `limit`, stop once `out` holds more than limit ids."""
        cache = self._cache
        for word in words:
            ids = cache.get(word)
            if ids is None:
                ids = self._tokenize(word)
                if len(word) <= TEXT:
                    if len(cache) >= LIMIT:
                        cache.clear()
                    cache[word] = ids
            out.extend(ids)
            if limit is not None and len(out) > limit:
                return
