"""One daemon per port and data directory, started once and stopped cleanly: two `serve` at once (one wins, the
other says so in one line), two `run` at once (one daemon, its log kept), `serve --status`, `serve --stop`
(running replies end with a clear error), and the lock that a crash gives back."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from _daemon_fakes import MODEL, Lab, make_config
from typer.testing import CliRunner

from cli import app
from localrt import config as cfg
from localrt.cli.client import Client
from localrt.runtime.service import Service
from localrt.serve import daemon, lockfile
from localrt.serve.daemon import BackgroundServer, free_port
from _testpaths import REPO


def _env(tmp_path: Path, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCALRT_", "OLLAMA_"))}
    return {
        **env,
        "LOCALRT_HOST": f"127.0.0.1:{port}",
        "LOCALRT_DATA": str(tmp_path / "data"),
        "LOCALRT_MODELS": str(tmp_path / "models"),
    }


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _popen(env: dict, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def _wait_answer(port: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered on port {port} within {timeout} s")


def _first_to_exit(procs, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if p.poll() is not None:
                return i
        time.sleep(0.05)
    raise AssertionError("neither process exited")


def _status(out: str) -> dict:
    return dict(re.findall(r"^(\w+):\s+(.*)$", out, re.MULTILINE))


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


# ---- serve twice, status, stop ---------------------------------------------------------------------------------


def test_two_serve_at_once_one_wins_the_other_is_one_line_then_status_and_stop(tmp_path):
    port = free_port()
    env = _env(tmp_path, port)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    files = [open(p, "w") for p in logs]
    procs = [_popen(env, "serve", stderr=f) for f in files]
    try:
        _wait_answer(port)
        loser_at = _first_to_exit(procs)
        winner = procs[1 - loser_at]
        assert winner.poll() is None
        lost = logs[loser_at].read_text()
        assert lost.count("\n") == 1 and lost.startswith("Error: already running (pid ")
        assert f"(pid {winner.pid})" in lost and "Traceback" not in lost and "listening" not in lost
        assert procs[loser_at].returncode == 1  # as `ollama serve` on a busy port

        st = _cli(env, "serve", "--status", timeout=60)
        assert st.returncode == 0 and st.stdout.startswith("localrt is running"), st.stdout + st.stderr
        fields = _status(st.stdout)
        assert fields["pid"] == str(winner.pid) and fields["address"] == f"http://127.0.0.1:{port}"
        assert fields["log"] == str(logs[1 - loser_at])  # where its output goes (its stderr was redirected there)
        assert re.fullmatch(r"\d+\.\d+.*", fields["version"])

        stop = _cli(env, "serve", "--stop", timeout=60)
        assert stop.returncode == 0 and stop.stdout.strip() == "stopped", stop.stdout + stop.stderr
        assert winner.wait(10) == 0  # a clean exit, not a death by the signal
        assert "localrt stopped" in logs[1 - loser_at].read_text()
        assert not (tmp_path / "data" / "run" / f"daemon-{port}.json").exists()  # its record went with it

        after = _cli(env, "list", timeout=60)  # a client now: one clear line
        assert after.returncode == 1 and after.stderr.startswith("Error: could not connect"), after.stderr
        assert "Traceback" not in after.stderr
        again = _cli(env, "serve", "--status", timeout=60)
        assert again.returncode == 1 and again.stdout.strip() == f"localrt is not running on http://127.0.0.1:{port}"
        assert _cli(env, "serve", "--stop", timeout=60).returncode == 0  # stopping a stopped daemon is done
    finally:
        _kill(procs)
        for f in files:
            f.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX start-up of the background daemon")
def test_two_runs_at_once_start_one_daemon_and_keep_its_log(tmp_path):
    port = free_port()
    env = _env(tmp_path, port)
    procs = [_popen(env, "run", "no-such-model", "hi") for _ in range(2)]
    try:
        outs = [p.communicate(timeout=150) for p in procs]
        errs = [err for _, err in outs]
        assert all(p.returncode == 1 and "not found" in e for p, e in zip(procs, errs)), errs  # both reached it
        assert sum("starting the daemon" in e for e in errs) == 1, errs  # one started it, the other waited
        assert not any("Traceback" in e for e in errs)
        st = _cli(env, "serve", "--status", timeout=60)
        fields = _status(st.stdout)
        log = tmp_path / "data" / "logs" / "server.log"
        assert fields["log"] == str(log)  # the log printed is the live daemon's
        assert f"(pid {fields['pid']})" in log.read_text() and "Error" not in log.read_text()
        assert not (log.parent / "server-1.log").exists()  # nobody moved the live log away
    finally:
        _kill(procs)
        _cli(env, "serve", "--stop", timeout=60)
    assert _cli(env, "serve", "--status", timeout=60).returncode == 1


def test_status_and_stop_tell_apart_a_server_of_another_data_directory(tmp_path):
    service = Service(make_config(tmp_path / "models"), load_model=Lab().load_model)
    try:
        with BackgroundServer(service, service.config) as srv:
            env = {
                **{k: None for k in os.environ if k.startswith(("LOCALRT_", "OLLAMA_"))},
                **_env(tmp_path, srv.config.port),
            }
            st = CliRunner().invoke(app, ["serve", "--status"], env=env)
            assert st.exit_code == 1 and "another LOCALRT_DATA" in st.stdout
            stop = CliRunner().invoke(app, ["serve", "--stop"], env=env)
            assert stop.exit_code == 1 and stop.stderr.count("\n") == 1 and "another LOCALRT_DATA" in stop.stderr
            assert httpx.get(srv.url + "/").status_code == 200  # not ours: left alone
    finally:
        service.close()


# ---- the lock --------------------------------------------------------------------------------------------------


def _conf(tmp_path: Path, port: int = 11434) -> cfg.Config:
    return dataclasses.replace(cfg.load({}), data_dir=tmp_path / "data", port=port)


def test_one_claim_per_port_and_data_directory(tmp_path):
    conf = _conf(tmp_path)
    assert lockfile.running(conf) is None and not (tmp_path / "data").exists()  # a look creates nothing
    first = lockfile.claim(conf, "/x/server.log", "1.2.3")
    try:
        with pytest.raises(lockfile.AlreadyRunning) as e:
            lockfile.claim(conf, None, "1.2.3", wait=0.1)
        assert e.value.info.pid == os.getpid() and str(e.value).startswith(f"already running (pid {os.getpid()})")
        info = lockfile.running(conf)
        assert (info.pid, info.log, info.version, info.url) == (os.getpid(), "/x/server.log", "1.2.3", conf.base_url)
        other_port = lockfile.claim(_conf(tmp_path, 11435), None, "1.2.3")  # another port: another daemon
        other_port.release()
    finally:
        first.release()
    assert lockfile.running(conf) is None
    lockfile.claim(conf, None, "1.2.3").release()  # free again


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="kills a process")
def test_a_killed_daemon_gives_its_lock_back(tmp_path):
    conf = _conf(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import dataclasses, sys, time\n"
                "from pathlib import Path\n"
                "from localrt import config\n"
                "from localrt.serve import lockfile\n"
                f"c = dataclasses.replace(config.load({{}}), data_dir=Path({str(tmp_path / 'data')!r}), port=11434)\n"
                "lockfile.claim(c, None, 'v')\n"
                "print('held', flush=True)\n"
                "time.sleep(60)\n"
            ),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lockfile.running(conf).pid == holder.pid
        holder.kill()  # no clean-up runs: the record stays, the OS drops the lock
        holder.wait(10)
        assert (tmp_path / "data" / "run" / "daemon-11434.json").exists()
        assert lockfile.running(conf) is None  # the stale record is not believed
        lockfile.claim(conf, None, "v").release()
    finally:
        _kill([holder])


# ---- what clients see when it stops ----------------------------------------------------------------------------


@pytest.fixture
def stoppable(tmp_path, monkeypatch):
    """A daemon over the fake engine whose stop is the one `localrt serve` has, with a short grace."""
    monkeypatch.setattr(daemon, "STOP_GRACE_S", 0.5)
    lab = Lab()
    conf = make_config(tmp_path / "models")
    service = Service(conf, load_model=lab.load_model)
    try:
        with BackgroundServer(service, conf, on_stop=service.close) as srv:
            yield srv, lab
    finally:
        lab.decode_release.set()
        service.close()


def _collect(fn, out: dict, key: str) -> threading.Thread:
    def run():
        try:
            out[key] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - the test looks at what the client met
            out[key] = (type(e).__name__, str(e))

    t = threading.Thread(target=run)
    t.start()
    return t


def _sse_lines(url: str, prompt: str) -> list[str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        return [ln for ln in r.iter_lines() if ln.startswith("data:")]


def _shutting_down(lines: list[str]) -> bool:
    """An OpenAI stream that ends with the error event, then [DONE]."""
    return (
        lines[-1] == "data: [DONE]" and json.loads(lines[-2][5:])["error"]["message"] == "the server is shutting down"
    )


@pytest.mark.parametrize("api", ["native", "openai"])
def test_a_stop_ends_running_and_waiting_replies_with_a_clear_error(stoppable, api):
    srv, lab = stoppable
    client = Client(srv.url, api_key="")
    out: dict = {}
    running = (
        (lambda: list(client.generate(MODEL, "[slow] running")))
        if api == "native"
        else (lambda: _sse_lines(srv.url, "[slow] running"))
    )
    threads = [_collect(running, out, "running")]
    lab.wait_run("[slow] running")
    threads.append(_collect(lambda: list(client.generate(MODEL, "[slow] queued", stream=False)), out, "waiting"))
    time.sleep(0.5)  # queued behind the running one (one slot)
    t0 = time.monotonic()
    srv.server.stop()
    for t in threads:
        t.join(30)
    if api == "native":
        assert out["running"] == ("ApiError", "the server is shutting down")  # one error line ends the stream
    else:
        assert out["running"][0] == "ok" and _shutting_down(out["running"][1]), out["running"]
    assert out["waiting"] == ("ApiError", "the server is shutting down")  # a 503 that says why, not an empty 499
    srv.thread.join(20)
    assert not srv.thread.is_alive() and time.monotonic() - t0 < 15
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.url + "/", timeout=2)
