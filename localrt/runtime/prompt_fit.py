"""A raw prompt longer than the context, cut as Ollama's runner cuts it (/api/generate with `truncate`, its default):
the first `num_keep` tokens and the newest ones, the middle dropped, with one warning line.

Ollama keeps num_keep plus the tail up to the whole context and then shifts the context while it generates; this
engine never shifts (`shift` is refused), so the cut leaves what a first shift would: num_keep plus half of the rest
of the context, the other half free for the reply. The tail is tokenized from the end of the text only, a stretch
that grows until it holds enough tokens, so a text of megabytes is never tokenized whole (issue 48's bound)."""

from __future__ import annotations

import logging

log = logging.getLogger("localrt.service")
_CHARS_PER_TOKEN = 8  # the first stretch of text tried per tail token (English runs about 4); doubled while short


def kept_counts(n_ctx: int, num_keep: int, bos: bool = False) -> tuple[int, int]:
    """(head, tail) tokens a cut prompt keeps: num_keep (clamped to the context's first half; -1: that half), plus
    the BOS the tokenizer put first (llama.cpp's n_keep + add_bos), and half of what is left of the context."""
    half = n_ctx // 2
    head = min((half if num_keep < 0 else num_keep) + bos, half)
    return head, (n_ctx - head) // 2


def cut_prompt(model, text: str, n_ctx: int, num_keep: int, first: list[int]) -> list[int]:
    """The ids of `text`, known to be longer than n_ctx (`first`: its first ids, more than n_ctx of them, BOS
    included), cut to num_keep head ids and the newest tail ids (kept_counts)."""
    tok = model.tokenizer
    bos = bool(tok.vocab.add_bos) and tok.bos_id is not None and first[0] == tok.bos_id
    head, tail = kept_counts(n_ctx, num_keep, bos)
    ids = first[:head] + _tail_ids(tok, text, tail)
    log.warning(
        "truncating input prompt: longer than the context of %d tokens; kept its first %d (num_keep) and its last %d",
        n_ctx,
        head,
        tail,
    )
    return ids


def _tail_ids(tokenizer, text: str, n: int) -> list[int]:
    """The last n ids of text's tokenization, from a stretch of its end that starts where a run of whitespace does
    (a pre-token boundary for every pre-tokenizer, outside any special token); its first id is dropped all the
    same. The stretch doubles until it holds more than n ids: a few times at most, as no token spans more than a
    vocabulary piece's characters."""
    if n <= 0:
        return []
    chars = n * _CHARS_PER_TOKEN
    while True:
        start = _run_start_before(text, len(text) - chars)
        ids = tokenizer.encode(text[start:], add_special=False, parse_special=True)
        if start == 0:
            return ids[-n:]
        if len(ids) > n:
            return ids[1:][-n:]
        chars *= 2


def _run_start_before(text: str, i: int) -> int:
    """The last index at or before i, at most 256 characters back, where a run of whitespace starts after a
    non-space; i itself where there is none so near (a text without spaces); 0 from 0 down."""
    for j in range(i, max(0, i - 256), -1):
        if text[j].isspace() and not text[j - 1].isspace():
            return j
    return max(i, 0)
