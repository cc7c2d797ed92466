"""The automatic context (issue 47): the trained length, capped by the memory tier, halved while the load's private
memory would take more than half of what is available; LOCALRT_CONTEXT_LENGTH, a model's PARAMETER and the request
each override it."""

from __future__ import annotations

import dataclasses

import pytest

from localrt import config as cfg
from localrt.runtime.loading import auto_num_ctx, context_ceiling
from localrt.runtime.service import Service

GIB = 1 << 30


@pytest.mark.parametrize(
    "total, ceiling",
    [(8 * GIB, 8192), (16 * GIB, 8192), (23 * GIB, 32768), (32 * GIB, 32768), (47 * GIB, 262144), (512 * GIB, 262144)],
)
def test_the_memory_tiers(total, ceiling):
    assert context_ceiling(total) == ceiling


def test_the_trained_length_when_it_fits():
    assert auto_num_ctx(8192, 16 * GIB, 8 * GIB, lambda n: n * 100_000) == 8192
    assert auto_num_ctx(2048, 16 * GIB, 8 * GIB, lambda n: n * 100_000) == 2048  # never above the trained length
    assert auto_num_ctx(131072, 64 * GIB, 60 * GIB, lambda n: n * 1000) == 131072
    assert auto_num_ctx(131072, 16 * GIB, 8 * GIB, lambda n: n * 1000) == 8192  # the tier's cap


def test_halved_while_the_load_would_take_more_than_half_the_available_memory():
    per_position = 1 << 20  # 1 MiB a position: 8192 positions need 8 GiB
    assert auto_num_ctx(32768, 24 * GIB, 12 * GIB, lambda n: n * per_position) == 4096
    assert auto_num_ctx(32768, 24 * GIB, 40 * GIB, lambda n: n * per_position) == 16384
    assert auto_num_ctx(40960, 24 * GIB, 1 * GIB, lambda n: n * per_position) == 4096  # the floor, fitting or not
    assert auto_num_ctx(40960, 64 * GIB, 22 * GIB, lambda n: n * per_position) == 10240  # 40960 -> 20480 -> 10240


def test_config_reads_zero_as_automatic_and_refuses_a_negative_length():
    assert cfg.load({}).context_length == 0
    assert cfg.load({"LOCALRT_CONTEXT_LENGTH": "16384"}).context_length == 16384
    with pytest.raises(ValueError, match="LOCALRT_CONTEXT_LENGTH"):
        cfg.load({"LOCALRT_CONTEXT_LENGTH": "-1"})


@pytest.fixture
def service(tmp_path):
    def make(**overrides):
        conf = dataclasses.replace(cfg.load({}), models_dir=tmp_path / "models", readonly_models_dirs=(), **overrides)
        s = Service(conf, scheduler_kw={"available_fn": lambda: 16 * GIB}, total_memory_fn=lambda: 16 * GIB)
        made.append(s)
        return s

    made: list[Service] = []
    yield make
    for s in made:
        s.close()


def test_who_sets_num_ctx_wins_over_the_automatic_choice(service):
    auto = service()
    rec = auto.record("smollm2:135m")
    assert auto.options(rec, {}).num_ctx == 8192  # SmolLM2's trained length
    assert auto.options(rec, {"num_ctx": 2048}).num_ctx == 2048
    assert auto.options(dataclasses.replace(rec, params={"num_ctx": 1024}), {}).num_ctx == 1024
    assert service(context_length=4096).options(rec, {}).num_ctx == 4096
