"""While a first answer waits on kernels being compiled for this CPU, the daemon says so (GET /api/kernels) and
`localrt run` shows it on its spinner line (issue 46 friction: about two minutes behind a bare spinner looked hung).
The counts are Numba's own compile events, not a timer."""

from __future__ import annotations

import io
import os
import sys
import time

import httpx
import numba
import pexpect

from _daemon_fakes import Script, ScriptModel, make_config
from localrt.cli import spinner as sp
from localrt.cli.client import Client
from localrt.runtime import kernel_prep
from localrt.runtime.service import Service
from localrt.serve.daemon import BackgroundServer
from _testpaths import REPO


def fresh_kernel(k: int):
    """A function Numba has never compiled in this process (no cache): calling it compiles it."""

    def kernel_under_test(x):
        return x * 2 + k

    return numba.njit(kernel_under_test)


class _Peek(numba.core.event.Listener):
    """Reads kernel_prep.status() from inside a compile (registered after kernel_prep's listener)."""

    def __init__(self):
        self.seen: list[dict] = []

    def on_start(self, event):
        self.seen.append(kernel_prep.status())

    def on_end(self, event):
        pass


def test_compiles_are_counted_and_named_while_they_run():
    kernel_prep.install()
    kernel_prep.install()  # once
    peek = _Peek()
    numba.core.event.register("numba:compile", peek)
    try:
        before = kernel_prep.status()
        assert before["compiling"] is False and "kernel" not in before
        assert fresh_kernel(1)(3) == 7
    finally:
        numba.core.event.unregister("numba:compile", peek)
    assert peek.seen[0] == {"compiling": True, "compiled": before["compiled"], "kernel": "kernel_under_test"}
    assert kernel_prep.status() == {"compiling": False, "compiled": before["compiled"] + 1}
    fresh_kernel(1)  # made, not called: nothing compiled
    assert kernel_prep.status()["compiled"] == before["compiled"] + 1


def test_the_spinner_line_says_what_is_compiling(monkeypatch):
    reports = iter(
        [
            {"compiling": False, "compiled": 4},
            {"compiling": True, "compiled": 4, "kernel": "matvec_q8_0"},
            {"compiling": False, "compiled": 6},
            None,
        ]
    )
    monkeypatch.setattr(Client, "kernels", lambda self: next(reports))
    detail = sp.kernel_detail(Client("http://127.0.0.1:9"))
    assert detail() is None  # nothing compiled since the wait began: the plain spinner
    assert detail().startswith("preparing kernels for this CPU (first run only): 0 compiled, now matvec_q8_0, ")
    assert detail().startswith("preparing kernels for this CPU (first run only): 2 compiled, ")
    assert detail() is None  # a daemon that does not say


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_spinner_draws_the_detail_and_cuts_it_to_the_terminal(monkeypatch):
    monkeypatch.setattr(sp.shutil, "get_terminal_size", lambda *a: os.terminal_size((30, 10)))
    out = _Tty()
    with sp.Spinner(stream=out, interval=0.01, detail=lambda: "preparing kernels for this CPU, a long line"):
        time.sleep(0.1)
    frames = [f for f in out.getvalue().split("\r") if f.strip() and f != "\x1b[K"]
    assert frames and all(f.endswith("\x1b[K") and len(f) - 3 <= 29 for f in frames), frames
    assert "preparing kernels" in frames[0]


class _CompilingModel(ScriptModel):
    """Compiles a kernel Numba has not seen before its first token, as a first forward on a fresh machine does."""

    def generate(self, ids, options, cancelled=None, constraint=None, cache_scope=""):
        time.sleep(0.5)  # the client's spinner asks once before anything compiles
        fresh_kernel(int(time.time_ns() % 1000))(1)
        time.sleep(2.0)  # the next asks fall here: a compile done, the answer not started
        yield from super().generate(ids, options, cancelled, constraint, cache_scope)


def test_run_shows_kernel_preparation_while_the_first_answer_waits(tmp_path):
    kernel_prep.install()
    script = Script(answer="all done")
    conf = make_config(tmp_path / "models", data_dir=tmp_path / "data")
    service = Service(conf, load_model=lambda path, num_ctx=4096, **kw: _CompilingModel(script, num_ctx))
    try:
        with BackgroundServer(service, conf):
            url = f"http://127.0.0.1:{conf.port}"
            assert httpx.get(url + "/api/kernels", timeout=10).json()["compiling"] is False
            env = {
                k: v for k, v in os.environ.items() if not k.startswith("LOCALRT_") and k not in ("COLUMNS", "LINES")
            }
            env.update(
                LOCALRT_HOST=f"127.0.0.1:{conf.port}",
                LOCALRT_MODELS=str(conf.models_dir),
                LOCALRT_DATA=str(tmp_path / "data"),
                LOCALRT_API_KEY="",
            )
            child = pexpect.spawn(
                sys.executable,
                ["-m", "cli", "run", "smollm2:135m", "hi"],
                cwd=str(REPO),
                env=env,
                encoding="utf-8",
                timeout=90,
                dimensions=(40, 200),
            )
            child.expect(pexpect.EOF)
            out = child.before
    finally:
        service.close()
    assert "preparing kernels for this CPU (first run only): 1 compiled" in out, out
    assert out.rstrip().endswith("all done"), out  # the line was erased before the answer
