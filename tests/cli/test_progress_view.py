"""Progress bars as a new user sees them (issue 46 friction): on `create --quantize`, `pull`, `export` and `import`
every bar is drawn before the status lines that follow it ("success"), and counts bytes (quantization reported as
bytes of weights, not as a count of tensors drawn as bytes)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

import store as st
from _daemon_fakes import make_config
from fixtures.decoders import write_tiny
from cli import app
from localrt.cli.progress import render_progress
from localrt.models.create import create
from localrt.runtime.service import Service
from localrt.serve.daemon import BackgroundServer

PULL = [
    {"status": "pulling manifest"},
    {"status": "pulling 0123456789ab", "digest": "sha256:0123456789ab", "total": 3000, "completed": 1000},
    {"status": "pulling 0123456789ab", "digest": "sha256:0123456789ab", "total": 3000, "completed": 3000},
    {"status": "copying file m.gguf", "total": 5000, "completed": 100},
    {"status": "copying file m.gguf", "total": 5000, "completed": 5000},
    {"status": "verifying sha256 digest"},
    {"status": "writing manifest"},
    {"status": "success"},
]
BAR = re.compile(r"^(\S.*?)\s+━+\s+([\d.]+)/([\d.]+) (bytes|kB|MB|GB)\b")


def lines_in_order(text: str, *wanted: str) -> list[int]:
    """The index of the first line containing each of `wanted`, asserting they come in that order."""
    lines = text.splitlines()
    at = [next((i for i, ln in enumerate(lines) if w in ln), None) for w in wanted]
    assert None not in at and at == sorted(at), (wanted, at, text)
    return at


def test_bars_sit_between_the_status_lines_they_came_between():
    out = io.StringIO()
    render_progress(PULL, Console(file=out, width=120))
    text = out.getvalue()
    lines_in_order(
        text,
        "pulling manifest",
        "pulling 0123456789ab",
        "copying file m.gguf",
        "verifying sha256 digest",
        "writing manifest",
        "success",
    )
    assert text.count("copying file m.gguf") == 1  # one bar, not a line per progress object
    bars = [BAR.match(ln) for ln in text.splitlines() if "━" in ln]
    assert [(b.group(2), b.group(3), b.group(4)) for b in bars] == [("3.0", "3.0", "kB"), ("5.0", "5.0", "kB")]


def test_on_a_terminal_success_is_printed_after_the_last_bar_is_drawn():
    out = io.StringIO()
    render_progress(PULL, Console(file=out, width=120, force_terminal=True))
    raw = out.getvalue()
    assert raw.rindex("copying file m.gguf") < raw.rindex("verifying sha256 digest") < raw.rindex("success")


@pytest.fixture
def daemon(tmp_path):
    conf = make_config(tmp_path / "models", data_dir=tmp_path / "data")
    service = Service(conf)
    try:
        with BackgroundServer(service, conf):
            yield (
                {
                    "LOCALRT_HOST": f"127.0.0.1:{conf.port}",
                    "LOCALRT_MODELS": str(conf.models_dir),
                    "LOCALRT_DATA": str(tmp_path / "data"),
                    "LOCALRT_API_KEY": "",
                },
                service,
            )
    finally:
        service.close()


def _cli(env: dict, *args: str):
    r = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


def test_create_quantize_shows_upload_and_quantization_in_bytes_before_success(daemon, tmp_path):
    env, service = daemon
    write_tiny(tmp_path / "model-f32.gguf", n_embd=64)
    (tmp_path / "Modelfile").write_text("FROM ./model-f32.gguf\n")
    err = _cli(env, "create", "mine", "-q", "q8_0", "-f", str(tmp_path / "Modelfile")).stderr
    lines_in_order(
        err,
        "hashing model-f32.gguf",
        "transferring model data",
        "parsing GGUF",
        "quantizing F32 model to Q8_0",
        "verifying conversion",
        "writing manifest",
        "success",
    )
    assert re.search(r"^using existing layer sha256:[0-9a-f]{64}$", err, re.M), err  # one line, however narrow
    quantizing = next(BAR.match(ln) for ln in err.splitlines() if ln.startswith("quantizing"))
    weights = service.store.model_record("mine").model_path.stat().st_size  # Q8_0 out of F32: the source is bigger
    done, total, unit = float(quantizing.group(2)), float(quantizing.group(3)), quantizing.group(4)
    assert done == total and unit == "kB" and total * 1000 > weights, err


def test_pull_export_and_import_draw_a_bar_per_blob_in_bytes(daemon, tmp_path):
    env, _ = daemon
    mirror = st.Store(tmp_path / "mirror")
    list(create(mirror, "tiny:1", f"FROM {write_tiny(tmp_path / 't.gguf', n_embd=64)}\n"))
    model_layer = mirror.manifest("tiny:1").layers[0].digest
    err = _cli(env, "pull", f"{mirror.root}#tiny:1").stderr
    lines_in_order(err, f"pulling {model_layer[7:19]}", "verifying sha256 digest", "success")
    assert BAR.match(next(ln for ln in err.splitlines() if ln.startswith(f"pulling {model_layer[7:19]}")))

    r = _cli(env, "export", "tiny:1", str(tmp_path / "bundle.tar"))
    bar = BAR.match(next(ln for ln in r.stderr.splitlines() if ln.startswith(f"writing {model_layer[7:19]}")))
    assert bar.group(2) == bar.group(3) and bar.group(4) == "kB", r.stderr
    assert "exported 'tiny:1'" in r.stdout

    other = {**env, "LOCALRT_MODELS": str(tmp_path / "other")}
    r = _cli(other, "import", str(tmp_path / "bundle.tar"))
    bar = BAR.match(next(ln for ln in r.stderr.splitlines() if ln.startswith(f"copying {model_layer[7:19]}")))
    assert bar.group(2) == bar.group(3) and bar.group(4) == "kB", r.stderr
    assert r.stdout.strip() == "imported 'tiny:1'"
