"""Pull between two real localrt daemons on loopback with the clients users have: the official `ollama` Python
client and `localrt pull`. The source holds the built-in SmolLM2 (a real ~98 MB GGUF); the destination then runs it."""

from __future__ import annotations

import dataclasses

import ollama
import pytest
from typer.testing import CliRunner

from cli import app
from localrt import config as cfg
from localrt.serve.daemon import BackgroundServer, free_port
from localrt.runtime.service import Service

from _mirror import blob_bytes, daemon

MODEL = "smollm2:135m"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A daemon that never loads a model, serving its store (with the built-in created on first ask) on /v2."""
    with daemon(tmp_path_factory.mktemp("src") / "models") as src:
        ollama.Client(host=src.url).pull(MODEL)  # pulling a built-in creates it in this store, offline
        src.ref = f"{src.url.split('//', 1)[1]}/library/{MODEL}"  # type: ignore[attr-defined]
        yield src


@pytest.fixture
def runnable(tmp_path):
    """An empty destination daemon whose service really loads and runs models."""
    conf = dataclasses.replace(
        cfg.load({}),
        host="127.0.0.1",
        port=free_port(),
        models_dir=tmp_path / "models",
        data_dir=tmp_path / "data",
        readonly_models_dirs=(),
        api_key=None,
        registry=None,
    )
    service = Service(conf)
    try:
        with BackgroundServer(service, conf) as srv:
            srv.service = service  # type: ignore[attr-defined]
            yield srv
    finally:
        service.close()


def _statuses(events) -> list[str]:
    out: list[str] = []
    for e in events:
        if not out or out[-1] != e.status:
            out.append(e.status)
    return out


def _layer_digests(src) -> list[str]:
    manifest = src.service.store.get(MODEL).manifest
    return [layer.digest for layer in manifest.layers] + [manifest.config.digest]


def test_ollama_client_pulls_from_a_second_daemon_then_runs_it(source, runnable):
    dst = ollama.Client(host=runnable.url)
    events = list(dst.pull(source.ref, insecure=True, stream=True))
    digests = _layer_digests(source)
    assert _statuses(events) == ["pulling manifest"] + [f"pulling {d[7:19]}" for d in digests] + [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    for e in events:
        if e.digest:
            assert e.status == f"pulling {e.digest[7:19]}" and 0 <= e.completed <= e.total
    finals = {e.digest: e for e in events if e.digest}
    assert set(finals) == set(digests) and all(e.completed == e.total for e in finals.values())
    gguf_digest = max(finals, key=lambda d: finals[d].total)
    assert finals[gguf_digest].total > 90_000_000  # the real weights went over the wire
    for d in digests:
        assert blob_bytes(runnable.service.store, d) == blob_bytes(source.service.store, d)

    names = [m.model for m in dst.list().models]
    assert source.ref in names
    r = dst.generate(model=source.ref, prompt="The capital of France is", options={"num_predict": 4, "temperature": 0})
    assert r.done and 1 <= r.eval_count <= 4 and r.response.strip()

    again = list(dst.pull(source.ref, insecure=True, stream=True))
    assert again[0].status == "pulling manifest" and again[-1].status == "success"
    pulled = [e for e in again if e.digest]
    assert {e.digest for e in pulled} == set(digests)
    assert all(e.completed == e.total for e in pulled)  # every blob was already here: nothing new transferred


def test_localrt_pull_cli_shows_progress_and_succeeds(source, tmp_path):
    with daemon(tmp_path / "models") as dst:
        r = CliRunner().invoke(
            app,
            ["pull", source.ref, "--insecure"],
            env={"LOCALRT_HOST": dst.url.split("//", 1)[1], "LOCALRT_API_KEY": ""},
            catch_exceptions=False,
        )
        assert r.exit_code == 0, r.output
        for line in ("pulling manifest", "verifying sha256 digest", "writing manifest", "success"):
            assert line in r.stderr, r.stderr
        digests = _layer_digests(source)
        assert all(f"pulling {d[7:19]}" in r.stderr for d in digests), r.stderr  # one bar per blob
        assert dst.service.store.get(source.ref).manifest.digests == source.service.store.get(MODEL).manifest.digests
        missing = CliRunner().invoke(
            app,
            ["pull", source.ref.replace(MODEL, "nope:1"), "--insecure"],
            env={"LOCALRT_HOST": dst.url.split("//", 1)[1], "LOCALRT_API_KEY": ""},
        )
        assert missing.exit_code == 1 and "Error: pull model manifest: file does not exist" in missing.stderr
        with pytest.raises(ollama.ResponseError, match="file does not exist"):
            list(ollama.Client(host=dst.url).pull(source.ref.replace(MODEL, "nope:1"), insecure=True, stream=True))
