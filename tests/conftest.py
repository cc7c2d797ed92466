"""Shared fixtures. The real models come from installed PyPI packages, never from a machine path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs the property tests with a fixed seed, so a submission's result does not depend on the draw;
# locally they keep exploring new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# A developer's own Ollama settings (OLLAMA_HOST, OLLAMA_MODELS, ...) are read where no LOCALRT_ twin is set:
# they must not reach the daemons and commands the tests start.
for _name in [k for k in os.environ if k.startswith("OLLAMA_")]:
    del os.environ[_name]

from localrt.models import builtin_models

REFERENCE_DIR = Path(__file__).parent / "data"


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per core, at most 4. Each worker loads its own models and compiles (or loads from
    Numba's on-disk cache) its own kernels, whose threads share the cores; more workers buy little past that (one
    more than the cores, measured cold on two: 13m19 against 10m52, the compiles contending)."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return builtin_models.smollm2_path()


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return builtin_models.gemma3_path()


@pytest.fixture(scope="session")
def llamacpp_reference() -> dict:
    """llama.cpp's own token ids, greedy continuations and top logits for the two real models."""
    return json.loads((REFERENCE_DIR / "llamacpp_reference.json").read_text())


@pytest.fixture(scope="session")
def shared_daemon(tmp_path_factory):
    """One real daemon per test process (each xdist worker has its own) for the modules that only read: they ask the
    built-in smollm2 for completions, chats and embeddings with the default configuration, and never create, copy,
    delete or pull a model, change a setting, or check what is cached or loaded. What another module asked before
    cannot change their answers (a request's output does not depend on what was cached: engine/batch.py); sharing the
    daemon also checks that."""
    from _daemon_fakes import real_daemon

    with real_daemon(tmp_path_factory.mktemp("shared-models")) as srv:
        yield srv
