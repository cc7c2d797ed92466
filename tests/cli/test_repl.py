"""`localrt run MODEL` as an interactive chat, driven in a pseudo-terminal as a user types it, against a real daemon
(`python -m cli serve` in a subprocess over a temporary store) and the built-in SmolLM2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pexpect
import pytest

from localrt.cli.cli_format import _parse_time
from localrt.serve.daemon import free_port
from _testpaths import REPO

MODEL = "smollm2:135m"
PROMPT = ">>> "
ANSWER_S = 60  # a model answer (8 tokens) or a model load on a slow, shared machine
QUICK_S = 20  # a slash command: one HTTP call at most
SPINNER = re.compile("\r(?:[\u2800-\u28ff][^\r\n\x1b]*)?\x1b\\[K")  # a spinner frame, or its erasure
PASTE_MODE = re.compile("\x1b\\[\\?2004[hl]\r?")  # readline turning the terminal's bracketed paste on and off


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A real `localrt serve` on a free loopback port; always stopped at teardown."""
    root = tmp_path_factory.mktemp("repl")
    env = dict(
        os.environ,
        LOCALRT_HOST=f"127.0.0.1:{free_port()}",
        LOCALRT_MODELS=str(root / "models"),
        LOCALRT_DATA=str(root / "data"),
        LOCALRT_API_KEY="",
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    url = "http://" + env["LOCALRT_HOST"]
    with open(root / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_up(proc, url, root / "serve.log")
        yield env, url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _wait_up(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}: {log.read_text(errors='replace')}")
        try:
            httpx.get(url + "/", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("daemon did not answer within 60 s")


class Session:
    """One `localrt run` in a pty. `say` types a line and returns what was printed before the next prompt."""

    def __init__(self, env: dict, *args: str, columns: int = 200):
        env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}  # the pty's size, not the runner's
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "cli", "run", MODEL, *args],
            cwd=str(REPO),
            env=env,
            encoding="utf-8",
            timeout=ANSWER_S,
            dimensions=(40, columns),
        )
        self.child.expect_exact(PROMPT)  # the model is preloaded before the first prompt

    def say(self, line: str, timeout: float = QUICK_S, prompt: str = PROMPT) -> str:
        self.child.sendline(line)
        self.child.expect_exact(prompt, timeout=timeout)
        self.spun = bool(SPINNER.search(self.child.before))
        out = SPINNER.sub("", PASTE_MODE.sub("", self.child.before)).replace("\r\n", "\n")
        echoed, _, rest = out.partition("\n")  # the tty echoes the typed line first
        assert echoed.strip() == line.strip(), out
        return rest

    def ask(self, line: str) -> str:
        answer = self.say(line, timeout=ANSWER_S)
        assert answer.strip(), f"no answer to {line!r}"
        assert self.spun, "no spinner while the first token was awaited"
        return answer

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def session(daemon):
    made: list[Session] = []

    def start(*args: str, columns: int = 200) -> Session:
        s = Session(daemon[0], *args, columns=columns)
        made.append(s)
        return s

    yield start
    for s in made:
        s.close()


