"""A /api/generate prompt past the context cut as Ollama's runner cuts it (runtime/prompt_fit.py): num_keep first ids
(and the BOS on top, as llama.cpp's n_keep + add_bos) and the newest ids, half of the rest of the context."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import gguf_io
from localrt.engine.tokenizer import Tokenizer
from localrt.runtime.prompt_fit import cut_prompt, kept_counts


@pytest.mark.parametrize(
    "n_ctx, keep, bos, want",
    [
        (2048, 4, False, (4, 1022)),
        (2048, 4, True, (5, 1021)),
        (100, -1, False, (50, 25)),
        (100, 500, True, (50, 25)),
        (64, 0, False, (0, 32)),
        (64, 0, True, (1, 31)),
    ],
)
def test_kept_counts(n_ctx, keep, bos, want):
    assert kept_counts(n_ctx, keep, bos) == want


def test_a_cut_keeps_the_bos_the_head_and_the_newest_ids(gemma3_path):
    with gguf_io.open(gemma3_path) as f:
        tok = Tokenizer.from_gguf(f.metadata)  # Gemma 3 adds a BOS
    model = SimpleNamespace(tokenizer=tok)
    text = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))
    full = tok.encode(text)
    assert full[0] == tok.bos_id and len(full) > 1000
    ids = cut_prompt(model, text, 256, 4, tok.encode(text, limit=256))
    assert len(ids) == 5 + (256 - 5) // 2
    assert ids[:5] == full[:5] and ids[5:] == full[-(len(ids) - 5) :]
