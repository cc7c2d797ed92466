"""Tokenizer rules on tiny hand-made vocabularies: SPM scoring and byte fallback, BPE ranks, special-token
partitioning, add_bos/add_eos defaults, end-of-generation detection, detokenizing and streaming, load errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gguf_io
from localrt.errors import InvalidRequest, ModelLoadError
from localrt.engine.tokenizer import Tokenizer
from localrt.engine.tokenizer.bpe import BYTE_TO_CHAR, byte_encode
from localrt.engine.tokenizer.stream import clean_spaces

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@pytest.fixture(autouse=True, params=["lists", "lazy_strings"])
def vocab_storage(request, monkeypatch, tmp_path):
    """Every rule here holds for metadata read eagerly (lists of str) and as the loader reads it (StringArrays)."""
    if request.param == "lazy_strings":
        from _lazy_vocab import _lazy_metadata

        build = Tokenizer.from_gguf.__func__
        monkeypatch.setattr(
            Tokenizer, "from_gguf", classmethod(lambda cls, md: build(cls, _lazy_metadata(md, tmp_path)))
        )
    return request.param


BYTES = [f"<0x{b:02X}>" for b in range(256)]


def spm_md(extra: list[tuple[str, float, int]], **keys) -> dict:
    """SPM vocabulary: <unk> <s> </s>, the 256 byte tokens, then `extra` (text, score, type)."""
    tokens = ["<unk>", "<s>", "</s>"] + BYTES + [t for t, _, _ in extra]
    scores = [0.0] * (3 + 256) + [s for _, s, _ in extra]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [k for _, _, k in extra]
    md = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, np.float32),
        "tokenizer.ggml.token_type": np.array(types, np.int32),
    }
    md.update({"tokenizer.ggml." + k: v for k, v in keys.items()})
    return md


def bpe_md(words: list[str], merges: list[str], pre: str = "gpt-2", extra: list[tuple[str, int]] = (), **keys) -> dict:
    tokens = list(BYTE_TO_CHAR) + [byte_encode(w) for w in words] + [t for t, _ in extra]
    types = [NORMAL] * (256 + len(words)) + [k for _, k in extra]
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": [" ".join(byte_encode(p) for p in m.split("|")) for m in merges],
    }
    md.update({"tokenizer.ggml." + k: v for k, v in keys.items()})
    return md


def ids_of(tok: Tokenizer, *texts: str) -> list[int]:
    return [tok.token_id(t) for t in texts]


# -- SPM ---------------------------------------------------------------------------------------------------
def test_spm_higher_score_merges_first():
    base = [("a", -1, NORMAL), ("b", -1, NORMAL), ("c", -1, NORMAL)]
    tok = Tokenizer.from_gguf(spm_md(base + [("ab", -5, NORMAL), ("bc", -2, NORMAL)], add_space_prefix=False))
    assert tok.encode("abc", add_special=False) == ids_of(tok, "a", "bc")
    tok = Tokenizer.from_gguf(spm_md(base + [("ab", -2, NORMAL), ("bc", -5, NORMAL)], add_space_prefix=False))
    assert tok.encode("abc", add_special=False) == ids_of(tok, "ab", "c")


def test_spm_equal_scores_merge_leftmost_first():
    tok = Tokenizer.from_gguf(
        spm_md(
            [("a", -1, NORMAL), ("b", -1, NORMAL), ("c", -1, NORMAL), ("ab", -3, NORMAL), ("bc", -3, NORMAL)],
            add_space_prefix=False,
        )
    )
    assert tok.encode("abc", add_special=False) == ids_of(tok, "ab", "c")


def test_spm_merges_only_through_vocabulary_pieces():
    # "abc" is a token but neither "ab" nor "bc" is, so no merge path reaches it.
    tok = Tokenizer.from_gguf(
        spm_md([("a", -1, NORMAL), ("b", -1, NORMAL), ("c", -1, NORMAL), ("abc", 0, NORMAL)], add_space_prefix=False)
    )
    assert tok.encode("abc", add_special=False) == ids_of(tok, "a", "b", "c")


def test_spm_byte_fallback_and_space_escape():
    tok = Tokenizer.from_gguf(spm_md([("\u2581", -1, NORMAL), ("a", -1, NORMAL), ("\u2581a", -2, NORMAL)]))
    ids = tok.encode("a é", add_special=False)
    assert ids == ids_of(tok, "\u2581a", "\u2581", "<0xC3>", "<0xA9>")  # add_space_prefix defaults to true
    assert tok.decode(ids) == "a é"  # the prefix space is removed again


def test_spm_space_prefix_follows_special_tokens():
    extra = [("\u2581", -1, NORMAL), ("a", -1, NORMAL), ("\u2581a", -2, NORMAL), ("<t>", 0, CONTROL)]
    tok = Tokenizer.from_gguf(spm_md(extra))
    assert tok.encode("a<t>a", add_special=False) == ids_of(tok, "\u2581a", "<t>", "\u2581a")
    tok = Tokenizer.from_gguf(spm_md(extra, add_space_prefix=False))
    assert tok.encode("a<t>a", add_special=False) == ids_of(tok, "a", "<t>", "a")


def test_spm_defaults_add_bos_not_eos():
    tok = Tokenizer.from_gguf(spm_md([("a", -1, NORMAL)], add_space_prefix=False))
    assert tok.encode("a") == [1, tok.token_id("a")]
    tok = Tokenizer.from_gguf(
        spm_md([("a", -1, NORMAL)], add_space_prefix=False, add_bos_token=False, add_eos_token=True)
    )
    assert tok.encode("a") == [tok.token_id("a"), 2]
    assert tok.encode("a", add_special=False) == [tok.token_id("a")]


def test_spm_missing_byte_token_is_a_clear_error():
    md = spm_md([("a", -1, NORMAL)], add_space_prefix=False)
    md["tokenizer.ggml.tokens"][3 + 0x7A] = "zz"  # drop <0x7A> ('z')
    tok = Tokenizer.from_gguf(md)
    with pytest.raises(InvalidRequest, match="0x7A"):
        tok.encode("z", add_special=False)


def test_spm_words_glued_by_vocabulary_are_not_cut():
    # A token spanning ">" + U+2581 forces the fast word split to keep ">" with the space run after it.
    extra = [
        ("\u2581", -1, NORMAL),
        (">", -1, NORMAL),
        ("x", -1, NORMAL),
        (">\u2581", -2, NORMAL),
        (">\u2581x", -3, NORMAL),
    ]
    tok = Tokenizer.from_gguf(spm_md(extra, add_space_prefix=False))
    assert tok.encode("> x", add_special=False) == ids_of(tok, ">\u2581x")


# -- BPE ---------------------------------------------------------------------------------------------------
def test_bpe_lowest_rank_merges_first():
    tok = Tokenizer.from_gguf(bpe_md(["ab", "bc"], ["b|c", "a|b"]))
    assert tok.encode("abc") == ids_of(tok, "a", "bc")
    tok = Tokenizer.from_gguf(bpe_md(["ab", "bc"], ["a|b", "b|c"]))
    assert tok.encode("abc") == ids_of(tok, "ab", "c")


def test_bpe_byte_encoding_of_spaces_and_utf8():
    md = bpe_md([" a", " é"], [])
    md["tokenizer.ggml.merges"] = ["Ġ a", "Ġ Ã", "ĠÃ ©"]  # é is C3 A9, byte-encoded as "Ã©"
    tok = Tokenizer.from_gguf(md)
    ids = tok.encode(" a é")
    assert ids == [tok.token_id("Ġa"), tok.token_id(byte_encode(" é"))]
    assert tok.decode(ids) == " a é"


def test_bpe_ignore_merges_emits_whole_word():
    words = ["hello"]
    assert Tokenizer.from_gguf(bpe_md(words, [], pre="llama-bpe")).encode("hello", add_special=False) == [256]
    assert Tokenizer.from_gguf(bpe_md(words, [], pre="gpt-2")).encode("hello") == [ord(c) for c in "hello"]


def test_bpe_unmergeable_symbol_falls_back_to_ascii_tokens_and_drops_other_bytes():
    md = bpe_md(["ab"], ["a|b"])
    md["tokenizer.ggml.tokens"][ord("a")] = "not-a"  # 'a' has no token; "ab" merges then is renamed away
    md["tokenizer.ggml.tokens"][256] = "renamed-ab"
    tok = Tokenizer.from_gguf(md)
    assert tok.encode("ab") == [ord("b")]


def test_bpe_pre_defaults_and_add_bos():
    md = bpe_md([], [], pre="llama-bpe", bos_token_id=5)
    assert Tokenizer.from_gguf(md).encode("") == [5]
    assert Tokenizer.from_gguf(bpe_md([], [], pre="smollm", bos_token_id=5)).encode("") == []
    with pytest.raises(ModelLoadError, match="unknown pre-tokenizer"):
        Tokenizer.from_gguf(bpe_md([], [], pre="mystery"))


def test_bpe_clean_spaces_on_decode():
    tok = Tokenizer.from_gguf(bpe_md([], [], pre="gpt-2"))
    ids = tok.encode("Hi , you 're here . ' ok")
    assert tok.decode(ids) == "Hi, you're here.'ok"
    smol = Tokenizer.from_gguf(bpe_md([], [], pre="smollm"))
    assert smol.decode(smol.encode("Hi , x .")) == "Hi , x ."


# -- special tokens --------------------------------------------------------------------------------------
def _special_tok(**keys) -> Tokenizer:
    extra = [("<|im_start|>", CONTROL), ("<|im_end|>", NORMAL), ("<tag>", USER_DEFINED), ("<tag>x", USER_DEFINED)]
    return Tokenizer.from_gguf(bpe_md([], [], pre="smollm", extra=extra, **keys))


def test_partition_parse_special():
    tok = _special_tok()
    start, end, tag = ids_of(tok, "<|im_start|>", "<|im_end|>", "<tag>")
    assert tok.encode("<|im_start|>a<|im_end|>") == [start, ord("a"), end]
    plain = tok.encode("<|im_start|>a<tag>", parse_special=False)
    assert start not in plain and plain[-1] == tag  # user-defined tokens match even without parse_special


def test_partition_prefers_longer_tokens():
    tok = _special_tok()
    assert tok.encode("<tag>x<tag>") == ids_of(tok, "<tag>x", "<tag>")


def test_eog_detection_promotes_turn_end_to_control():
    tok = _special_tok(eos_token_id=0)
    end = tok.token_id("<|im_end|>")
    assert end in tok.eog_ids and tok.is_control(end) and tok.eot_id == end
    assert tok.decode([end, ord("a")]) == "a"  # control tokens render as nothing
    assert tok.token_to_piece(end, special=True) == b"<|im_end|>"
    assert tok.decode([tok.token_id("<tag>")]) == "<tag>"  # user-defined tokens render as text


def test_phi3_specials_eat_following_whitespace():
    extra = [("<|user|>", CONTROL), ("</s>", CONTROL), ("<s>", CONTROL), ("<unk>", UNKNOWN), ("<|endoftext|>", CONTROL)]
    md = bpe_md([], [], pre="smollm", extra=extra)
    md["general.name"] = "Phi-3 mini"
    tok = Tokenizer.from_gguf(md)
    assert tok.encode("<|user|>  \n a") == [tok.token_id("<|user|>"), ord("a")]
    assert tok.encode("<|endoftext|> a") == [tok.token_id("<|endoftext|>"), ord(" "), ord("a")]


def test_harmony_end_is_not_eog():
    extra = [("<|end|>", CONTROL), ("<|return|>", CONTROL), ("<|call|>", CONTROL)]
    tok = Tokenizer.from_gguf(bpe_md([], [], pre="gpt-2", extra=extra, eos_token_id=257))
    assert tok.token_id("<|end|>") not in tok.eog_ids and tok.token_id("<|return|>") in tok.eog_ids


# -- decode and streaming --------------------------------------------------------------------------------
def test_stream_decoder_holds_incomplete_utf8():
    tok = Tokenizer.from_gguf(bpe_md([], [], pre="smollm"))
    ids = tok.encode("🙂!")
    assert len(ids) == 5
    dec = tok.stream_decoder()
    assert [dec.add(t) for t in ids] == ["", "", "", "🙂", "!"]
    assert dec.flush() == ""


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 255), max_size=40))
def test_stream_with_clean_spaces_equals_decode(ids):
    tok = Tokenizer.from_gguf(bpe_md([], [], pre="gpt-2"))
    dec = tok.stream_decoder(as_detokenize=True)
    assert "".join(dec.add(t) for t in ids) + dec.flush() == tok.decode(ids)
    dec = tok.stream_decoder()  # llama.cpp's generation output: raw pieces, no clean-up
    raw = b"".join(tok.token_to_piece(t) for t in ids).decode("utf-8", "replace")
    assert "".join(dec.add(t) for t in ids) + dec.flush() == raw


def test_stream_decoder_keeps_the_first_space_unless_asked():
    tok = Tokenizer.from_gguf(spm_md([("\u2581", -1, NORMAL), ("a", -1, NORMAL), ("\u2581a", -2, NORMAL)]))
    ids = tok.encode("a a", add_special=False)
    assert tok.decode(ids) == "a a"
    dec = tok.stream_decoder()
    assert "".join(dec.add(t) for t in ids) + dec.flush() == " a a"
    dec = tok.stream_decoder(as_detokenize=True)
    assert "".join(dec.add(t) for t in ids) + dec.flush() == "a a"


@pytest.mark.parametrize(
    "raw, cleaned",
    [
        (b" . ,x ? !", b".,x?!"),
        (b"a ' b", b"a'b"),
        (b"I 'm you 're it 's x 'll", b"I'm you're it's x 'll"),
        (b"  .", b" ."),
        (b" ' ' x", b"'' x"),
    ],
)
def test_clean_spaces_passes(raw, cleaned):
    assert clean_spaces(raw) == cleaned


def test_out_of_range_id_is_rejected():
    tok = Tokenizer.from_gguf(bpe_md([], [], pre="smollm"))
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        tok.decode([10_000])


# -- load errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda md: md.update({"tokenizer.ggml.model": "rwkv"}), "unsupported tokenizer model 'rwkv'"),
        (lambda md: md.pop("tokenizer.ggml.model"), "no tokenizer"),
        (lambda md: md.pop("tokenizer.ggml.tokens"), "no tokenizer vocabulary"),
        (lambda md: md["tokenizer.ggml.tokens"].__setitem__(5, "<0x00>"), "duplicate token"),
        (lambda md: md.update({"tokenizer.ggml.scores": np.zeros(3, np.float32)}), "entries for"),
        (lambda md: md.update({"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": 10**6}), None),
    ],
)
def test_bad_metadata_is_a_load_error(mutate, message):
    md = spm_md([("a", -1, NORMAL)])
    mutate(md)
    if message is None:  # an out-of-range bos id keeps the default id 1, so loading still works
        assert Tokenizer.from_gguf(md).bos_id == 1
        return
    with pytest.raises(ModelLoadError, match=message):
        Tokenizer.from_gguf(md)


def test_add_bos_without_bos_token_is_a_load_error():
    with pytest.raises(ModelLoadError, match="add_bos_token"):
        Tokenizer.from_gguf(bpe_md([], [], pre="chatglm-bpe", add_bos_token=True))


def test_bpe_without_merges_is_a_load_error():
    md = bpe_md([], [])
    del md["tokenizer.ggml.merges"]
    with pytest.raises(ModelLoadError, match="merges"):
        Tokenizer.from_gguf(md)


def test_roundtrip_through_a_gguf_file(tmp_path):
    md = spm_md([("\u2581", -1, NORMAL), ("a", -1, NORMAL), ("\u2581a", -2, NORMAL)], add_space_prefix=True)
    md["general.architecture"] = "llama"
    path = tmp_path / "tok.gguf"
    gguf_io.write(path, md, [])
    with gguf_io.open(path) as f:
        tok = Tokenizer.from_gguf(f.metadata)
    assert tok.encode("a a") == [1] + ids_of(tok, "\u2581a", "\u2581a")
