"""gguf_io writer: files read back identically by our reader and by the gguf package's GGUFReader."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from fixtures.raw import sample_metadata, sample_tensors, write_gguf

import gguf_io
from gguf_io import GGMLType, GGUFValueType


def _same_value(ours, expected) -> bool:
    if isinstance(expected, np.ndarray):
        return isinstance(ours, np.ndarray) and ours.dtype == expected.dtype and np.array_equal(ours, expected)
    return type(ours) is type(expected) and ours == expected


@pytest.fixture
def sample_file(tmp_path):
    values, types = sample_metadata()
    return write_gguf(tmp_path / "s.gguf", values, sample_tensors(), metadata_types=types), values, types


def test_our_reader_reads_back_values_types_and_tensors(sample_file):
    path, values, types = sample_file
    with gguf_io.open(path) as f:
        assert f.version == 3 and list(f.metadata) == list(values)
        for key, value in values.items():
            assert _same_value(f.metadata[key], value), key
        assert f.metadata_types == types
        for name, ggml_type, shape, data in sample_tensors():
            t = f.tensors[name]
            assert (t.ggml_type, t.shape) == (ggml_type, shape)
            assert t.data.tobytes() == data.tobytes() and t.offset % 32 == 0


def test_gguf_package_reads_back_values_types_and_tensors(sample_file):
    gguf = pytest.importorskip("gguf")
    path, values, types = sample_file
    reader = gguf.GGUFReader(path)
    for key, value in values.items():
        field = reader.fields[key]
        spec = tuple(GGUFValueType(int(x)) for x in field.types)
        want = types[key] if isinstance(types[key], tuple) else (types[key],)
        # GGUFReader drops the element type of an empty array.
        assert spec == (want[:1] if key == "arr.empty" else want), key
        expected = value.tolist() if isinstance(value, np.ndarray) else value
        assert field.contents() == expected, key
    by_name = {t.name: t for t in reader.tensors}
    for name, ggml_type, shape, data in sample_tensors():
        t = by_name[name]
        assert int(t.tensor_type) == ggml_type and tuple(int(d) for d in t.shape[::-1]) == shape
        assert np.asarray(t.data).view(np.uint8).tobytes() == data.tobytes()


def test_inferred_types_follow_the_contract(tmp_path):
    meta = {
        "u": 7,
        "big": 2**40,
        "neg": -1,
        "f": 1.5,
        "b": False,
        "s": "x",
        "ss": ["a", "b"],
        "arr": np.arange(3, dtype=np.int16),
        "ints": [1, -2],
        "floats": [1.0, 2],
        "nested": [[1], ["a"]],
    }
    with gguf_io.open(write_gguf(tmp_path / "i.gguf", meta)) as f:
        t = GGUFValueType
        assert f.metadata_types == {
            "u": t.UINT32,
            "big": t.INT64,
            "neg": t.INT64,
            "f": t.FLOAT32,
            "b": t.BOOL,
            "s": t.STRING,
            "ss": (t.ARRAY, t.STRING),
            "arr": (t.ARRAY, t.INT16),
            "ints": (t.ARRAY, t.INT32),
            "floats": (t.ARRAY, t.FLOAT32),
            "nested": (t.ARRAY, t.ARRAY, ((t.ARRAY, t.INT32), (t.ARRAY, t.STRING))),
        }
        assert f.metadata["nested"][1] == ["a"] and f.metadata["nested"][0].tolist() == [1]


def test_float_arrays_are_written_for_f32_and_f16(tmp_path):
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    path = write_gguf(
        tmp_path / "f.gguf", {}, [("a", GGMLType.F32, (3, 4), w), ("b", GGMLType.F16, (3, 4), w.astype(np.float16))]
    )
    with gguf_io.open(path) as f:
        assert np.array_equal(f.tensors["a"].data.view(np.float32), w)
        assert np.array_equal(f.tensors["b"].data.view(np.float16), w.astype(np.float16))


def test_non_default_alignment_is_recorded_and_honoured(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = write_gguf(tmp_path / "a.gguf", {"x": 1}, sample_tensors(), alignment=64)
    with gguf_io.open(path) as f:
        assert f.alignment == 64 and f.metadata["general.alignment"] == 64
        assert all(t.offset % 64 == 0 for t in f.tensors.values())
        offsets = {n: t.offset for n, t in f.tensors.items()}
    assert {t.name: t.data_offset for t in gguf.GGUFReader(path).tensors} == offsets


def test_real_model_round_trip_is_byte_identical(smollm2_path, tmp_path):
    out = tmp_path / "copy.gguf"
    with gguf_io.open(smollm2_path) as f:
        tensors = [(t.name, t.ggml_type, t.shape, t.data) for t in f.tensors.values()]
        gguf_io.write(out, f.metadata, tensors, metadata_types=f.metadata_types, alignment=f.alignment)
    with gguf_io.open(smollm2_path) as a, gguf_io.open(out) as b:
        assert list(a.metadata) == list(b.metadata) and a.metadata_types == b.metadata_types
        for key, value in a.metadata.items():
            assert _same_value(b.metadata[key], value), key
        for name, t in a.tensors.items():
            u = b.tensors[name]
            assert (u.ggml_type, u.shape, u.offset) == (t.ggml_type, t.shape, t.offset)
            assert np.array_equal(u.data, t.data)
    assert _sha256(out) == _sha256(smollm2_path)


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def test_streaming_writer_writes_one_tensor_at_a_time(tmp_path):
    tensors = sample_tensors()
    with gguf_io.GGUFWriter(tmp_path / "s.gguf", {"general.architecture": "llama"}) as w:
        for name, ggml_type, shape, _ in tensors:
            w.add_tensor_info(name, ggml_type, shape)
        w.write_header()
        assert not (tmp_path / "s.gguf").exists()  # only the .partial file exists until close
        for name, _, _, data in tensors:
            w.write_tensor(data, name)
    with gguf_io.open(tmp_path / "s.gguf") as f:
        assert [t.data.tobytes() for t in f.tensors.values()] == [d.tobytes() for *_, d in tensors]


def test_streaming_writer_leaves_nothing_behind_on_error(tmp_path):
    w = gguf_io.GGUFWriter(tmp_path / "s.gguf", {})
    w.add_tensor_info("a", GGMLType.F32, (4,))
    w.add_tensor_info("b", GGMLType.F32, (4,))
    w.write_tensor(np.zeros(4, np.float32), "a")
    with pytest.raises(ValueError, match="never written"):
        w.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError):
        with gguf_io.GGUFWriter(tmp_path / "t.gguf", {}) as w2:
            w2.add_tensor_info("a", GGMLType.F32, (4,))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "tensors, match",
    [
        ([("a", GGMLType.Q8_0, (2, 33), np.zeros(70, np.uint8))], "multiple of the Q8_0 block size 32"),
        ([("a", GGMLType.F32, (0, 4), np.zeros(0, np.float32))], "each >= 1"),
        ([("a", GGMLType.F32, (1, 1, 1, 1, 4), np.zeros(4, np.float32))], "1..4 dims"),
        ([("a", 4, (4,), np.zeros(4, np.uint8))], "unknown ggml type 4"),
        ([("a", GGMLType.F32, (4,), np.zeros(4, np.float32))] * 2, "duplicate tensor name"),
        ([("x" * 64, GGMLType.F32, (4,), np.zeros(4, np.float32))], "longer than 63 bytes"),
        ([("a", GGMLType.Q8_0, (1, 32), np.zeros(33, np.uint8))], "33 bytes of data"),
        ([("a", GGMLType.Q8_0, (1, 32), np.zeros(32, np.float32))], "pass raw uint8 blocks"),
        ([("a", GGMLType.F32, (4,), np.zeros(5, np.float32))], "5 elements"),
    ],
)
def test_writer_rejects_bad_tensors(tmp_path, tensors, match):
    with pytest.raises(ValueError, match=match):
        gguf_io.write(tmp_path / "bad.gguf", {}, tensors)
    assert not (tmp_path / "bad.gguf").exists()


@pytest.mark.parametrize(
    "meta, types, match",
    [
        ({"a": 256}, {"a": GGUFValueType.UINT8}, "do not fit UINT8"),
        ({"a": -1}, {"a": GGUFValueType.UINT64}, "do not fit UINT64"),
        ({"a": 2**64}, None, "cannot write"),
        ({"a": 1e39}, None, "overflow FLOAT32"),
        ({"a": 2}, {"a": GGUFValueType.BOOL}, "BOOL values"),
        ({"a": []}, None, "empty list"),
        ({"a": [1, "x"]}, None, "mixes element types"),
        ({"a": {"b": 1}}, None, "cannot write a value of type dict"),
        ({"a": 3}, {"a": GGUFValueType.STRING}, "expected str"),
        ({"general.alignment": 48}, None, "not a power of two"),
    ],
)
def test_writer_rejects_bad_metadata(tmp_path, meta, types, match):
    with pytest.raises(ValueError, match=match):
        gguf_io.write(tmp_path / "bad.gguf", meta, [], metadata_types=types)
