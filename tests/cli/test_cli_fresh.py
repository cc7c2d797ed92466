"""What a new user meets first: starting the daemon (and its failures), one-line errors instead of tracebacks,
built-in models on an air-gapped PC, `--version`, the access log and `show -v`."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pexpect
import pytest
from typer.testing import CliRunner

import cli as cli_module
from _daemon_fakes import make_config
from cli import app
from localrt.serve.daemon import BackgroundServer, free_port
from localrt.cli.repl import describe
from localrt.runtime.service import Service
from _testpaths import REPO


def _env(tmp_path: Path, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALRT_")}
    return {
        **env,
        "LOCALRT_HOST": f"127.0.0.1:{port}",
        "LOCALRT_DATA": str(tmp_path / "data"),
        "LOCALRT_MODELS": str(tmp_path / "models"),
    }


def _localrt(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localrt", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# ---- serve -----------------------------------------------------------------------------------------------------


def test_serve_on_a_port_in_use_is_one_clear_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = _localrt(_env(tmp_path, busy.getsockname()[1]), "serve", timeout=60)
    assert r.returncode == 1
    assert "listening" not in r.stderr  # never claimed before the bind
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "address is in use" in errors[0], r.stderr
    assert "Traceback" not in r.stderr


def test_serve_refuses_a_public_host_without_a_key_in_one_line(tmp_path):
    env = {**_env(tmp_path, free_port()), "LOCALRT_HOST": f"0.0.0.0:{free_port()}"}
    r = _localrt(env, "serve", timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("Error: refusing to listen on 0.0.0.0") and "LOCALRT_API_KEY" in r.stderr


def test_serve_on_an_unknown_host_is_one_clear_line(tmp_path):
    env = {**_env(tmp_path, free_port()), "LOCALRT_HOST": "no-such-host.invalid:11434", "LOCALRT_API_KEY": "k"}
    r = _localrt(env, "serve", timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("Error: cannot listen on") and "unknown host" in r.stderr


# ---- run starting the daemon -------------------------------------------------------------------------------------


def test_run_says_at_once_when_the_daemon_it_started_dies(tmp_path):
    """The port is taken by something that never answers HTTP: the child cannot bind and exits; `run` reports
    that with the cause from the child's log, long before its start deadline."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = _env(tmp_path, busy.getsockname()[1])
        t0 = time.monotonic()
        r = _localrt(env, "run", "smollm2:135m", "hi", timeout=110)
        took = time.monotonic() - t0
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "the daemon exited" in r.stderr and "address is in use" in r.stderr, r.stderr  # the log's last lines
    assert took < 60, took
    log = tmp_path / "data" / "logs" / "server.log"
    assert "address is in use" in log.read_text()


def test_each_daemon_start_gets_a_fresh_log(tmp_path):
    log = tmp_path / "logs" / "server.log"
    cli_module._rotate_log(log)  # no log yet: nothing to keep
    assert not log.exists() and log.parent.is_dir()
    log.write_text("first start\n")
    cli_module._rotate_log(log)
    assert not log.exists() and (log.parent / "server-1.log").read_text() == "first start\n"
    log.write_text("second start\n")
    cli_module._rotate_log(log)
    assert (log.parent / "server-1.log").read_text() == "second start\n"  # one previous log is kept


def test_the_daemon_command_line_reads_localrt_serve():
    cmd = cli_module._serve_command()
    assert Path(cmd[0]).name == "localrt" and cmd[1:] == ["serve"]


# ---- one-line errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("FROM smollm2:135m\nPARAMETER temprature 0.2\n", 2, "unknown parameter 'temprature'"),
        ("FORM smollm2:135m\n", 1, "command must be one of"),
    ],
)
def test_a_modelfile_typo_is_one_line_with_its_line_number(tmp_path, text, line, words):
    mf = tmp_path / "Modelfile"
    mf.write_text(text)
    env = _env(tmp_path, free_port())  # no daemon needed: the Modelfile is read before anything is sent
    r = CliRunner().invoke(app, ["create", "m", "-f", str(mf)], env=env)
    assert r.exit_code == 1, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Error: "), r.stderr
    assert f"(line {line})" in r.stderr and words in r.stderr and str(mf) in r.stderr


def _read_request(conn: socket.socket) -> str:
    """The whole request (head and Content-Length body): closing with unread bytes would send a reset instead."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            break
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip() or 0)
    while len(body) < length:
        part = conn.recv(65536)
        if not part:
            break
        body += part
    return head.decode(errors="replace")


class _DyingDaemon:
    """Answers like a daemon until a generate is half sent, then drops the connection (a crash mid-reply)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for _ in range(20):  # bounded: a few requests is all a test makes
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = _read_request(conn)
                path = head.split(" ", 2)[1] if " " in head else "/"
                if path == "/api/generate":
                    chunk = json.dumps({"response": "The sky", "done": False}).encode() + b"\n"
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(chunk), chunk)
                    )
                    continue  # closed without the last chunk
                body = b'{"model_info": {}}' if path == "/api/show" else b"Ollama is running"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
                )

    def close(self) -> None:
        self.sock.close()


