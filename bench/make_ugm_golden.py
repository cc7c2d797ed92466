"""Record llama.cpp's UGM (unigram, `tokenizer.ggml.model` "t5") tokenizer output as golden data.

    python3 bench/make_ugm_golden.py     # writes tests/data/ugm_<name>.gguf and tests/data/ugm_golden.json

Needs `llama-cpp-python` and `sentencepiece` (developer tools only: tests and localrt need neither). Two small
unigram models are trained here with sentencepiece on a multilingual text built from the repository's README,
docs/measurements.md and the WPM golden texts, and written as vocab-only `bert` GGUFs laid out as llama.cpp's
converter lays out XLM-RoBERTa (bge-m3, multilingual-e5): `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, then the
sentencepiece pieces; at the end two USER_DEFINED tokens, an UNUSED "[PAD...]" filler and a CONTROL `<mask>`.
- "nfkc": nmt_nfkc normalization (its precompiled_charsmap in the file), add_space_prefix and
  remove_extra_whitespaces on, add_bos and add_eos on (XLM-R);
- "identity": no charsmap, neither whitespace flag in the file (llama.cpp's defaults: off), add_bos off.
Recorded per model and text: `llama_tokenize` ids for add_special x parse_special and `llama_detokenize`
(remove_special=False, unparse_special=False) of the add_special+parse_special ids; the pieces of every token
with special off and on; the detokenized bytes of random id sequences.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import llama_cpp
import sentencepiece as spm
from make_tokenizer_golden import _detokenize, _piece  # llama.cpp's detokenize and token_to_piece, as there
from make_wpm_golden import TEXTS as WPM_TEXTS, _tokenize, write_vocab_gguf

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
OUT = DATA / "ugm_golden.json"
USER_DEFINED = ["<url>", "\u00e9!"]  # "é!": its first byte is a prefix of "è", "ê" ... (see the texts)

MODELS = {
    "nfkc": {"rule": "nmt_nfkc", "prefix": True, "extra_ws": True, "add_bos": True, "vocab": 1500},
    "identity": {"rule": "identity", "prefix": None, "extra_ws": None, "add_bos": False, "vocab": 1000},
}

TEXTS = WPM_TEXTS + [
    "  leading and trailing spaces  ",
    "many     inner      spaces\t\t and \n\n newlines",
    "\u3000ideographic\u3000\u3000space\u3000",
    "ﬁnance ﬂow ﬀ ﬃ ﬄ ﬅ ﬆ and ㍿ ㌔ ™ ℡ ℃ ㎏",
    "ＦＵＬＬ　ＷＩＤＴＨ　ｔｅｘｔ，ｗｉｔｈ　ｐｕｎｃｔｕａｔｉｏｎ！",
    "e\u0301e\u0300 o\u0302 u\u0308 C\u0327 n\u0303 \u0041\u030a \u00c5 \u212b",
    "<s>",
    "</s>",
    "<s> text </s>",
    "<s></s><s>",
    "a<s>b</s>c",
    "<pad><unk><mask> x",
    "<url> https://x.y <url><url>",
    " <url> ",
    "é! è! ê é",
    "éé!!",
    "<ur",
    "<url",
    "\u00e8",
    "\u00e9",
    "[PAD1503] [PAD",
    "\x00nul\x00 inside",
    "\x01\x02\x03\x04\x05\x06\x07\x08",
    "\ufeffBOM start",
    "trailing nul\x00",
    "🙂",
    "🙂🙂🙂 👩\u200d💻 🇯🇵",
    " ",
    "  ",
    "\t",
    "\n",
    "\u2581",
    " \u2581 ",
    "\u2581\u2581x",
    "x",
    "xx",
    "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq",
    "zzz" * 50,
    "Тест ТЕСТ тест",
    "ǅ ǆ Ǆ",
    "Ⅻ ⅻ ⑦ ½ ¼ ² ₂ ª º",
    "日本語とEnglishのmixed文章です。",
    "한국어와 English 혼합",
]


def corpus() -> str:
    parts = [
        (ROOT / "README.md").read_text(encoding="utf-8"),
        (ROOT / "docs" / "measurements.md").read_text(encoding="utf-8"),
    ]
    parts += WPM_TEXTS * 3
    return "\n".join(line for part in parts for line in part.splitlines() if line.strip())


def _proto_fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message; enough for sentencepiece's ModelProto."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        else:
            raise ValueError(f"wire type {wire}")
        yield field, wire, value


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def charsmap_of(model_proto: bytes) -> bytes:
    """normalizer_spec (field 3) . precompiled_charsmap (field 2) of a serialized ModelProto."""
    for field, _, value in _proto_fields(model_proto):
        if field == 3:
            for sub, _, v in _proto_fields(value):
                if sub == 2:
                    return v
    return b""


def train(name: str, opts: dict, text: str) -> tuple[spm.SentencePieceProcessor, bytes]:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()),
        model_writer=out,
        model_type="unigram",
        vocab_size=opts["vocab"],
        hard_vocab_limit=False,
        normalization_rule_name=opts["rule"],
        add_dummy_prefix=bool(opts["prefix"]),
        remove_extra_whitespaces=bool(opts["extra_ws"]),
        byte_fallback=False,
        character_coverage=0.9995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        seed_sentencepiece_size=100000,
        minloglevel=2,
    )
    proto = out.getvalue()
    return spm.SentencePieceProcessor(model_proto=proto), charsmap_of(proto)


def vocab_metadata(sp: spm.SentencePieceProcessor, charsmap: bytes, opts: dict) -> dict:
    # XLM-R's realignment: <s> <pad> </s> <unk>, then sentencepiece's pieces from its id 3 on
    tokens = ["<s>", "<pad>", "</s>", "<unk>"]
    scores = [0.0, 0.0, 0.0, 0.0]
    types = [3, 3, 3, 2]
    for i in range(3, sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i) else 1)
    for text in USER_DEFINED:
        tokens.append(text)
        scores.append(0.0)
        types.append(4)
    tokens.append(f"[PAD{len(tokens)}]")
    scores.append(-10000.0)
    types.append(5)
    tokens.append("<mask>")
    scores.append(0.0)
    types.append(3)
    md = {
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.seperator_token_id": 2,
        "tokenizer.ggml.padding_token_id": 1,
        "tokenizer.ggml.mask_token_id": len(tokens) - 1,
        "tokenizer.ggml.add_bos_token": opts["add_bos"],
        "tokenizer.ggml.add_eos_token": True,
    }
    if opts["prefix"] is not None:
        md["tokenizer.ggml.add_space_prefix"] = opts["prefix"]
    if opts["extra_ws"] is not None:
        md["tokenizer.ggml.remove_extra_whitespaces"] = opts["extra_ws"]
    if charsmap:
        md["tokenizer.ggml.precompiled_charsmap"] = charsmap
    return md


def record(path: Path) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for text in TEXTS:
        ids = {f"{a:d}{p:d}": _tokenize(vocab, text, a, p) for a in (True, False) for p in (True, False)}
        cases.append({"text": text, "ids": ids, "detok_hex": _detokenize(vocab, ids["11"]).hex()})
    rng = random.Random(20240611)
    random_ids = [[rng.randrange(n_vocab) for _ in range(rng.randint(1, 16))] for _ in range(150)]
    random_ids += [
        [rng.choice([0, 1, 2, 3, n_vocab - 1, n_vocab - 2, n_vocab - 3, 4, 5, 6, 7]) for _ in range(rng.randint(1, 6))]
        for _ in range(50)
    ]
    out = {
        "n_vocab": n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "control": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, t)],
        "cases": cases,
        "pieces": [[_piece(vocab, t, False).hex(), _piece(vocab, t, True).hex()] for t in range(n_vocab)],
        "detok_random": [{"ids": ids, "hex": _detokenize(vocab, ids).hex()} for ids in random_ids],
    }
    del llm
    return out


def main() -> None:
    text = corpus()
    golden = {
        "producer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, bench/make_ugm_golden.py",
        "models": {},
    }
    for name, opts in MODELS.items():
        sp, charsmap = train(name, opts, text)
        path = DATA / f"ugm_{name}.gguf"
        write_vocab_gguf(str(path), vocab_metadata(sp, charsmap, opts), token_type_count=1)
        golden["models"][name] = record(path)
        print(f"wrote {path} ({path.stat().st_size} bytes, charsmap {len(charsmap)} bytes)")
    OUT.write_text(json.dumps(golden, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(TEXTS)} texts x 4 modes x {len(MODELS)} models)")


if __name__ == "__main__":
    main()
