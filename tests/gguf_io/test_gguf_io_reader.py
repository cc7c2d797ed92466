"""gguf_io reader against the `gguf` package's GGUFReader on the real models."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gguf_io
from gguf_io import GGMLType, GGUFValueType


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with gguf_io.open(smollm2_path) as f:
        yield f


@pytest.fixture(scope="module")
def oracle(smollm2_path):
    gguf = pytest.importorskip("gguf")
    return gguf.GGUFReader(smollm2_path)


def _oracle_types(field) -> object:
    types = [GGUFValueType(int(t)) for t in field.types]
    return types[0] if len(types) == 1 else tuple(types)


def test_metadata_matches_gguf_reader(smollm2, oracle):
    fields = {k: v for k, v in oracle.fields.items() if not k.startswith("GGUF.")}
    assert list(smollm2.metadata) == list(fields)
    for key, field in fields.items():
        ours = smollm2.metadata[key]
        assert smollm2.metadata_types[key] == _oracle_types(field), key
        theirs = field.contents()
        if isinstance(ours, np.ndarray):
            assert ours.ndim == 1 and ours.dtype == gguf_io.constants.SCALAR_DTYPES[field.types[1]]
            assert ours.tolist() == theirs, key
        else:
            assert type(ours) is type(theirs) and ours == theirs, key


def test_tensors_match_gguf_reader(smollm2, oracle):
    assert list(smollm2.tensors) == [t.name for t in oracle.tensors]
    for t in oracle.tensors:
        ours = smollm2.tensors[t.name]
        assert ours.ggml_type == int(t.tensor_type)
        assert ours.shape == tuple(int(d) for d in reversed(t.shape))
        assert ours.offset == t.data_offset and ours.nbytes == t.n_bytes
        assert ours.data.dtype == np.uint8 and ours.data.shape[0] == int(np.prod(ours.shape[:-1]))
        assert np.array_equal(ours.data.reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))


def test_tensor_views_are_read_only_and_share_one_map(smollm2):
    views = [t.data for t in smollm2.tensors.values()]
    assert not any(v.flags.writeable for v in views)
    base = views[0]
    while base.base is not None and isinstance(base.base, np.ndarray):
        base = base.base
    assert all(np.shares_memory(v, base) for v in views[:5])


def test_smollm2_layout(smollm2):
    emb = smollm2.tensors["token_embd.weight"]
    assert emb.ggml_type == GGMLType.Q8_0
    assert emb.shape == (49152, 576)
    assert smollm2.version == 3 and smollm2.alignment == 32
    assert smollm2.metadata["general.architecture"] == "llama"
    assert len(smollm2.metadata["tokenizer.ggml.tokens"]) == 49152


def test_gemma3_opens_fast_with_full_tokenizer(gemma3_path):
    start = time.perf_counter()
    with gguf_io.open(gemma3_path) as f:
        tokens = f.metadata["tokenizer.ggml.tokens"]
        scores = f.metadata["tokenizer.ggml.scores"]
        elapsed = time.perf_counter() - start
        assert len(tokens) == len(scores) == 262144 and scores.dtype == np.float32
        assert f.data_offset == 6_525_120 and len(f.tensors) == 236 and len(f.metadata) == 33
        emb = f.tensors["token_embd.weight"]
        assert emb.ggml_type == GGMLType.Q8_0 and emb.shape == (262144, 640) and emb.data.shape == (262144, 680)
        down = f.tensors["blk.0.ffn_down.weight"]
        assert down.ggml_type == GGMLType.Q6_K and down.data.shape == (640, 1680)
    # Generous against CI noise; measured about 0.12 s on the 2-core dev machine.
    assert elapsed < 2.0


def test_gemma3_sample_matches_gguf_reader_bytes(gemma3_path):
    """Gemma tensor views hold the bytes a plain file read finds there (GGUFReader takes ~30 s here)."""
    with gguf_io.open(gemma3_path) as f, open(gemma3_path, "rb") as raw:
        for name in ("token_embd.weight", "blk.17.attn_q.weight", "output_norm.weight"):
            t = f.tensors[name]
            raw.seek(t.offset)
            assert raw.read(64) == t.data.reshape(-1)[:64].tobytes()
            raw.seek(t.offset + t.nbytes - 64)
            assert raw.read(64) == t.data.reshape(-1)[-64:].tobytes()


def test_open_copies_nothing_proportional_to_the_weights(gemma3_path):
    import tracemalloc

    tracemalloc.start()
    try:
        with gguf_io.open(gemma3_path) as f:
            weights = sum(t.nbytes for t in f.tensors.values())
            peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # ~240 MB of weights; the peak is the tokenizer strings (~45 MB measured), never the weights.
    assert weights > 200 << 20 and peak < 96 << 20