def test_a_daemon_that_dies_mid_reply_is_one_line(tmp_path):
    fake = _DyingDaemon()
    try:
        r = CliRunner().invoke(app, ["run", "smollm2:135m", "Why is the sky blue?"], env=_env(tmp_path, fake.port))
    finally:
        fake.close()
    assert r.exit_code == 1 and "Traceback" not in r.output
    err = [ln for ln in r.stderr.splitlines() if ln]
    assert len(err) == 1 and err[0].startswith("Error: the daemon closed the connection before the reply"), r.stderr
    # a clean close reads as RemoteProtocolError, a reset (the OS's choice under load) as ReadError: both one line
    assert "server.log" in err[0] and ("RemoteProtocolError" in err[0] or "ReadError" in err[0])
    assert r.stdout.startswith("The sky")  # what came before the drop was shown


# ---- built-ins on an air-gapped PC --------------------------------------------------------------------------------


@pytest.fixture
def daemon(tmp_path):
    conf = make_config(tmp_path / "models", data_dir=tmp_path / "data")
    service = Service(conf)
    with BackgroundServer(service, conf) as srv:
        srv.env = {
            "LOCALRT_HOST": f"127.0.0.1:{conf.port}",
            "LOCALRT_MODELS": str(conf.models_dir),
            "LOCALRT_DATA": str(conf.data_dir),
            "LOCALRT_API_KEY": "",
        }
        yield srv
    service.close()


def _cli(daemon, *args: str):
    return CliRunner().invoke(app, list(args), env=daemon.env, catch_exceptions=False)


def test_read_only_commands_never_create_a_builtin_and_pull_creates_it_offline(daemon, smollm2_path):
    for args in (["show", "smollm2"], ["show", "smollm2:135m"], ["cp", "smollm2", "x"], ["rm", "smollm2"]):
        r = _cli(daemon, *args)
        assert r.exit_code == 1 and "not found" in r.stderr, (args, r.output)
    assert _cli(daemon, "list").stdout.strip() == "NAME    ID    SIZE    MODIFIED"
    r = _cli(daemon, "pull", "smollm2:135m")
    assert r.exit_code == 0, r.output
    listed = _cli(daemon, "list").stdout
    assert "smollm2:135m" in listed and "latest" not in listed  # stored once, under its canonical name
    # the bare name means the built-in size in every command
    assert "llama" in _cli(daemon, "show", "smollm2").stdout
    assert _cli(daemon, "pull", "smollm2").exit_code == 0  # already there: nothing to do
    assert _cli(daemon, "cp", "smollm2", "mine").exit_code == 0
    assert "mine:latest" in _cli(daemon, "list").stdout
    assert _cli(daemon, "rm", "smollm2").exit_code == 0
    assert "smollm2" not in _cli(daemon, "list").stdout


def test_run_of_a_missing_builtin_creates_it_and_an_unknown_name_stays_not_found(daemon, smollm2_path):
    r = _cli(daemon, "run", "no-such-model", "hi")  # no registry configured: nothing to pull from, offline
    assert r.exit_code == 1 and "not found" in r.stderr and "registry" not in r.stderr, r.output
    r = CliRunner().invoke(app, ["run", "smollm2", "Say hi."], env={**daemon.env}, catch_exceptions=False)
    assert r.exit_code == 0 and r.stdout.strip(), r.output
    assert "smollm2:135m" in _cli(daemon, "list").stdout


# ---- small habits ------------------------------------------------------------------------------------------------


def test_version_flag():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("localrt version is ")


def test_one_access_log_line_per_request(daemon, caplog):
    with caplog.at_level(logging.INFO, logger="localrt.access"):
        httpx.get(daemon.url + "/api/tags", timeout=10)
        httpx.post(daemon.url + "/api/show", json={"model": "no-such"}, timeout=10)
        deadline = time.monotonic() + 5
        while len(caplog.records) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "localrt.access"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("127.0.0.1 GET /api/tags 200 ")
    assert lines[1].startswith("127.0.0.1 POST /api/show 404 ")
    assert all(re.search(r" \d+(\.\d+)?(µs|ms|s) req_[0-9a-f]{24}$", ln) for ln in lines), lines


def test_show_verbose_shortens_long_arrays_unless_full():
    info = {
        "model_info": {
            "general.architecture": "llama",
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(50000)],
            "tokenizer.ggml.merges": ["a b", "c d"],
        },
        "details": {},
    }
    short = describe(info, verbose=True)
    assert '["t0", "t1", "t2", ...] (50000 items)' in short and "t3" not in short
    assert '["a b", "c d"]' in short  # short arrays are printed whole
    assert '"t49999"' in describe(info, verbose=True, full=True)
    assert "tokenizer.ggml.tokens" not in describe(info)  # not without -v


def test_one_shot_run_wraps_words_on_a_terminal(daemon, smollm2_path):
    assert _cli(daemon, "pull", "smollm2:135m").exit_code == 0
    prompt = "Write two long sentences about the history of the city of Paris."
    env = {k: v for k, v in {**os.environ, **daemon.env}.items() if k not in ("COLUMNS", "LINES")}  # the pty's size
    child = pexpect.spawn(
        sys.executable,
        ["-m", "localrt", "run", "smollm2:135m", prompt],
        cwd=str(REPO),
        env=env,
        encoding="utf-8",
        timeout=90,
        dimensions=(40, 30),
    )
    child.expect(pexpect.EOF)
    out = child.before
    text = re.sub("\r(?:[\u2800-\u28ff][^\r\n\x1b]*)?\x1b\\[K", "", out)  # spinner frames
    text = re.sub("\x1b\\[\\d+D\x1b\\[K", "", text)  # a word moved to the next line is erased here first
    lines = [ln for ln in text.replace("\r\n", "\n").split("\n") if ln.strip()]
    assert len(lines) > 2 and all(len(ln) <= 30 for ln in lines), lines
