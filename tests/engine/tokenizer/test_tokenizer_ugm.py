"""Unigram (UGM, tokenizer.ggml.model "t5": XLM-RoBERTa's bge-m3, bge-reranker-v2-m3, multilingual-e5) tokenization
as llama.cpp's UGM tokenizer does it.

Golden part: two small sentencepiece unigram vocabularies written as XLM-R-style `bert` GGUFs (tests/data/ugm_nfkc.gguf
with nmt_nfkc's precompiled charsmap, add_space_prefix and remove_extra_whitespaces; tests/data/ugm_identity.gguf with
no charsmap and neither flag) against llama.cpp's ids, detokenized bytes and pieces recorded in
tests/data/ugm_golden.json by bench/make_ugm_golden.py. Then `limit=`, hostile charsmaps, the load defaults and
XLM-R's rerank pair.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import gguf_io
from localrt.engine.tokenizer import Tokenizer
from localrt.engine.tokenizer.ugm import KEY, parse_charsmap
from localrt.errors import InvalidRequest, ModelLoadError
from localrt.runtime.rerank import Specials, pair_ids
from _testpaths import DATA

GOLDEN = json.loads((DATA / "ugm_golden.json").read_text(encoding="utf-8"))
MODELS = sorted(GOLDEN["models"])


def _metadata(name: str, lazy: bool = False) -> dict:
    with gguf_io.open(DATA / f"ugm_{name}.gguf", lazy_strings=lazy) as f:
        return dict(f.metadata)


@pytest.fixture(
    scope="module",
    params=[(m, lazy) for m in MODELS for lazy in (False, True)],
    ids=lambda p: f"{p[0]}-{'lazy' if p[1] else 'lists'}",
)
def ugm(request) -> tuple[Tokenizer, dict]:
    name, lazy = request.param
    return Tokenizer.from_gguf(_metadata(name, lazy)), GOLDEN["models"][name]


@pytest.mark.parametrize("flags", ["11", "10", "01", "00"])
def test_golden_ids(ugm, flags):
    tok, gold = ugm
    add_special, parse_special = flags[0] == "1", flags[1] == "1"
    bad = [
        (c["text"][:50], tok.encode(c["text"], add_special, parse_special), c["ids"][flags])
        for c in gold["cases"]
        if tok.encode(c["text"], add_special, parse_special) != c["ids"][flags]
    ]
    assert not bad, bad[:3]


def test_golden_detokenize(ugm):
    tok, gold = ugm
    for c in gold["cases"]:
        assert tok.decode_bytes(c["ids"]["11"]).hex() == c["detok_hex"], c["text"][:50]
    for case in gold["detok_random"]:
        assert tok.decode_bytes(case["ids"]).hex() == case["hex"], case["ids"]


def test_golden_pieces_and_specials(ugm):
    tok, gold = ugm
    assert tok.n_vocab == gold["n_vocab"]
    assert (tok.bos_id, tok.eos_id) == (gold["bos"], gold["eos"])
    assert sorted(tok.eog_ids) == gold["eog"]
    assert [t for t in range(tok.n_vocab) if tok.is_control(t)] == gold["control"]
    for tid, (plain, special) in enumerate(gold["pieces"]):
        assert tok.token_to_piece(tid).hex() == plain, tid
        assert tok.token_to_piece(tid, special=True).hex() == special, tid


def test_limit_gives_the_start_of_the_full_answer(ugm):
    tok, gold = ugm
    for c in gold["cases"]:
        full = c["ids"]["11"]
        for limit in (0, 1, 3, 10, 40):
            got = tok.encode(c["text"], limit=limit)
            assert got == full[: len(got)], (c["text"][:40], limit)
            assert len(got) > limit or got == full, (c["text"][:40], limit)


def test_long_text_is_one_pass_and_words_are_independent():
    tok = Tokenizer.from_gguf(_metadata("nfkc"))
    cases = GOLDEN["models"]["nfkc"]["cases"]
    # a text made of golden texts without specials: each word's ids are the golden ones, joined
    texts = [c for c in cases if c["text"].isascii() and c["text"].strip() and "<" not in c["text"]][:8]
    joined = tok.encode("\n".join(c["text"] for c in texts), add_special=False)
    assert joined[: len(texts[0]["ids"]["00"])] == texts[0]["ids"]["00"]
    assert len(joined) >= sum(len(c["ids"]["00"]) for c in texts) - len(texts)


# -- the charsmap --------------------------------------------------------------------------------------------
def _charsmap() -> bytes:
    return bytes(_metadata("nfkc")[KEY])


def _with_charsmap(blob) -> dict:
    md = _metadata("nfkc")
    md[KEY] = blob
    return md


def test_real_charsmap_parses():
    cm = parse_charsmap(_charsmap())
    assert cm.match("\uff21".encode(), 0) == (b"A", 3)  # full-width A
    assert cm.match("\ufb01x".encode(), 0) == (b"fi", 3)  # the ligature
    assert cm.match(b"abc", 0) is None


def _hostile() -> list[tuple[str, object]]:
    real = _charsmap()
    size = struct.unpack_from("<I", real)[0]
    units = real[4 : 4 + size]
    return [
        ("empty", b""),
        ("three bytes", b"\x01\x00\x00"),
        ("size past the end", struct.pack("<I", len(real)) + real[4:]),
        ("size equal to the rest", struct.pack("<I", len(real) - 4) + real[4:]),
        ("huge size", struct.pack("<I", 0xFFFFFFFF) + real[4:]),
        ("truncated units", struct.pack("<I", 1024) + units[:1024] + b"x\0"),
        ("units cut short", struct.pack("<I", size // 2) + units[: size // 2] + real[4 + size :]),
        ("replacements cut", real[: 4 + size] + b"x"),
        ("replacements without NUL", real[: 4 + size] + real[4 + size :].replace(b"\0", b"_")),
        ("root outside", struct.pack("<I", 4) + struct.pack("<I", 0xFFFFFC00) + b"x\0"),
        ("leaf value outside", struct.pack("<I", 1024) + _one_key(value=1 << 30, next_base=1) + b"x\0"),
        ("leaf index outside", struct.pack("<I", 1024) + _one_key(next_base=0x1FFFFF) + b"x\0"),
        ("floats", np.zeros(16, np.float32)),
        ("strings", ["a", "b"]),
        ("2-D", np.zeros((4, 4), np.uint8)),
    ]


def _one_key(value: int = 0, next_base: int = 0) -> bytes:
    """256 units: the root's children at offset 0, one child "a" (a leaf) whose node lies at next_base."""
    units = [0] * 256
    units[0] = 0 << 10  # root base 0: child "a" is unit 0 ^ 97
    units[97] = (next_base << 10) | 0x100 | 97  # leaf; its node is 97 ^ next_base
    node = 97 ^ next_base
    if node < 256:
        units[node] = value
    return struct.pack("<256I", *units)


