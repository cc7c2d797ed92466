"""Record llama.cpp's own tokenizer output as golden data for tests/engine/tokenizer/test_tokenizer*.py.

    python3 bench/make_tokenizer_golden.py            # writes tests/data/tokenizer_golden.json

Needs `llama-cpp-python` (tests never do). Three parts:
- "models": for each real model, llama.cpp's ids for a multilingual text set (`tokenize(text, add_bos=True,
  special=True)` and `add_bos=False, special=False`), `llama_detokenize` of those ids, and the pieces of a
  fixed sample of token ids.
- "pre_tokenizers": for every `tokenizer.ggml.pre` value localrt supports, llama.cpp's split of a text set.
  The split is observed through a synthetic BPE vocabulary that holds every substring of the (byte-encoded)
  texts with a merge for every way to cut it, so llama.cpp merges each pre-token fragment into exactly one
  token and the token sequence *is* the fragment sequence.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localrt.models import builtin_models  # noqa: E402
from localrt.engine.tokenizer import pretokenize  # noqa: E402
from localrt.engine.tokenizer.bpe import BYTE_TO_CHAR, CHAR_TO_BYTE, byte_encode  # noqa: E402

OUT = ROOT / "tests" / "data" / "tokenizer_golden.json"

TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello, world! How's it going? I'm fine; you'll see, we've done it. They'd said \"don't\".",
    "SHOUTING IT'S LOUD, WE'LL SEE, YOU'RE RIGHT, I'VE GOT IT",
    "안녕하세요, 세계! 한국어 텍스트를 토큰화합니다. 서울특별시 종로구",
    "日本語のテキストをトークン化します。東京都渋谷区、カタカナとひらがな、ｶﾀｶﾅ半角。",
    "中文分词测试：我们今天去北京天安门广场，看升旗仪式。繁體中文也要測試。",
    "مرحبا بالعالم! هذا نص عربي للاختبار. ١٢٣٤٥٦٧٨٩٠",
    "שלום עולם, זה טקסט בעברית",
    "हिन्दी में परीक्षण पाठ है। नमस्ते दुनिया",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ",
    "Привет, мир! Это тест токенизатора. Ёжик в тумане.",
    "Ελληνικά: Γειά σου Κόσμε! αβγδε ΑΒΓΔΕ",
    "Emoji: 🙂😀🚀 👍🏽👍🏿 family 👨‍👩‍👧‍👦 rainbow 🏳️‍🌈 flags 🇫🇷🇰🇷🇯🇵 keycap 1️⃣ heart ❤️",
    "Zero width:\u200b\u200c\u200d\u2060\ufeff joiners; NBSP\u00a0here; thin\u2009space; ideographic\u3000space; NEL\x85.",
    "Combining: e\u0301 a\u0300 n\u0303 o\u0308 \u1e9b\u0323 Å Å ﬁ ﬀ ℃ ½ ² Ⅻ ⑦",
    "Byte fallback: 𠜎𠜱𠝹𠱓 \U000f0000 \ue000 \x00\x01\x1f\x7f",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "function add(a, b) { return a + b; } // JS\nconst x = [1, 2, 3].map((v) => v ** 2);",
    '{"key": "value", "list": [1, 2.5, -3e10], "nested": {"a": null, "b": true}}',
    "<html><body><table><tr><td>cell</td></tr></table><s>strike</s></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%';",
    "    indented\n\tTabbed\n\t\tDouble\t\tTabs\n\n\n\nFour newlines\r\nCRLF\rCR",
    "a  b   c    d     e      f                                  g",
    "trailing spaces   \n   leading spaces\n\n \n \n",
    "\n\n\n",
    "\t\t\t",
    "Numbers: 0 7 42 123 1234 12345 123456 1234567890 3.14159 -2.5e-10 1,000,000 ٣٤٥ ๑๒๓",
    "Phone +1 (555) 123-4567, IP 192.168.0.1, date 2024-06-30T12:34:56Z, price $19.99 €5 ¥100",
    "URL https://example.com/path?q=a+b&x=1#frag and email someone@example.org",
    "Math: ∑_{i=1}^{n} x_i² ≤ ∞, ∀x∈ℝ: x≠0 ⇒ x²>0; α+β=γ",
    "Mixed: English 한국어 日本語 中文 العربية русский 🙂 done.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE __dunder__",
    "'quoted' \"double\" `backtick` «guillemets» „german“ 'single' …",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi <|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|im_end|><|im_start|>",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>",
    "<bos>already has bos<eos> and <pad> <unk> <mask> [multimodal] <unused12> <start_of_image>",
    "</s> closing s and <s> opening s, <h1>title</h1>",
    "\u2581leading lower-one-eighth-block \u2581\u2581 runs",
    "Ça va? Déjà vu! Naïve façade, coöperate, Øresund, straße, İstanbul, ǅemal",
]


# -- real models -----------------------------------------------------------------------------------------
def _detokenize(vocab, ids: list[int]) -> bytes:
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)  # an empty list still needs an array
    buf = ctypes.create_string_buffer(len(ids) * 64 + 64)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), False, False)
    if n < 0:
        raise RuntimeError("detokenize buffer too small")
    return buf.raw[:n]


def _piece(vocab, tid: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(512)
    n = llama_cpp.llama_token_to_piece(vocab, tid, buf, len(buf), 0, special)
    return buf.raw[:n]


def _sample_ids(n_vocab: int) -> list[int]:
    ids = set(range(0, min(n_vocab, 600))) | set(range(n_vocab - 50, n_vocab))
    ids |= set(range(0, n_vocab, max(1, n_vocab // 700)))
    return sorted(ids)


def model_golden(name: str) -> dict:
    path = builtin_models.BUILTIN[name]()
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for text in TEXTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_plain": llm.tokenize(text.encode(), add_bos=False, special=False),
                "detok_hex": _detokenize(vocab, ids).hex(),
            }
        )
    sample = _sample_ids(n_vocab)
    return {
        "file": path.name,
        "n_vocab": n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "control": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, t)],
        "cases": cases,
        "pieces": {str(t): [_piece(vocab, t, False).hex(), _piece(vocab, t, True).hex()] for t in sample},
    }


# -- pre-tokenizers --------------------------------------------------------------------------------------
PRE_TEXTS = [
    "Hello world's 123456",
    "I'M don't WE'LL",
    "a  b   c\n\n d",
    "\t\tx \r\n y",
    " 3.14159 ,; !!",
    "한국어 텍스트",
    "日本語のカナ",
    "中文。测试",
    "مرحبا ١٢٣",
    "👨‍👩‍👧 ok🙂",
    "x\u00a0y\u3000z",
    "snake_case+=<=>",
    "CamelCaseWORDSx",
    "1,000,000 ok",
    "  \n  \n",
    "é Ça ñandú",
    "IMGIMGABZ <sentinel:12>",
    "a'b 'C' 's",
    "foo/bar\n/// x",
    "हिन्दी ok",
    "ǅx Ǆy ǆ",
    "a\u0301b\u0300 c",
    "...---___",
    "[]{}()<>",
    "$5 ^2 ~x |y `z`",
    "\x0b\x0c\x1c\x85 w",
    "12345678901",
    "Ⅻ½² x",
    "ก ข ค",
    "tab\tend\t",
    "x    \n\n   y",
    "'s's 'll'LL",
]


def _write_synthetic(path: str, pre: str, texts: list[str]) -> list[str]:
    tokens = list(BYTE_TO_CHAR)
    seen = set(tokens)
    merges: list[str] = []
    seen_merges: set[str] = set()
    for text in texts:
        enc = byte_encode(text)
        for i in range(len(enc)):
            for j in range(i + 2, len(enc) + 1):
                sub = enc[i:j]
                if sub not in seen:
                    seen.add(sub)
                    tokens.append(sub)
                for k in range(1, len(sub)):
                    m = sub[:k] + " " + sub[k:]
                    if m not in seen_merges:
                        seen_merges.add(m)
                        merges.append(m)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def llama_split(pre: str, texts: list[str]) -> list[list[str]]:
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        tokens = _write_synthetic(path, pre, texts)
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        out = []
        for text in texts:
            ids = llm.tokenize(text.encode(), add_bos=False, special=False)
            out.append([bytes(CHAR_TO_BYTE[c] for c in tokens[i]).decode("utf-8") for i in ids])
        del llm
        return out
    finally:
        os.unlink(path)


def pre_golden() -> list[dict]:
    groups: dict[str, dict] = {}
    for pre in sorted(pretokenize.PRE_TYPES):
        splits = llama_split(pre, PRE_TEXTS)
        key = json.dumps(splits, ensure_ascii=False)
        groups.setdefault(key, {"names": [], "splits": splits})["names"].append(pre)
    return list(groups.values())


def main() -> None:
    golden = {
        "producer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, bench/make_tokenizer_golden.py",
        "models": {name: model_golden(name) for name in ("smollm2", "gemma3")},
        "pre_texts": PRE_TEXTS,
        "pre_tokenizers": pre_golden(),
    }
    OUT.write_text(json.dumps(golden, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
