"""Crafted malformed GGUF files (pain_points.md section 8, items 1-11): each is one clear InvalidGGUF."""

from __future__ import annotations

import functools
import struct

import pytest

import gguf_io
from gguf_io import GGMLType, GGUFValueType, InvalidGGUF

T = GGUFValueType


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + u32(vtype) + payload


def info(name: str, ne: tuple[int, ...], ggml_type: int = GGMLType.F32, offset: int = 0) -> bytes:
    return s(name) + u32(len(ne)) + b"".join(u64(d) for d in ne) + u32(ggml_type) + u64(offset)


def gguf(kvs=(), infos=(), data=b"", *, version=3, n_kv=None, n_tensors=None, alignment=32) -> bytes:
    head = (
        b"GGUF"
        + u32(version)
        + u64(len(infos) if n_tensors is None else n_tensors)
        + u64(len(kvs) if n_kv is None else n_kv)
        + b"".join(kvs)
        + b"".join(infos)
    )
    return head + bytes(-len(head) % alignment) + data


@pytest.fixture(autouse=True, params=[False, True], ids=["eager", "lazy_strings"])
def lazy_strings(request, monkeypatch):
    """Every hostile file here is refused alike with string arrays read as lists and as offsets (StringArray)."""
    monkeypatch.setattr(gguf_io, "open", functools.partial(gguf_io.split.open_model, lazy_strings=request.param))
    return request.param


ARCH = kv("general.architecture", T.STRING, s("llama"))
ONE_TENSOR = gguf([ARCH], [info("w", (4,))], bytes(16))


def _open(tmp_path, blob: bytes, name: str = "bad.gguf"):
    path = tmp_path / name
    path.write_bytes(blob)
    return gguf_io.open(path)


def _rejects(tmp_path, blob: bytes, match: str) -> str:
    with pytest.raises(InvalidGGUF, match=match) as e:
        _open(tmp_path, blob)
    return str(e.value)


def test_baseline_crafted_file_is_valid(tmp_path):
    with _open(tmp_path, ONE_TENSOR) as f:
        assert f.tensors["w"].data.shape == (1, 16) and f.metadata == {"general.architecture": "llama"}


