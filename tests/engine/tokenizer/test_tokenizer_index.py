"""TokenIndex: text -> id over a vocabulary left in the mapped file (gguf_io.StringArray), the same answers as
the dict it replaces; and the whole tokenizer built from lazy metadata equal to the one built from lists."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import gguf_io
from gguf_io import GGUFValueType as VT
from localrt.engine.tokenizer import Tokenizer
from localrt.engine.tokenizer.index import TokenIndex, _place, crc32_items
from localrt.errors import ModelLoadError

rng = np.random.default_rng(7)


def lazy_array(tmp_path, items: list[str], name="v.gguf"):
    path = tmp_path / name
    gguf_io.write(path, {"k": items}, [], metadata_types={"k": (VT.ARRAY, VT.STRING)})
    with gguf_io.open(path, lazy_strings=True) as f:
        return f.metadata["k"]


def test_vectorized_crc32_is_zlibs():
    items = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in [0, 1, 2, 3, 7, 8, 31, 300, 5, 0, 64]]
    data = np.frombuffer(b"".join(items), np.uint8)
    ends = np.cumsum([len(b) for b in items])
    starts = ends - [len(b) for b in items]
    assert crc32_items(data, starts, ends).tolist() == [zlib.crc32(b) for b in items]


def test_lookups_match_a_dict_including_a_crc_collision(tmp_path):
    assert zlib.crc32(b"plumless") == zlib.crc32(b"buckeroo")  # a known CRC-32 collision: both must be found
    words = ["plumless", "buckeroo", "a", "ab", "abc", "é", "日本", "\u2581the", "<0x0A>", "x\0y"]
    words += [f"w{i}" for i in range(3000)]
    index = TokenIndex(lazy_array(tmp_path, words), {})
    assert len(index) == len(words)
    for i, w in enumerate(words):
        assert index.get(w) == i and index[w] == i and w in index
    for miss in ["", "plumles", "buckeroox", "w3000", "b", "\ud800", "日", "x\0"]:
        assert index.get(miss) is None and miss not in index and index.get(miss, -1) == -1
        with pytest.raises(KeyError):
            index[miss]
    assert 5 not in index


def test_empty_entries_are_renamed_as_llama_cpp_does(tmp_path):
    tokens = lazy_array(tmp_path, ["a", "", "b", ""])
    index = TokenIndex(tokens, {1: "[EMPTY_1]", 3: "[EMPTY_3]"})
    assert index.get("[EMPTY_3]") == 3 and index.get("") is None and index.get("b") == 2


@pytest.mark.parametrize(
    "words, message",
    [
        (["a", "b", "a", "b"], r"'a' has ids 0 and 2"),
        (["x", "b", "c", "b", "x"], r"'b' has ids 1 and 3"),
        (["plumless", "buckeroo", "plumless"], r"'plumless' has ids 0 and 2"),
    ],
)
def test_duplicates_are_refused_as_the_dict_build_refuses_them(tmp_path, words, message):
    with pytest.raises(ModelLoadError, match=message):
        TokenIndex(lazy_array(tmp_path, words), {})


def test_a_renamed_empty_entry_that_collides_is_a_duplicate(tmp_path):
    with pytest.raises(ModelLoadError, match=r"'\[EMPTY_1\]' has ids 0 and 1"):
        TokenIndex(lazy_array(tmp_path, ["[EMPTY_1]", ""]), {1: "[EMPTY_1]"})


def test_placement_wraps_past_the_last_slot_and_every_id_is_reachable():
    mask = 15
    hashes = np.array([15, 15, 15, 14, 0, 1, 15, 3], np.uint32)  # a pile-up at the end wraps into slot 0..
    ids = np.arange(len(hashes))
    slots = _place(hashes, mask, ids)
    assert sorted(slots[slots >= 0].tolist()) == ids.tolist()
    for tid in ids.tolist():  # the lookup's walk from the home slot meets the id before any empty slot
        i = int(hashes[tid]) & mask
        while slots[i] != tid:
            assert slots[i] >= 0
            i = (i + 1) & mask


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_vocabularies_tokenize_alike_eager_and_lazy(model, request):
    path = request.getfixturevalue(f"{model}_path")
    with gguf_io.open(path) as f:
        eager = Tokenizer.from_gguf(f.metadata)
    with gguf_io.open(path, lazy_strings=True) as f:
        lazy = Tokenizer.from_gguf(f.metadata)
    assert not isinstance(lazy.vocab.tokens, list)
    texts = [
        "Hello world",
        "  two  spaces\tand\ttabs\n\nnew lines",
        "日本語のテキスト, émoji 🎉 and <|im_start|>user\nhi<|im_end|>",
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n",
        "x" * 300,
        "\x00 nul and \ud800 surrogate",
        "<0x0A> <unk> </s>",
    ]
    for text in texts:
        for special in (True, False):
            ids = eager.encode(text, parse_special=special)
            assert lazy.encode(text, parse_special=special) == ids
            assert lazy.decode(ids) == eager.decode(ids)
    v, w = eager.vocab, lazy.vocab
    assert (v.special_ids, v.eog_ids, v.attrs, list(v.scores)) == (w.special_ids, w.eog_ids, w.attrs, list(w.scores))
    for i in range(0, v.n_vocab, 499):
        assert w.tokens[i] == v.tokens[i] and w.token_to_id[v.tokens[i]] == i
