"""The `localrt` CLI (typer app) against a real daemon on a free port with a temporary store and the built-in
SmolLM2, as a user types it; and `run` starting a daemon of its own when none answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import re
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from _daemon_fakes import make_config
from cli import app
from localrt.serve.daemon import BackgroundServer, free_port
from localrt.runtime.service import Service
from _testpaths import REPO

BASE = "smollm2:135m"
TINY = "tiny8"  # greedy, 8 tokens at most: one-shot `run` has no way to set num_predict
MODELFILE = f"""FROM {BASE}
SYSTEM You answer in one short sentence.
PARAMETER num_predict 8
PARAMETER temperature 0
PARAMETER num_ctx 512
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    conf = make_config(root / "models", data_dir=root / "data")
    service = Service(conf)
    with BackgroundServer(service, conf) as srv:
        srv.env = {
            "LOCALRT_HOST": f"127.0.0.1:{conf.port}",
            "LOCALRT_MODELS": str(conf.models_dir),
            "LOCALRT_DATA": str(conf.data_dir),
            "LOCALRT_API_KEY": "",
        }
        srv.root = root
        yield srv
    service.close()


@pytest.fixture(scope="module")
def cli(daemon):
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(app, list(args), env=daemon.env, input=input, catch_exceptions=False)

    mf = daemon.root / "Modelfile"
    mf.write_text(MODELFILE)
    created = invoke("create", TINY, "-f", str(mf))
    assert created.exit_code == 0, created.output
    return invoke


def test_create_reports_success_and_unknown_file_fails(cli, daemon):
    missing = cli("create", "nope", "-f", str(daemon.root / "no-such-Modelfile"))
    assert missing.exit_code == 1 and "no Modelfile" in missing.stderr
    bad = daemon.root / "Bad.Modelfile"
    bad.write_text("FROM no-such-model:1b\n")
    r = cli("create", "nope", "-f", str(bad))
    assert r.exit_code == 1 and ("not found" in r.stderr.lower() or "does not exist" in r.stderr.lower()), r.output


def test_list_and_ls(cli):
    for cmd in ("list", "ls"):
        r = cli(cmd)
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
        rows = {line.split()[0]: line.split() for line in lines[1:]}
        assert f"{TINY}:latest" in rows and BASE in rows
        digest = rows[f"{TINY}:latest"][1]
        assert len(digest) == 12 and int(digest, 16) >= 0
        assert rows[BASE][3] in ("MB", "GB")  # "<n> MB" as Ollama prints sizes
    assert cli("ls", "tiny").stdout.count("\n") == 2  # the prefix filter: header and one row


def test_show_each_flag(cli):
    r = cli("show", TINY)
    assert r.exit_code == 0 and "Model" in r.stdout and "llama" in r.stdout and "Capabilities" in r.stdout
    assert "completion" in r.stdout and "num_predict" in r.stdout
    assert cli("show", TINY, "--system").stdout.strip() == "You answer in one short sentence."
    params = cli("show", TINY, "--parameters").stdout
    assert "num_predict" in params and "8" in params and "temperature" in params
    mf = cli("show", TINY, "--modelfile").stdout
    assert "FROM " in mf and "SYSTEM" in mf and "PARAMETER num_predict 8" in mf
    assert "<|im_start|>" in cli("show", TINY, "--template").stdout
    assert "Apache" in cli("show", TINY, "--license").stdout
    verbose = cli("show", TINY, "-v")
    assert verbose.exit_code == 0 and len(verbose.stdout) >= len(r.stdout)
    both = cli("show", TINY, "--system", "--license")
    assert both.exit_code == 1 and "only one of" in both.stderr
    missing = cli("show", "no-such-model")
    assert missing.exit_code == 1 and "not found" in missing.stderr


def test_cp_and_rm(cli):
    r = cli("cp", TINY, "tiny8-copy")
    assert r.exit_code == 0 and r.stdout.strip() == f"copied '{TINY}' to 'tiny8-copy'"
    assert "tiny8-copy:latest" in cli("list").stdout
    r = cli("rm", "tiny8-copy")
    assert r.exit_code == 0 and r.stdout.strip() == "deleted 'tiny8-copy'"
    assert "tiny8-copy" not in cli("list").stdout
    r = cli("rm", "tiny8-copy")
    assert r.exit_code == 1 and "not found" in r.stderr
    r = cli("cp", "no-such-model", "x")
    assert r.exit_code == 1 and "not found" in r.stderr
    assert f"{TINY}:latest" in cli("list").stdout  # the source is untouched


