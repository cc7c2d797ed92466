"""Live differential check against llama.cpp on random multilingual text (skipped without llama-cpp-python)."""

from __future__ import annotations

import ctypes
import random

import pytest

import gguf_io
from localrt.engine.tokenizer import Tokenizer

try:
    import llama_cpp
except (
    ImportError,
    OSError,
    RuntimeError,
) as e:  # not installed, or installed without its shared library (FileNotFoundError)
    pytest.skip(f"llama-cpp-python is not usable here: {e}", allow_module_level=True)

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "'s",
    "'t",
    "'re",
    "'LL",
    '.,;:!?-_()[]{}<>/\\|@#$%^&*+=~`"',
    "한국어 텍스트입니다",
    "日本語のテキスト、カタカナ",
    "中文文本测试。",
    "مرحبا بالعالم",
    "Привет мир",
    "🙂😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈",
    "é ü ñ Ça",
    "\u00a0\u2009\u3000\u200b\u200d\ufeff\x85\x0b",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "</s>",
    "<table>",
    "[multimodal]",
    "  \n\n  ",
    "\u2581",
    "𠜎𝔘",
    "हिन्दी",
    "a\u0301",
]


def _random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 10)):
        pool = rng.choice(POOLS)
        parts.append(pool if rng.random() < 0.5 else "".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
    return "".join(parts)


def _detokenize(vocab, ids: list[int]) -> bytes:
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    buf = ctypes.create_string_buffer(len(ids) * 64 + 64)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), False, False)
    return buf.raw[:n]


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_random_text_matches_llamacpp(model, smollm2_path, gemma3_path):
    path = {"smollm2": smollm2_path, "gemma3": gemma3_path}[model]
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    with gguf_io.open(path) as f:
        tok = Tokenizer.from_gguf(f.metadata)
    rng = random.Random(1234)
    for _ in range(150):
        text = _random_text(rng)
        for add_special, parse_special in ((True, True), (False, False), (True, False)):
            expected = llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)
            assert tok.encode(text, add_special, parse_special) == expected, (text, add_special, parse_special)
        ids = [rng.randrange(tok.n_vocab) for _ in range(rng.randint(1, 16))]
        assert tok.decode_bytes(ids) == _detokenize(vocab, ids), ids
