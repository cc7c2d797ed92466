"""num_thread (Ollama's option): simd_kernels.threads.capped limits a thread's kernel calls and team runs, and a model
loaded with it computes the same logits as one without."""

from __future__ import annotations

import threading
from pathlib import Path

import numba
import numpy as np
import pytest

from fixtures.decoders import write_tiny
from localrt.engine.loader import load_model
from localrt.errors import ModelLoadError
from simd_kernels import threads


def test_a_capped_team_runs_every_part_on_fewer_threads():
    team = threads.Team(3)
    for cap, most in ((0, 3), (1, 1), (2, 2)):
        ran: dict[int, int] = {}
        with threads.capped(cap):
            team.run(lambda i: ran.__setitem__(i, threading.get_ident()))
        assert sorted(ran) == [0, 1, 2] and len(set(ran.values())) <= most
        if cap == 1:
            assert set(ran.values()) == {threading.get_ident()}


def test_a_capped_call_uses_at_most_the_cap():
    with threads.capped(1):
        threads.use_threads_for(1 << 40)
        assert numba.get_num_threads() == 1 and threads.cap() == 1
    threads.use_threads_for(1 << 40)
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS


def test_a_model_computes_the_same_with_one_thread(tmp_path: Path):
    path = write_tiny(tmp_path / "tiny.gguf")
    ids = list(np.random.default_rng(0).integers(0, 16, 64))  # a 64-token piece: the prompt path and its team
    out = []
    for num_thread in (0, 1):
        model = load_model(path, num_ctx=64, tokenizer=False, num_thread=num_thread)
        try:
            out.append(model.forward(model.batch(ids, 0), model.cache))
        finally:
            model.close()
    assert np.array_equal(out[0], out[1])
    with pytest.raises(ModelLoadError, match="num_thread"):
        load_model(path, num_ctx=64, tokenizer=False, num_thread=-1)