# 1. Not a GGUF at all.
@pytest.mark.parametrize(
    "blob, match",
    [
        (b"", r"empty file \(0 bytes\)"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 98362432\n", "git-lfs pointer"),
        (b"<!DOCTYPE html>\n<html><body>404</body></html>", "HTML page"),
        (b"  <html><head><title>Sign in</title>", "HTML page"),
        (b"PK\x03\x04" + bytes(60), "zip archive"),
        (b"ggjt" + bytes(60), "old GGJT"),
        (u64(2) + b"{}" + bytes(20), "safetensors"),
        (b"GGUU" + bytes(60), r"magic is b'GGUU', expected b'GGUF'"),
        (b"GG", "only 2 bytes long"),
    ],
)
def test_not_a_gguf(tmp_path, blob, match):
    _rejects(tmp_path, blob, match)


# 2. Versions and truncation anywhere in the header.
@pytest.mark.parametrize("version", [0, 1, 4, 99, 0xFFFFFFFF])
def test_unsupported_version(tmp_path, version):
    _rejects(tmp_path, gguf(version=version), f"unsupported GGUF version {version}")


def test_big_endian_file_is_named(tmp_path):
    _rejects(tmp_path, b"GGUF" + struct.pack(">I", 3) + bytes(16), "big-endian")


def test_version_2_is_read(tmp_path):
    with _open(tmp_path, gguf([ARCH], [info("w", (4,))], bytes(16), version=2)) as f:
        assert f.version == 2


KV_ONLY = gguf([ARCH, kv("general.name", T.STRING, s("tiny"))])


@pytest.mark.parametrize(
    "blob, cut, where",
    [
        (ONE_TENSOR, 5, "version"),
        (ONE_TENSOR, 12, "tensor count"),
        (ONE_TENSOR, 30, "entries counted by tensor count"),
        (KV_ONLY, 50, "key of metadata pair #0"),
        (KV_ONLY, 60, "'general.architecture'"),
        (KV_ONLY, 70, "key of metadata pair #1"),
        (KV_ONLY, 100, "'general.name'"),
        (ONE_TENSOR, 70, "name of tensor #0"),
        (ONE_TENSOR, 90, "tensor 'w'"),
    ],
)
def test_truncated_header(tmp_path, blob, cut, where):
    msg = _rejects(tmp_path, blob[:cut], rf"truncated file: header says \d+ bytes needed \(.*{where}")
    assert msg.endswith(f"file has {cut}")


def test_truncated_tensor_data(tmp_path):
    _rejects(
        tmp_path,
        ONE_TENSOR[:-4],
        rf"truncated file: header says {len(ONE_TENSOR)} bytes needed, "
        rf"file has {len(ONE_TENSOR) - 4}",
    )


# 3. Huge counts.
@pytest.mark.parametrize(
    "field, value",
    [
        ("n_kv", 2**64 - 1),
        ("n_kv", 2**64 // 24),
        ("n_tensors", 2**64 - 1),
        ("n_tensors", 2**63),
        ("n_tensors", 70_000),
        ("n_kv", 70_000),
    ],
)
def test_huge_counts_hit_the_cap(tmp_path, field, value):
    _rejects(tmp_path, gguf(**{field: value}), f"is {value}, over the cap of 65536")


@pytest.mark.parametrize("field", ["n_kv", "n_tensors"])
def test_count_beyond_file_is_truncation(tmp_path, field):
    _rejects(tmp_path, gguf(**{field: 60_000}), r"truncated file: header says \d+ bytes needed \(60000 entries")


# 4. String lengths.
@pytest.mark.parametrize("length", [100, 2**63, 2**64 - 1])
def test_string_length_beyond_file(tmp_path, length):
    blob = gguf([s("general.name")[:0] + u64(length) + b"general.name"])
    _rejects(tmp_path, blob, r"truncated file: header says \d+ bytes needed \(key of metadata pair #0")


def test_value_string_length_2_pow_63(tmp_path):
    blob = gguf([s("general.name") + u32(T.STRING) + u64(2**63) + b"x"])
    _rejects(tmp_path, blob, "truncated file.*general.name")


def test_header_over_the_cap(tmp_path):
    path = tmp_path / "big.gguf"
    blob = gguf([kv("general.name", T.STRING, u64(70 << 20))])
    with path.open("wb") as f:
        f.write(blob)
        f.truncate(80 << 20)  # sparse: the file is big enough, the header cap is what trips
    with pytest.raises(InvalidGGUF, match="cap on the header"):
        gguf_io.open(path)


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"a\xc3", b"\xed\xa0\x80"])
def test_invalid_utf8(tmp_path, raw):
    _rejects(tmp_path, gguf([kv("k", T.STRING, s(raw))]), "not valid UTF-8")
    _rejects(tmp_path, gguf([kv(b"k" + raw, T.UINT8, b"\0")]), "not valid UTF-8")
    arr = u32(T.STRING) + u64(2) + s("ok") + s(raw)
    _rejects(tmp_path, gguf([kv("k", T.ARRAY, arr)]), r"'k'\[1\] is not valid UTF-8")


# 5. Arrays.
@pytest.mark.parametrize(
    "etype, count, match",
    [
        (T.UINT8, 2**64 - 1, "over the cap"),
        (T.STRING, 2**40, "over the cap"),
        (T.FLOAT32, 1000, r"truncated file.*1000 entries counted by length of 'k'"),
        (T.STRING, 1000, r"truncated file.*1000 entries"),
        (T.ARRAY, 1000, r"truncated file.*1000 entries"),
    ],
)
def test_array_counts(tmp_path, etype, count, match):
    _rejects(tmp_path, gguf([kv("k", T.ARRAY, u32(etype) + u64(count))]), match)


def test_string_array_item_past_end(tmp_path):
    arr = u32(T.STRING) + u64(2) + s("ok") + u64(10**6) + b"xx"
    _rejects(tmp_path, gguf([kv("k", T.ARRAY, arr)]), r"truncated file.*'k'\[1\]")


@pytest.mark.parametrize("length", [2**63, 2**64 - 9])
def test_string_array_item_length_past_any_offset(tmp_path, length):
    # The offsets pass runs unchecked; a length that throws the next read past any buffer is named all the same.
    arr = u32(T.STRING) + u64(3) + s("ok") + u64(length) + b"xx" + s("z")
    _rejects(tmp_path, gguf([kv("k", T.ARRAY, arr)]), r"truncated file.*'k'\[1\]")


def test_array_of_arrays_is_read(tmp_path):
    inner = u32(T.INT32) + u64(2) + u32(7) + u32(8)
    strings = u32(T.STRING) + u64(1) + s("z")
    with _open(tmp_path, gguf([kv("k", T.ARRAY, u32(T.ARRAY) + u64(2) + inner + strings)])) as f:
        assert f.metadata["k"][0].tolist() == [7, 8] and f.metadata["k"][1] == ["z"]
        assert f.metadata_types["k"] == (T.ARRAY, T.ARRAY, ((T.ARRAY, T.INT32), (T.ARRAY, T.STRING)))