@pytest.mark.parametrize("case", _hostile(), ids=lambda c: c[0])
def test_hostile_charsmap_is_a_model_load_error(case):
    _, blob = case
    with pytest.raises(ModelLoadError, match="precompiled_charsmap"):
        Tokenizer.from_gguf(_with_charsmap(blob))


def test_cyclic_charsmap_loads_and_walks_to_the_end():
    units = [0] * 256
    units[97] = (97 << 10) | 0x100 | 97  # "a" leads back to the root: every run of a's is one key
    blob = struct.pack("<I", 1024) + struct.pack("<256I", *units) + b"b\0"
    cm = parse_charsmap(blob)
    assert cm.match(b"aaaa!", 0) == (b"b", 4)
    tok = Tokenizer.from_gguf(_with_charsmap(blob))
    assert tok.encode("a" * 20000, add_special=False) == tok.encode("b", add_special=False)


# -- load defaults and errors ----------------------------------------------------------------------------------
def test_defaults_when_the_file_is_silent():
    md = _metadata("identity")
    for key in ("add_bos_token", "add_eos_token", "bos_token_id", "eos_token_id", "unknown_token_id"):
        md.pop("tokenizer.ggml." + key)
    tok = Tokenizer.from_gguf(md)
    # llama.cpp's UGM defaults (T5's): no BOS, EOS 1 added, unknown 2, no space prefix, no whitespace merging
    assert (tok.add_bos, tok.add_eos, tok.bos_id, tok.eos_id, tok.vocab.ids["unk"]) == (False, True, None, 1, 2)
    assert tok.encode(" a  b", add_special=True)[-1] == 1
    assert not tok.vocab.add_space_prefix and not tok.vocab.remove_extra_whitespaces


