"""Special-token partitioning (llama.cpp's `tokenizer_st_partition`), before any other tokenization.

Candidates are CONTROL, USER_DEFINED and UNKNOWN tokens, longest first; without `parse_special` only
USER_DEFINED ones are matched. Each candidate in turn splits every remaining text fragment at its leftmost
non-overlapping occurrences. A character trie finds which candidates occur in the text at all, so the exact
sequential pass only runs over those few.
"""

from __future__ import annotations

from .vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, Vocab

_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale, which the LSTRIP/RSTRIP loops use
_END = ""  # trie key that holds the token id of the path so far


class SpecialMatcher:
    def __init__(self, vocab: Vocab):
        self._tokens = vocab.tokens
        self._attrs = vocab.attrs
        self._rank = {tid: r for r, tid in enumerate(vocab.special_ids)}  # order of the sequential pass
        self._trie: dict = {}
        for tid in vocab.special_ids:
            node = self._trie
            for ch in vocab.tokens[tid]:
                node = node.setdefault(ch, {})
            node[_END] = tid
        self._first = frozenset(self._trie)

    def _occurring(self, text: str, parse_special: bool) -> list[int]:
        found: set[int] = set()
        trie, first, attrs = self._trie, self._first, self._attrs
        for pos, ch in enumerate(text):
            if ch not in first:
                continue
            node = trie[ch]
            i = pos + 1
            while True:
                tid = node.get(_END)
                if tid is not None:
                    found.add(tid)
                if i >= len(text):
                    break
                node = node.get(text[i])
                if node is None:
                    break
                i += 1
        if not parse_special:
            found = {t for t in found if not attrs[t] & (ATTR_CONTROL | ATTR_UNKNOWN)}
        return sorted(found, key=self._rank.__getitem__)

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Fragments in order: str for raw text, int for a special token id."""
        if not text:
            return []
        frags: list[str | int] = [text]
        for tid in self._occurring(text, parse_special):
            frags = self._split_all(frags, tid)
        return frags

    def _split_all(self, frags: list[str | int], tid: int) -> list[str | int]:
        tok = self._tokens[tid]
        attr = self._attrs[tid]
        out: list[str | int] = []
        for frag in frags:
            if isinstance(frag, int) or tok not in frag:
                out.append(frag)
                continue
            rest = frag
            while True:
                at = rest.find(tok)
                if at < 0:
                    if rest:
                        out.append(rest)
                    break
                left = rest[:at]
                if attr & ATTR_LSTRIP:
                    left = left.rstrip(_C_SPACE)
                if left:
                    out.append(left)
                out.append(tid)
                rest = rest[at + len(tok) :]
                if attr & ATTR_RSTRIP:
                    rest = rest.lstrip(_C_SPACE)
        return out