def test_run_one_shot_verbose_then_ps_and_stop(cli):
    r = cli("run", TINY, "What", "is", "the", "capital", "of", "France?", "--verbose")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip(), "no answer printed"
    stats = dict(line.split(":", 1) for line in r.stderr.splitlines() if ":" in line)
    for key in (
        "total duration",
        "load duration",
        "prompt eval count",
        "prompt eval rate",
        "eval count",
        "eval duration",
        "eval rate",
    ):
        assert key in stats, r.stderr
    assert 0 < int(stats["eval count"].split()[0]) <= 8  # the Modelfile's num_predict reached the engine
    assert "tokens/s" in stats["eval rate"]
    assert "eval count" not in r.stdout  # stats go to stderr only

    ps = cli("ps")
    assert ps.exit_code == 0
    lines = ps.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "SLOTS", "UNTIL"]
    row = next(line for line in lines[1:] if line.startswith(f"{TINY}:latest"))
    assert "100% CPU" in row and " 512 " in row and "from now" in row
    assert re.search(r" 0/\d+ ", row), row  # the slots in use / the model's KV slots

    stopped = cli("stop", TINY)
    assert stopped.exit_code == 0, stopped.output
    deadline = time.monotonic() + 10
    while TINY in cli("ps").stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    assert TINY not in cli("ps").stdout
    r = cli("stop", "no-such-model")
    assert r.exit_code == 1 and "not found" in r.stderr


def test_run_reads_stdin(cli):
    question = "What is 2+2?"
    # Each run starts from a freshly loaded model: a reused prompt prefix changes how the prompt is batched,
    # and with it the last bits of the logits, which can flip a greedy choice between near-equal tokens.
    assert cli("stop", TINY).exit_code == 0
    piped = cli("run", TINY, input=question)  # no newline: the same prompt text as the argument form
    assert piped.exit_code == 0, piped.output
    assert piped.stdout.strip() and ">>>" not in piped.stdout  # one-shot, not the interactive prompt
    assert cli("stop", TINY).exit_code == 0
    as_arg = cli("run", TINY, question)
    assert as_arg.stdout.strip() == piped.stdout.strip()  # greedy: the same prompt gives the same answer


def test_run_unknown_model_fails_clearly(cli):
    r = cli("run", "no-such-model", "hi")
    assert r.exit_code == 1 and "not found" in r.stderr and not r.stdout.strip()


def test_commands_without_a_daemon_fail_clearly(tmp_path):
    env = {
        "LOCALRT_HOST": f"127.0.0.1:{free_port()}",
        "LOCALRT_MODELS": str(tmp_path / "m"),
        "LOCALRT_DATA": str(tmp_path / "d"),
        "LOCALRT_API_KEY": "",
    }
    for args in (["list"], ["ps"], ["show", BASE]):
        r = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
        assert r.exit_code == 1 and "could not connect" in r.stderr and "localrt serve" in r.stderr, args


# ---- auto-start ----------------------------------------------------------------------------------------------


def _pids_with_env(marker: str) -> list[int]:
    """Our processes whose environment names `marker` (the unique temporary data directory of this test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"LOCALRT_DATA={marker}".encode() in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def _stop(pids: list[int]) -> None:
    for pid in pids:
        with_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with_signal(pid, signal.SIGKILL)


def with_signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the started daemon through /proc")
def test_run_starts_a_daemon_when_none_answers(tmp_path):
    port = free_port()
    data = tmp_path / "data"
    env = {
        **os.environ,
        "LOCALRT_HOST": f"127.0.0.1:{port}",
        "LOCALRT_DATA": str(data),
        "LOCALRT_MODELS": str(tmp_path / "models"),
        "LOCALRT_API_KEY": "",
    }
    env.pop("LOCALRT_MODELS_READONLY", None)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "cli", "run", "no-such-model", "hi"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert "starting the daemon" in r.stderr and "localrt serve --stop" in r.stderr, r.stderr
        assert r.returncode == 1 and "not found" in r.stderr  # it reached the new daemon, which said so
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).text == "Ollama is running"
        daemons = _pids_with_env(str(data))
        assert len(daemons) == 1, daemons
        cmdline = Path(f"/proc/{daemons[0]}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert cmdline[-2].endswith(b"localrt") and cmdline[-1] == b"serve", cmdline  # ps reads `localrt serve`
        assert (data / "logs" / "server.log").is_file()
        listed = subprocess.run(
            [sys.executable, "-m", "cli", "list"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
        assert listed.returncode == 0 and "starting the daemon" not in listed.stderr and "NAME" in listed.stdout
    finally:
        _stop(_pids_with_env(str(data)))
    assert not _pids_with_env(str(data)), "the started daemon is still running"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=2)


def test_h_and_help_show_the_help():
    for args in (["-h"], ["help"], ["help", "serve"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0 and "Usage:" in r.stdout and "serve" in r.stdout, (args, r.output)
    assert "LOCALRT_API_KEY" in CliRunner().invoke(app, ["serve", "--help"]).stdout
    assert CliRunner().invoke(app, ["help", "nope"]).exit_code == 1


def test_another_web_server_on_the_port_is_one_line_not_its_html():
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"LOCALRT_HOST": f"127.0.0.1:{server.server_address[1]}", "LOCALRT_API_KEY": ""}
        r = CliRunner().invoke(app, ["list"], env=env)
        ours = [line for line in r.stderr.splitlines() if "127.0.0.1 - -" not in line]  # the server's own log lines
        assert r.exit_code == 1 and len(ours) == 1 and "<html" not in r.stderr.lower(), r.stderr
        assert ours[0].startswith("Error:") and "not localrt" in ours[0] and "LOCALRT_HOST" in ours[0]
    finally:
        server.shutdown()
