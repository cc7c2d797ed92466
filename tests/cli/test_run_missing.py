"""`localrt run NAME` of a model that is not stored (issue 46 friction): with a mirror configured it is pulled first,
as `ollama run` pulls; with none, the error lists the offline ways to get a model."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

import store as st
from _daemon_fakes import Script, make_config
from fixtures.decoders import write_tiny
from cli import app
from localrt.models.create import create
from localrt.runtime.service import Service
from localrt.serve.daemon import BackgroundServer


@pytest.fixture
def daemon_with(tmp_path):
    """Start a daemon (models answer "scripted answer") with `registry` as its mirror; yields a starter."""
    started = []

    def start(registry: str | None):
        conf = make_config(tmp_path / "models", data_dir=tmp_path / "data")
        conf = dataclasses.replace(conf, registry=registry)
        service = Service(conf, load_model=Script(answer="scripted answer").load)
        srv = BackgroundServer(service, conf).__enter__()
        started.append((srv, service))
        env = {
            "LOCALRT_HOST": f"127.0.0.1:{conf.port}",
            "LOCALRT_MODELS": str(conf.models_dir),
            "LOCALRT_DATA": str(tmp_path / "data"),
            "LOCALRT_API_KEY": "",
            "LOCALRT_REGISTRY": registry or "",
        }
        return env, service

    yield start
    for srv, service in started:
        srv.__exit__(None, None, None)
        service.close()


def test_run_of_a_missing_model_without_a_mirror_lists_the_offline_ways(daemon_with):
    env, service = daemon_with(None)
    r = CliRunner().invoke(app, ["run", "no-such-model", "hi"], env=env, catch_exceptions=False)
    assert r.exit_code == 1 and not r.stdout.strip(), r.output
    assert r.stderr.startswith("Error: model 'no-such-model' not found\n"), r.stderr
    for way in (
        "localrt import PATH",
        "localrt export",
        "localrt create NAME -f Modelfile",
        ".gguf",
        "smollm2:135m",
        "gemma3:270m",
        "LOCALRT_REGISTRY",
    ):
        assert way in r.stderr, r.stderr
    assert "pulling" not in r.stderr and not service.store.list()  # nothing was tried, nothing stored


def test_run_of_a_missing_model_pulls_it_from_the_configured_mirror(daemon_with, tmp_path):
    mirror = st.Store(tmp_path / "mirror")
    gguf_file = write_tiny(tmp_path / "tiny.gguf")
    list(create(mirror, "tiny:1", f"FROM {gguf_file}\nTEMPLATE {{{{ .Prompt }}}}"))
    env, service = daemon_with(f"file://{mirror.root}")
    r = CliRunner().invoke(app, ["run", "tiny:1", "hi"], env=env, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "scripted answer"
    assert "pulling manifest" in r.stderr and "success" in r.stderr, r.stderr
    assert service.store.manifest("tiny:1").digests == mirror.manifest("tiny:1").digests
