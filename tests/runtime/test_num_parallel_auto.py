"""LOCALRT_NUM_PARALLEL unset (0): Ollama's automatic rule, 4 KV slots per model where they fit in the available
memory, else 1; an explicit value is honoured, or refused by the scheduler naming the memory it needs."""

from __future__ import annotations

import httpx
import pytest
from _daemon_fakes import real_daemon

from localrt.models.builtin_models import smollm2_path
from localrt.runtime.service import estimate_memory

MODEL = "smollm2:135m"
CTX, BATCH = 1024, 512


def _serve(tmp_path, num_parallel: int, available: int):
    """A real daemon whose scheduler sees `available` bytes of free memory."""
    return real_daemon(
        tmp_path / "models",
        {"scheduler_kw": {"available_fn": lambda: available}},
        num_parallel=num_parallel,
        context_length=CTX,
    )


def _slots_after_a_chat(url: str) -> dict:
    r = httpx.post(
        url + "/api/chat",
        json={
            "model": MODEL,
            "stream": False,
            "options": {"num_predict": 1},
            "messages": [{"role": "user", "content": "hi"}],
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    (entry,) = [m for m in httpx.get(url + "/api/ps").json()["models"] if m["name"] == MODEL]
    return entry


@pytest.mark.parametrize("fits, want", [(True, 4), (False, 1)])
def test_automatic_slots_follow_the_memory_available(tmp_path, fits, want):
    one, four = (estimate_memory(smollm2_path(), CTX, BATCH, n).private for n in (1, 4))
    with _serve(tmp_path, 0, four + (1 << 20) if fits else (one + four) // 2) as srv:
        entry = _slots_after_a_chat(srv.url)
    per_slot = one - estimate_memory(smollm2_path(), CTX, BATCH, 0).private  # the estimate's KV cache of one slot
    assert entry["slots"] == want and entry["kv_cache_bytes"] == want * per_slot


def test_an_explicit_value_that_does_not_fit_is_refused_naming_the_memory(tmp_path):
    four = estimate_memory(smollm2_path(), CTX, BATCH, 4).private
    with _serve(tmp_path, 4, four - (1 << 20)) as srv:
        r = httpx.post(
            srv.url + "/api/generate",
            json={"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 1}},
            timeout=120,
        )
    assert r.status_code == 500 and "requires more system memory" in r.json()["error"], r.text


def test_the_kv_budget_sets_the_pool_and_ps_shows_it(tmp_path):
    """LOCALRT_KV_BUDGET: 2 slots share a pool of 1536 positions (not 2 x 1024), as estimated and shown."""
    budget = 1536
    with real_daemon(
        tmp_path / "models",
        {"scheduler_kw": {"available_fn": lambda: 1 << 40}},
        num_parallel=2,
        context_length=CTX,
        kv_budget=budget,
    ) as srv:
        entry = _slots_after_a_chat(srv.url)
    kv = (
        estimate_memory(smollm2_path(), CTX, BATCH, 2, budget).private
        - estimate_memory(smollm2_path(), CTX, BATCH, 0).private
    )
    assert entry["slots"] == 2 and entry["kv_blocks"] * entry["kv_block_size"] == budget
    assert entry["kv_cache_bytes"] == kv and entry["kv_blocks_in_use"] == 0 < entry["kv_blocks_cached"]