def test_no_unknown_token_is_refused_when_needed():
    md = _metadata("identity")
    md["tokenizer.ggml.unknown_token_id"] = 10**6  # out of range: the default (2) stays, as llama.cpp does
    assert Tokenizer.from_gguf(md).vocab.ids["unk"] == 2
    types = list(md["tokenizer.ggml.token_type"])
    types[3] = 1  # <unk> becomes a normal token; the default unknown id 2 is "</s>"
    md["tokenizer.ggml.unknown_token_id"] = 3
    tok = Tokenizer.from_gguf(md)
    assert tok.encode("\u4e00\u4e01", add_special=False) == [3]
    md2 = _metadata("identity")
    md2["tokenizer.ggml.tokens"] = list(md2["tokenizer.ggml.tokens"])[:2]
    md2["tokenizer.ggml.scores"] = md2["tokenizer.ggml.scores"][:2]
    md2["tokenizer.ggml.token_type"] = md2["tokenizer.ggml.token_type"][:2]
    md2.pop("tokenizer.ggml.unknown_token_id")
    md2.pop("tokenizer.ggml.mask_token_id")
    md2["tokenizer.ggml.eos_token_id"] = 1
    md2.pop("tokenizer.ggml.seperator_token_id")
    with pytest.raises(InvalidRequest, match="unknown token"):
        Tokenizer.from_gguf(md2).encode("x", add_special=False)


def test_unsupported_model_message_names_t5():
    md = _metadata("identity")
    md["tokenizer.ggml.model"] = "rwkv"
    with pytest.raises(ModelLoadError, match="t5/UGM"):
        Tokenizer.from_gguf(md)


# -- XLM-R's rerank pair -----------------------------------------------------------------------------------------
def test_rerank_pair_is_xlm_r_s():
    md = _metadata("nfkc")
    md["tokenizer.ggml.add_sep_token"] = True  # as gguf-py writes it for XLM-R's "<s> A </s> </s> B </s>"
    tok = Tokenizer.from_gguf(md)
    q = tok.encode("what is it", add_special=False, parse_special=False)
    d = tok.encode("a document", add_special=False, parse_special=False)
    assert pair_ids(q, d, Specials.of(tok)) == [0, *q, 2, 2, *d, 2]  # <s> q </s></s> d </s>
    plain = Tokenizer.from_gguf(_metadata("nfkc"))
    assert pair_ids(q, d, Specials.of(plain)) == [0, *q, 2, *d, 2]


# -- end to end: a bert with this vocabulary loads, tokenizes and embeds as llama.cpp does ----------------------------
def test_bert_with_a_ugm_vocabulary_embeds_as_llamacpp_does(tmp_path):
    from fixtures import encoders
    from localrt.engine.loader import load_model

    ref = np.load(DATA / "bert" / "ugm.npz")
    model = load_model(encoders.write_ugm(tmp_path / "ugm.gguf"))
    try:
        for text, ids, want in zip(encoders.UGM_TEXTS, ref["ids"], ref["mean"]):
            ids = [int(i) for i in ids if i >= 0]
            assert model.tokenizer.encode(text) == ids, text
            got = model.embed(ids)
            assert encoders.cosine(got, want) > 0.99999, text
    finally:
        model.close()
