"""use_mmap (localrt.engine.backends.resident): which loads copy their weights into private memory, that the copy
holds the file's bytes read-only, that a model computes the same logits either way, and that the scheduler's
estimate counts copied weights as private memory."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from fixtures.decoders import write_tiny
from localrt.engine.backends.resident import ALIGN, MIN_PRIVATE, PrivateWeights, private_size, private_weights
from localrt.engine.loader import load_model
from localrt.runtime.loading import estimate_memory

GIB = 1 << 30


def test_the_rule():
    assert private_weights(False, 1) and not private_weights(True, GIB, ram=64 * GIB)
    assert not private_weights(None, MIN_PRIVATE - 1, ram=64 * GIB, gpu=False)  # small: its load is not worth a copy
    assert private_weights(None, MIN_PRIVATE, ram=64 * GIB, gpu=False)
    assert private_weights(None, 16 * GIB, ram=64 * GIB, gpu=False)
    assert not private_weights(None, 16 * GIB + 1, ram=64 * GIB, gpu=False)  # over a quarter of RAM: stays in the mmap
    assert not private_weights(None, GIB, ram=64 * GIB, gpu=True)  # GPU layers need no host copy
    assert private_weights(False, GIB, gpu=True)  # asked for


def test_a_copy_holds_the_bytes_read_only_on_its_own_pages(tmp_path: Path):
    raw = np.random.default_rng(0).integers(0, 256, 3 * mmap.PAGESIZE + 100, dtype=np.uint8)
    (tmp_path / "f").write_bytes(raw.tobytes())
    with open(tmp_path / "f", "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    source = np.frombuffer(mm, np.uint8)
    parts = [source[:77].reshape(7, 11), source[77:].view(np.uint8)]
    private = PrivateWeights(private_size(parts))
    copies = private.copy_all(parts, [True, True])
    for a, c in zip(parts, copies):
        assert c.shape == a.shape and np.array_equal(c, a) and not c.flags.writeable
        assert c.ctypes.data % ALIGN == 0 and not np.shares_memory(a, c)
    assert np.array_equal(source, raw)  # the dropped pages read back from the file
    with pytest.raises(ValueError, match="do not fit"):
        private.copy_all(parts[1:], [False])
    thread = private.to_huge_pages()  # advised, then collapsed in the background (None without madvise)
    if thread is not None:
        thread.join(60)
        assert not thread.is_alive()
    assert all(np.array_equal(c, a) for a, c in zip(parts, copies))


def _logits(model):
    model.cache.clear(0)
    model.cache.forget_prefixes()
    return model.forward(model.batch([1, 2, 3, 4], 0), model.cache, output_rows=np.array([3]))[0]


def test_a_model_computes_the_same_from_either(tmp_path: Path):
    path = write_tiny(tmp_path / "tiny.gguf")
    mapped, private = (load_model(path, num_ctx=32, tokenizer=False, use_mmap=flag) for flag in (True, False))
    try:
        base = np.frombuffer(mapped._source._maps[0], np.uint8)
        assert np.shares_memory(mapped.weights.output.data, base)
        assert not np.shares_memory(private.weights.output.data, base)
        assert not private.weights.output.data.flags.writeable
        assert private.huge_pages is None and private.after_first_forward is not None  # the first forward starts it
        assert np.array_equal(_logits(mapped), _logits(private))
        assert private.after_first_forward is None
        private.finish_loading()
        assert private.huge_pages is None or not private.huge_pages.is_alive()
        assert np.array_equal(_logits(mapped), _logits(private))
    finally:
        mapped.close()
        private.close()


def test_the_estimate_counts_copied_weights_as_private(tmp_path: Path):
    path = write_tiny(tmp_path / "tiny.gguf")
    mapped = estimate_memory(path, 32, 32, use_mmap=True)
    private = estimate_memory(path, 32, 32, use_mmap=False)
    assert mapped.mapped > 0 and private.mapped == 0
    assert private.private == mapped.private + mapped.mapped
