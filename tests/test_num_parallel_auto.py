"""LOCALRT_NUM_PARALLEL unset (0): Ollama's automatic rule, 4 KV slots per model where they fit in the available
memory, else 1; an explicit value is honoured, or refused by the scheduler naming the memory it needs."""
from __future__ import annotations

import dataclasses

import httpx
import pytest

from localrt import config as cfg
from localrt.models.builtin_models import smollm2_path
from localrt.runtime.service import Service, estimate_memory
from localrt.serve.daemon import BackgroundServer, free_port

MODEL = "smollm2:135m"
CTX, BATCH = 1024, 512


def _serve(tmp_path, num_parallel: int, available: int):
    conf = dataclasses.replace(cfg.load({}), port=free_port(), models_dir=tmp_path / "models", readonly_models_dirs=(),
                               num_parallel=num_parallel, context_length=CTX)
    return Service(conf, scheduler_kw={"available_fn": lambda: available})


def _slots_after_a_chat(service: Service, conf_url: str) -> dict:
    r = httpx.post(conf_url + "/api/chat", json={"model": MODEL, "stream": False, "options": {"num_predict": 1},
                                                 "messages": [{"role": "user", "content": "hi"}]}, timeout=120)
    assert r.status_code == 200, r.text
    (entry,) = [m for m in httpx.get(conf_url + "/api/ps").json()["models"] if m["name"] == MODEL]
    return entry


@pytest.mark.parametrize("fits, want", [(True, 4), (False, 1)])
def test_automatic_slots_follow_the_memory_available(tmp_path, fits, want):
    one, four = (estimate_memory(smollm2_path(), CTX, BATCH, n).private for n in (1, 4))
    service = _serve(tmp_path, 0, four + (1 << 20) if fits else (one + four) // 2)
    try:
        with BackgroundServer(service, service.config) as srv:
            entry = _slots_after_a_chat(service, srv.url)
        per_slot = one - estimate_memory(smollm2_path(), CTX, BATCH, 0).private  # the estimate's KV cache of one slot
        assert entry["slots"] == want and entry["kv_cache_bytes"] == want * per_slot
    finally:
        service.close()


def test_an_explicit_value_that_does_not_fit_is_refused_naming_the_memory(tmp_path):
    four = estimate_memory(smollm2_path(), CTX, BATCH, 4).private
    service = _serve(tmp_path, 4, four - (1 << 20))
    try:
        with BackgroundServer(service, service.config) as srv:
            r = httpx.post(srv.url + "/api/generate", json={"model": MODEL, "prompt": "hi", "stream": False,
                                                            "options": {"num_predict": 1}}, timeout=120)
        assert r.status_code == 500 and "requires more system memory" in r.json()["error"], r.text
    finally:
        service.close()