def test_deeply_nested_arrays_hit_the_cap(tmp_path):
    payload = (u32(T.ARRAY) + u64(1)) * 50 + u32(T.UINT8) + u64(0)
    _rejects(tmp_path, gguf([kv("k", T.ARRAY, payload)]), "nested deeper than 8")


def test_too_many_string_items_hit_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_io.constants, "MAX_METADATA_ITEMS", 10)
    monkeypatch.setattr("gguf_io._cursor.MAX_METADATA_ITEMS", 10)
    arr = u32(T.STRING) + u64(11) + s("") * 11
    _rejects(tmp_path, gguf([kv("k", T.ARRAY, arr)]), "more than 10 string or nested-array items")


@pytest.mark.parametrize(
    "key, payload, match",
    [
        ("tokenizer.ggml.scores", u32(T.INT8) + u64(1) + b"\x01", r"ARRAY\[INT8\], expected ARRAY\[FLOAT32\]"),
        ("tokenizer.ggml.tokens", u32(T.INT32) + u64(1) + u32(1), r"expected ARRAY\[STRING\]"),
        ("tokenizer.ggml.token_type", u32(T.FLOAT32) + u64(1) + u32(1), r"expected ARRAY\[INT32\]"),
    ],
)
def test_tokenizer_arrays_of_the_wrong_type(tmp_path, key, payload, match):
    _rejects(tmp_path, gguf([kv(key, T.ARRAY, payload)]), match)


# 6. Duplicates and unknown type ids.
def test_duplicate_key(tmp_path):
    _rejects(tmp_path, gguf([ARCH, ARCH]), "duplicate metadata key 'general.architecture'")


def test_duplicate_tensor_name(tmp_path):
    blob = gguf([], [info("w", (4,)), info("w", (4,), offset=32)], bytes(64))
    _rejects(tmp_path, blob, "duplicate tensor name 'w'")


@pytest.mark.parametrize("vtype", [13, 255, 0xFFFFFFFF])
def test_unknown_value_type(tmp_path, vtype):
    _rejects(tmp_path, gguf([kv("k", vtype, u32(0))]), f"unknown value type of 'k' {vtype}")
    _rejects(tmp_path, gguf([kv("k", T.ARRAY, u32(vtype) + u64(0))]), f"unknown element type of 'k' {vtype}")


def test_bool_byte_other_than_0_or_1(tmp_path):
    _rejects(tmp_path, gguf([kv("k", T.BOOL, b"\x02")]), "bool byte is 2")
    _rejects(tmp_path, gguf([kv("k", T.ARRAY, u32(T.BOOL) + u64(2) + b"\x01\x05")]), "bool array")


@pytest.mark.parametrize("ggml_type", [4, 5, 31, 33, 42, 0xFFFFFFFF])
def test_unsupported_tensor_type(tmp_path, ggml_type):
    blob = gguf([], [info("w", (4,), ggml_type)], bytes(64))
    _rejects(tmp_path, blob, f"tensor 'w'.*unsupported tensor type id {ggml_type}")


def test_ollamas_gpt_oss_type_is_named(tmp_path):
    blob = gguf([], [info("blk.0.ffn_down_exps.weight", (32,), 4)], bytes(64))
    _rejects(tmp_path, blob, "type id 4 .*Ollama's own gpt-oss files.*converted by llama.cpp")


# 7. Dimensions.
@pytest.mark.parametrize("n_dims", [0, 5, 0xFFFFFFFF])
def test_bad_n_dims(tmp_path, n_dims):
    blob = gguf([], [s("w") + u32(n_dims) + u64(4) * 5 + u32(0) + u64(0)], bytes(64))
    _rejects(tmp_path, blob, f"n_dims {n_dims}, expected 1..4")


@pytest.mark.parametrize(
    "ne, match",
    [
        ((4, 0), r"must each be in 1..2\^63-1"),
        ((0,), r"must each be in 1..2\^63-1"),
        ((2**63,), r"must each be in 1..2\^63-1"),
        ((2**32, 2**32), "overflows int64"),
        ((2**62, 2, 2), "overflows int64"),
        ((2**40, 2**20), "truncated file: header says 4611686018427388000 bytes needed, file has 160"),
        ((33, 1), "row length 33 is not a multiple of the Q8_0 block size 32"),
    ],
)
def test_bad_dimensions(tmp_path, ne, match):
    ggml_type = GGMLType.Q8_0 if "Q8_0" in match else GGMLType.F32
    _rejects(tmp_path, gguf([], [info("w", ne, ggml_type, offset=0)], bytes(64)), match)


