"""Property test: mutated real and synthetic GGUF headers only ever raise InvalidGGUF, quickly, in bounded memory."""
from __future__ import annotations

import struct
import tracemalloc

import pytest
from gguf_fixtures import sample_metadata, sample_tensors, write_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguf_io
from gguf_io import InvalidGGUF

PEAK_BYTES = 64 << 20
_U32_EDGES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 30, 31, 64, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
_U64_EDGES = [0, 1, 63, 64, 65, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64 // 24, 2**64 // 32]


@pytest.fixture(scope="module")
def seeds(smollm2_path, tmp_path_factory):
    """Byte strings to mutate: the first 64 KiB of a real model, and a complete tiny synthetic model."""
    with open(smollm2_path, "rb") as f:
        real = f.read(64 << 10)
    values, types = sample_metadata()
    synthetic = write_gguf(tmp_path_factory.mktemp("seed") / "s.gguf", values, sample_tensors(),
                           metadata_types=types).read_bytes()
    return [real, synthetic]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "m.gguf"



_mutation = st.one_of(
    st.tuples(st.just("byte"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("u32"), st.floats(0, 1), st.one_of(st.sampled_from(_U32_EDGES), st.integers(0, 2**32 - 1))),
    st.tuples(st.just("u64"), st.floats(0, 1), st.one_of(st.sampled_from(_U64_EDGES), st.integers(0, 2**64 - 1))),
    st.tuples(st.just("cut"), st.floats(0, 1), st.just(0)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.integers(1, 64)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 64)),
)


def _mutate(blob: bytes, mutations: list, near_front: list[bool]) -> bytes:
    data = bytearray(blob)
    for (kind, where, value), front in zip(mutations, near_front):
        if not data:
            break
        span = min(len(data), 600) if front else len(data)
        pos = min(int(where * span), len(data) - 1)
        if kind == "byte":
            data[pos] = value
        elif kind in ("u32", "u64"):
            packed = struct.pack("<I" if kind == "u32" else "<Q", value)
            data[pos:pos + len(packed)] = packed
        elif kind == "cut":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = bytes([pos & 0xFF]) * value
        else:
            del data[pos:pos + value]
    return bytes(data)


def _exercise(f: gguf_io.GGUFFile) -> None:
    for t in f.tensors.values():
        assert t.data.nbytes == t.nbytes and t.data.ndim == 2
        assert t.offset + t.nbytes <= f.data_offset + 10**12
    assert isinstance(f.metadata, dict)


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 1), mutations=st.lists(_mutation, min_size=1, max_size=6),
       near_front=st.lists(st.booleans(), min_size=6, max_size=6))
def test_mutated_headers_raise_only_invalid_gguf(seeds, target, which, mutations, near_front):
    target.write_bytes(_mutate(seeds[which], mutations, near_front))
    tracemalloc.start()
    try:
        with gguf_io.open(target) as f:
            _exercise(f)
    except InvalidGGUF as e:
        assert "unexpected" not in str(e)  # the reader's safety net must never be what caught it
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < PEAK_BYTES
