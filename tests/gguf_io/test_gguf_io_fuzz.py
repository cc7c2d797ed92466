"""Property test: mutated real and synthetic GGUF headers only ever raise InvalidGGUF, quickly, in bounded memory."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from fixtures.raw import sample_metadata, sample_tensors, write_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguf_io
from gguf_io import GGUFValueType as VT
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
    synthetic = write_gguf(
        tmp_path_factory.mktemp("seed") / "s.gguf", values, sample_tensors(), metadata_types=types
    ).read_bytes()
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


def _mutate(blob: bytes, mutations: list, near_front: list[bool], hot: tuple[int, int] | None = None) -> bytes:
    """Applies `mutations`; each lands in the first 600 bytes or, if not `near_front`, in `hot` (default: anywhere)."""
    data = bytearray(blob)
    for (kind, where, value), front in zip(mutations, near_front):
        if not data:
            break
        lo, hi = (0, min(len(data), 600)) if front else (hot or (0, len(data)))
        pos = min(lo + int(where * (hi - lo)), len(data) - 1)
        if kind == "byte":
            data[pos] = value
        elif kind in ("u32", "u64"):
            packed = struct.pack("<I" if kind == "u32" else "<Q", value)
            data[pos : pos + len(packed)] = packed
        elif kind == "cut":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = bytes([pos & 0xFF]) * value
        else:
            del data[pos : pos + value]
    return bytes(data)


def _exercise(f: gguf_io.GGUFFile) -> None:
    for t in f.tensors.values():
        assert t.data.nbytes == t.nbytes and t.data.ndim == 2
        assert t.offset + t.nbytes <= f.data_offset + 10**12
    assert isinstance(f.metadata, dict)


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    which=st.integers(0, 1),
    mutations=st.lists(_mutation, min_size=1, max_size=6),
    near_front=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_mutated_headers_raise_only_invalid_gguf(seeds, target, which, mutations, near_front):
    target.write_bytes(_mutate(seeds[which], mutations, near_front))
    _open_bounded(target)


def _open_bounded(path, trace_memory: bool = True) -> None:
    """Opens path eagerly and with lazy string arrays: both refuse it with the same error, or read the same strings."""
    outcomes = []
    for lazy in (False, True):
        if trace_memory:
            tracemalloc.start()
        try:
            with gguf_io.open(path, lazy_strings=lazy) as f:
                _exercise(f)
                outcomes.append(
                    {k: list(v) for k, v in f.metadata.items() if f.metadata_types[k] == (VT.ARRAY, VT.STRING)}
                )
        except InvalidGGUF as e:
            assert "malformed GGUF (unexpected" not in str(e)  # the reader's safety net must never be what caught it
            outcomes.append(str(e))
        finally:
            peak = tracemalloc.get_traced_memory()[1] if trace_memory else 0
            tracemalloc.stop()
        assert peak < PEAK_BYTES
    assert outcomes[0] == outcomes[1]


@pytest.fixture(scope="module")
def real_header(smollm2_path):
    """smollm2's whole header (metadata + 272 tensor infos), the tensor-info span, and the file size."""
    with gguf_io.open(smollm2_path) as f:
        first = next(iter(f.tensors)).encode()
        data_offset = f.data_offset
    with open(smollm2_path, "rb") as raw:
        header = raw.read(data_offset)
        size = raw.seek(0, 2)
    return header, (header.find(struct.pack("<Q", len(first)) + first), data_offset), size


# The 49k-token header costs ~50 ms a parse (x4 under tracemalloc), so fewer examples and no tracing here;
# memory is bounded by the same caps the synthetic test above measures.
@settings(max_examples=40, deadline=3000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mutations=st.lists(_mutation, min_size=1, max_size=4), near_front=st.lists(st.booleans(), min_size=4, max_size=4)
)
def test_mutated_real_tensor_infos_raise_only_invalid_gguf(real_header, target, mutations, near_front):
    header, infos_span, size = real_header
    mutated = _mutate(header, mutations, near_front, infos_span)
    with open(target, "wb") as f:
        f.write(mutated)
        f.truncate(max(size, len(mutated)))  # sparse: tensor data need not be written to be in bounds
    _open_bounded(target, trace_memory=False)
