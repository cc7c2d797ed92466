"""Split GGUF sets: the first part opens every part as one model; broken sets are one clear InvalidGGUF."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.raw import sample_tensors

import gguf_io
from gguf_io import GGUFValueType, InvalidGGUF
from gguf_io.reader import open_file
from gguf_io.split import part_path, write_split

META = {"general.architecture": "llama", "general.name": "tiny"}


@pytest.fixture
def split3(tmp_path):
    return write_split(tmp_path / "tiny", META, sample_tensors(), 3)


def test_first_part_opens_all_parts_as_one_model(split3):
    tensors = sample_tensors()
    with gguf_io.open(split3[0]) as f:
        assert f.parts == tuple(split3) and [p.name for p in f.parts][2] == "tiny-00003-of-00003.gguf"
        assert list(f.tensors) == [name for name, *_ in tensors]
        for name, ggml_type, shape, data in tensors:
            t = f.tensors[name]
            assert (t.ggml_type, t.shape) == (ggml_type, shape) and t.data.tobytes() == data.tobytes()
        assert f.metadata["general.name"] == "tiny" and f.metadata["split.count"] == 3
        assert f.metadata_types["split.no"] == GGUFValueType.UINT16
        for path in split3[1:]:
            with open_file(path) as part:
                assert part.metadata == {"split.no": split3.index(path), "split.count": 3, "split.tensors.count": 6}
                # Each tensor's offset is into its own part's file.
                assert all(t.offset == f.tensors[name].offset for name, t in part.tensors.items())


def test_views_point_into_each_parts_own_map(split3):
    with gguf_io.open(split3[0]) as f:
        bases = {id(_base(t.data)) for t in f.tensors.values()}
        assert len(bases) == 3


def _base(a: np.ndarray) -> object:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base


def test_gguf_package_reads_each_part(split3):
    gguf = pytest.importorskip("gguf")
    names = [t.name for path in split3 for t in gguf.GGUFReader(path).tensors]
    assert names == [name for name, *_ in sample_tensors()]


def test_missing_part(split3):
    split3[1].unlink()
    with pytest.raises(InvalidGGUF, match="split GGUF is missing 1 of its 3 parts: tiny-00002-of-00003.gguf"):
        gguf_io.open(split3[0])


def test_opening_a_later_part_names_the_first(split3):
    with pytest.raises(InvalidGGUF, match=r"part 2 of a 3-part split GGUF; open the first part \(tiny-00001-of-00003"):
        gguf_io.open(split3[1])


def test_part_from_another_split_set(tmp_path, split3):
    other = write_split(tmp_path / "other", META, sample_tensors()[:4], 3)
    other[1].replace(split3[1])
    with pytest.raises(InvalidGGUF, match="split.tensors.count is 4, expected 6 for part 2 of 3"):
        gguf_io.open(split3[0])


def test_part_with_wrong_split_count(tmp_path, split3):
    other = write_split(tmp_path / "other", META, sample_tensors(), 2)
    other[1].replace(split3[2])
    with pytest.raises(InvalidGGUF, match=r"tiny-00003-of-00003.gguf: split.no is 1, expected 2"):
        gguf_io.open(split3[0])


def test_duplicate_split_no(split3):
    split3[2].write_bytes(split3[1].read_bytes())
    with pytest.raises(InvalidGGUF, match="split.no is 1, expected 2"):
        gguf_io.open(split3[0])


def test_first_part_with_a_foreign_name(tmp_path, split3):
    renamed = split3[0].replace(tmp_path / "model.gguf")
    with pytest.raises(InvalidGGUF, match="split.count is 3 but the name is not '<prefix>-00001-of-00003.gguf'"):
        gguf_io.open(renamed)


def test_tensor_count_mismatch_and_duplicate_tensor(tmp_path):
    tensors = sample_tensors()
    paths = write_split(tmp_path / "dup", META, tensors[:2] + tensors[:2], 2)
    with pytest.raises(InvalidGGUF, match="tensor 'token_embd.weight' is also in an earlier part"):
        gguf_io.open(paths[0])


def test_split_keys_of_the_wrong_type(tmp_path):
    path = part_path(tmp_path / "bad", 1, 1)
    gguf_io.write(path, {"split.no": 0, "split.count": "1", "split.tensors.count": 0}, [])
    with pytest.raises(InvalidGGUF, match="'split.count' .* has type STRING, expected an integer"):
        gguf_io.open(path)


def test_single_part_set_opens(tmp_path):
    paths = write_split(tmp_path / "one", META, sample_tensors(), 1)
    with gguf_io.open(paths[0]) as f:
        assert len(f.tensors) == 6 and f.parts == (paths[0],)


def test_close_releases_every_part(split3):
    f = gguf_io.open(split3[0])
    maps = list(f._maps)
    f.close()
    assert len(maps) == 3 and all(mm.closed for mm in maps) and f.tensors == {}