def test_long_tensor_name(tmp_path):
    _rejects(tmp_path, gguf([], [info("x" * 64, (4,))], bytes(64)), "longer than 63 bytes")


# 8. Alignment.
@pytest.mark.parametrize("value", [0, 3, 48, 0x80000000, 1 << 21])
def test_bad_alignment_value(tmp_path, value):
    blob = gguf([kv("general.alignment", T.UINT32, u32(value))], [info("w", (4,))], bytes(64))
    _rejects(tmp_path, blob, f"bad alignment: general.alignment is {value}")


@pytest.mark.parametrize("vtype, payload", [(T.UINT64, u64(32)), (T.STRING, s("32")), (T.FLOAT32, u32(0))])
def test_alignment_of_the_wrong_type(tmp_path, vtype, payload):
    blob = gguf([kv("general.alignment", vtype, payload)], [info("w", (4,))], bytes(64))
    _rejects(tmp_path, blob, r"bad alignment: .* expected UINT32")


def test_alignment_larger_than_file(tmp_path):
    blob = gguf([kv("general.alignment", T.UINT32, u32(1 << 20))], [info("w", (4,))], bytes(64))
    _rejects(tmp_path, blob, r"truncated file: header says 1048592 bytes needed")


# 9-10. Tensor data placement.
def test_tensor_offset_beyond_file(tmp_path):
    blob = gguf([], [info("a", (4,)), info("b", (4,), offset=2**40)], bytes(64))
    _rejects(tmp_path, blob, r"out-of-bounds tensor 'b': data \[\d+, \d+\) lies outside the file of")


def test_tensor_offset_wrapping_int64(tmp_path):
    blob = gguf([], [info("a", (4,), offset=2**64 - 32)], bytes(64))
    _rejects(tmp_path, blob, "out-of-bounds tensor 'a'")


def test_overlapping_tensors(tmp_path):
    blob = gguf([], [info("a", (16,)), info("b", (4,), offset=32)], bytes(96))
    _rejects(tmp_path, blob, r"tensors 'a' \[\d+, \d+\) and 'b' \[\d+, \d+\) overlap")


def test_unaligned_offset(tmp_path):
    blob = gguf([], [info("a", (4,)), info("b", (4,), offset=40)], bytes(96))
    _rejects(tmp_path, blob, "data offset 40 is not a multiple of the alignment 32")


def test_total_tensor_bytes_beyond_file(tmp_path):
    infos = [info(f"t{i}", (8,), offset=32 * i) for i in range(4)]
    _rejects(tmp_path, gguf([], infos, bytes(64)), "truncated file: header says")


# 11. Architecture integers with the wrong type (their ranges belong to the engine's config).
@pytest.mark.parametrize("vtype, payload", [(T.STRING, s("12")), (T.FLOAT32, u32(0x41400000))])
def test_block_count_of_the_wrong_type(tmp_path, vtype, payload):
    blob = gguf([ARCH, kv("llama.block_count", vtype, payload)])
    _rejects(tmp_path, blob, "'llama.block_count' has type .*, expected an integer")


# Paths (not content) keep their OSError.
def test_missing_path_and_directory_raise_os_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        gguf_io.open(tmp_path / "nope.gguf")
    with pytest.raises(IsADirectoryError):
        gguf_io.open(tmp_path)


def test_message_names_the_file(tmp_path):
    assert str(tmp_path / "bad.gguf") in _rejects(tmp_path, b"", "empty")


def test_fifo_is_not_opened(tmp_path):
    import os

    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(InvalidGGUF, match="not a regular file"):
        gguf_io.open(fifo)


@pytest.mark.parametrize("key", ["tokenizer.ggml.scores", "tokenizer.ggml.token_type"])
def test_tokenizer_arrays_shorter_than_the_vocabulary(tmp_path, key):
    tokens = kv("tokenizer.ggml.tokens", T.ARRAY, u32(T.STRING) + u64(3) + s("a") + s("b") + s("c"))
    etype = T.FLOAT32 if key.endswith("scores") else T.INT32
    short = kv(key, T.ARRAY, u32(etype) + u64(2) + u32(0) * 2)
    _rejects(tmp_path, gguf([tokens, short]), f"'{key}' has 2 entries for 3 tokens")