def _show(url: str, model: str) -> dict:
    r = httpx.post(url + "/api/show", json={"model": model}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_interactive_session_commands_and_save_load(daemon, session):
    env, url = daemon
    s = session()
    assert s.say("/set parameter num_predict 8").strip() == "Set parameter 'num_predict' to '8'"
    assert s.say("/set parameter temperature 0").strip() == "Set parameter 'temperature' to '0'"
    s.child.send("\x1b[A\r")  # up arrow recalls the last line from history, Enter runs it again
    s.child.expect_exact("Set parameter 'temperature' to '0'", timeout=QUICK_S)
    s.child.expect_exact(PROMPT, timeout=QUICK_S)
    assert "Couldn't set parameter" in s.say("/set parameter bogus 1")  # refused before it can break a turn
    assert "Couldn't set parameter" in s.say("/set parameter temperature -1")
    first = s.ask("What is 2+2?")

    assert s.say("/set system You are terse.").strip() == "Set system message."
    assert s.say("/show system").strip() == "You are terse."
    params = s.say("/show parameters")
    assert "Model defined parameters:" in params and "<|im_end|>" in params  # the model's own PARAMETER lines
    user = params.split("User defined parameters:", 1)[1].split()
    assert user == ["num_predict", "8", "temperature", "0"]

    s.child.sendline('"""Answer this:')
    s.child.expect_exact("... ", timeout=QUICK_S)  # a continuation prompt, not a turn
    s.ask('what is the capital of France?"""')
    assert s.say("/save midway").strip() == "Created new model 'midway'"
    history = _show(url, "midway")["messages"]
    assert [m["role"] for m in history] == ["user", "assistant"] * 2
    assert history[0]["content"] == "What is 2+2?" and history[1]["content"].strip() == first.strip()
    assert history[2]["content"] == "Answer this:\nwhat is the capital of France?"  # one message, two lines

    assert s.say("/clear").strip() == "Cleared session context"
    again = s.ask("What is 2+2?")
    assert s.say("/save mysaved").strip() == "Created new model 'mysaved'"
    saved = _show(url, "mysaved")
    assert saved["system"] == "You are terse."
    params = dict(line.split(None, 1) for line in saved["parameters"].splitlines())
    assert float(params["num_predict"]) == 8 and float(params["temperature"]) == 0
    # the history after /clear only: one user turn and its answer
    assert [(m["role"], m["content"].strip()) for m in saved["messages"]] == [
        ("user", "What is 2+2?"),
        ("assistant", again.strip()),
    ]

    assert s.say("/load no-such-model", timeout=ANSWER_S).strip().endswith("Couldn't find model 'no-such-model'")
    assert s.say("/load mysaved", timeout=ANSWER_S).strip() == "Loading model 'mysaved'"
    assert any(m["name"].startswith("mysaved") for m in httpx.get(url + "/api/ps", timeout=10).json()["models"])
    assert s.ask("Hi").strip()

    helptext = s.say("/?")
    assert "Available Commands:" in helptext and "/bye" in helptext and '"""' in helptext
    assert "/set parameter" in s.say("/? set")
    assert s.say("/foo").strip() == "Unknown command '/foo'. Type /? for help"
    assert s.say("/show nonsense").strip() == "Unknown command '/show nonsense'. Type /? for help"
    assert s.say("/save").strip() == "Usage:\n  /save <modelname>"

    s.child.sendline("/bye")
    s.child.expect(pexpect.EOF, timeout=QUICK_S)
    s.child.close()
    assert s.child.exitstatus == 0


def test_verbose_prints_stats_after_each_answer_and_eof_exits(daemon, session):
    s = session("--verbose")
    s.say("/set parameter num_predict 4")
    out = s.ask("Hello")
    for label in ("total duration:", "load duration:", "prompt eval count:", "eval count:", "eval rate:"):
        assert label in out, out
    count = int(out.split("eval count:")[-1].split()[0])
    assert 1 <= count <= 4
    assert "eval rate" not in s.say("/set quiet")
    assert "eval rate:" not in s.ask("Hello")
    s.child.sendeof()  # Ctrl-D at the prompt ends the chat like /bye
    s.child.expect(pexpect.EOF, timeout=QUICK_S)
    s.child.close()
    assert s.child.exitstatus == 0


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows for `raw`, applying the REPL's one cursor move (left N, clear to end of line)."""
    lines = [""]
    for piece in re.split(r"(\x1b\[\d+D\x1b\[K|\n)", raw.replace("\r\n", "\n")):
        if piece == "\n":
            lines.append("")
        elif piece.startswith("\x1b["):
            lines[-1] = lines[-1][: -int(piece[2:].split("D")[0])]
        else:
            lines[-1] += piece
    return lines


def test_wordwrap_moves_words_to_the_next_line_and_nowordwrap_does_not(session):
    columns, question = 30, "Tell me about the ocean."
    flat = session("--nowordwrap", columns=columns)
    flat.say("/set parameter num_predict 24")
    flat.say("/set parameter temperature 0")
    text = flat.ask(question)
    assert "\x1b[" not in text and len(text.strip()) > columns  # long enough to need wrapping
    flat.say("/bye", prompt=pexpect.EOF)

    wrapped = session(columns=columns)
    wrapped.say("/set parameter num_predict 24")
    wrapped.say("/set parameter temperature 0")
    shown = _screen(wrapped.ask(question))
    assert all(len(line) < columns for line in shown), shown
    assert len([ln for ln in shown if ln.strip()]) > 1
    assert " ".join(shown).split() == text.split()  # same words, none cut in two


def test_format_json_and_keepalive_reach_the_daemon(daemon, session):
    env, url = daemon
    s = session("--format", "json", "--keepalive", "17m")
    s.say("/set parameter num_predict 8")
    assert s.ask("Give me a JSON object with a name.").lstrip().startswith("{")
    loaded = [m for m in httpx.get(url + "/api/ps", timeout=10).json()["models"] if m["name"] == MODEL]
    left = (_parse_time(loaded[0]["expires_at"]) - datetime.now(timezone.utc)).total_seconds()
    assert 15 * 60 < left <= 17 * 60  # not the 5 minute default
    assert s.say("/set noformat").strip() == "Disabled format."
    s.child.sendline('/set system """Line one.')
    s.child.expect_exact("... ", timeout=QUICK_S)
    assert s.say('Line two."""').strip() == "Set system message."
    assert s.say("/show system").strip() == "Line one.\nLine two."
    s.child.sendintr()  # Ctrl-C at the prompt does not end the chat
    s.child.expect_exact("Use Ctrl + d or /bye to exit.", timeout=QUICK_S)
    s.child.expect_exact(PROMPT, timeout=QUICK_S)
    s.say("/bye", prompt=pexpect.EOF)
