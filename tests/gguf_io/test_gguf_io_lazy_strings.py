"""gguf_io.open(path, lazy_strings=True): string arrays as StringArrays (offsets into the mapping), equal to the
eager lists item for item, checked as fully at open (the hostile cases run in both modes in
test_gguf_io_hardening and test_gguf_io_fuzz), and alive after close() while the caller holds them."""

from __future__ import annotations

import numpy as np
import pytest

import gguf_io
from gguf_io import GGUFValueType as VT
from gguf_io import InvalidGGUF, StringArray

ITEMS = ["", "a", "é", "日本語", "x\0y", "\u2581the", "", "🎉" * 40, "<0x0A>", "z"]


def _write(tmp_path, items, name="s.gguf"):
    path = tmp_path / name
    gguf_io.write(
        path,
        {"general.architecture": "llama", "k": items, "one": ["solo"], "none": [], "s": "plain"},
        [],
        metadata_types={"k": (VT.ARRAY, VT.STRING), "one": (VT.ARRAY, VT.STRING), "none": (VT.ARRAY, VT.STRING)},
    )
    return path


def test_lazy_items_equal_the_eager_list(tmp_path):
    path = _write(tmp_path, ITEMS)
    with gguf_io.open(path) as f, gguf_io.open(path, lazy_strings=True) as g:
        for key in ("k", "one", "none"):
            eager, lazy = f.metadata[key], g.metadata[key]
            assert isinstance(eager, list) and isinstance(lazy, StringArray)
            assert len(lazy) == len(eager) and list(lazy) == eager and lazy.tolist() == eager and lazy == eager
            assert [lazy[i] for i in range(-len(eager), len(eager))] == eager + eager
            assert lazy[2:7] == eager[2:7] and lazy[::-3] == eager[::-3]
            assert [lazy.raw(i) for i in range(len(eager))] == [s.encode() for s in eager]
            assert lazy.lengths().tolist() == [len(s.encode()) for s in eager]
            for sep in ("\0", "\n", ", "):
                assert lazy.join(sep) == sep.join(eager)
        assert g.metadata["s"] == "plain" and g.metadata_types == f.metadata_types
        with pytest.raises(IndexError):
            g.metadata["k"][len(ITEMS)]


def test_lazy_arrays_outlive_close_and_rewrite_byte_for_byte(tmp_path):
    path = _write(tmp_path, ITEMS)
    g = gguf_io.open(path, lazy_strings=True)
    md, types = g.metadata, g.metadata_types
    g.close()  # the arrays keep the mapping alive, as tensor views do
    assert list(md["k"]) == ITEMS
    copy = tmp_path / "copy.gguf"
    gguf_io.write(copy, md, [], metadata_types=types)
    assert copy.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("bad_at", [0, 4, 9])
@pytest.mark.parametrize("raw", [b"\xff", b"a\xc3", b"\xed\xa0\x80", b"\x80"])
def test_invalid_utf8_names_the_same_item_as_an_eager_read(tmp_path, bad_at, raw):
    items = [s.encode() for s in ITEMS]
    items[bad_at] = raw
    # written by hand: the writer refuses invalid UTF-8
    body = b"".join(len(b).to_bytes(8, "little") + b for b in items)
    kv = (
        len(b"k").to_bytes(8, "little")
        + b"k"
        + int(VT.ARRAY).to_bytes(4, "little")
        + int(VT.STRING).to_bytes(4, "little")
        + len(items).to_bytes(8, "little")
        + body
    )
    blob = b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little") + kv
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob + bytes(-len(blob) % 32))
    errors = []
    for lazy in (False, True):
        with pytest.raises(InvalidGGUF, match=rf"'k'\[{bad_at}\] is not valid UTF-8") as e:
            gguf_io.open(path, lazy_strings=lazy)
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_a_truncated_sequence_cannot_borrow_the_next_items_bytes(tmp_path):
    """b"a\\xc3" then b"\\xa9": joined without a separator they would spell "aé"; each alone is invalid."""
    items = [b"a\xc3", b"\xa9"]
    body = b"".join(len(b).to_bytes(8, "little") + b for b in items)
    kv = (
        b"\x01"
        + bytes(7)
        + b"k"
        + int(VT.ARRAY).to_bytes(4, "little")
        + int(VT.STRING).to_bytes(4, "little")
        + (2).to_bytes(8, "little")
        + body
    )
    blob = b"GGUF" + (3).to_bytes(4, "little") + bytes(8) + (1).to_bytes(8, "little") + kv
    path = tmp_path / "borrow.gguf"
    path.write_bytes(blob + bytes(-len(blob) % 32))
    with pytest.raises(InvalidGGUF, match=r"'k'\[0\] is not valid UTF-8"):
        gguf_io.open(path, lazy_strings=True)


def test_offsets_are_two_int64_per_item_not_python_objects(tmp_path):
    items = [f"tok{i}" for i in range(5000)]
    with gguf_io.open(_write(tmp_path, items), lazy_strings=True) as g:
        data, starts, ends = g.metadata["k"].spans()
        assert starts.dtype == ends.dtype == np.int64 and starts.shape == ends.shape == (5000,)
        assert not data.flags.writeable and data[starts[7] : ends[7]].tobytes() == b"tok7"
