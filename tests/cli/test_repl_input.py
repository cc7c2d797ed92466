"""The chat as a new user meets it (issue 46 frictions): several pasted lines are one message (bracketed paste), and
`/?`, `/set`, `/set parameter` alone list what exists, as `ollama run` does."""

from __future__ import annotations

import os
import re
import sys

import pexpect
import pytest

from _daemon_fakes import Script, make_config
from localrt.api.options import resolve
from localrt.cli.repl import Repl
from localrt.cli.repl_help import PARAMETERS
from localrt.runtime.service import Service
from localrt.serve.daemon import BackgroundServer
from _testpaths import REPO

MODEL = "smollm2:135m"  # the built-in record (ChatML template); the loader is a script, so no weights are run
PROMPT = ">>> "
QUICK_S = 60  # the first request creates the built-in model from its installed package


@pytest.fixture
def scripted(tmp_path):
    """A real daemon whose models all answer "ok"; yields (env for `localrt run`, the script)."""
    script = Script(answer="ok")
    conf = make_config(tmp_path / "models", data_dir=tmp_path / "data")
    service = Service(conf, load_model=script.load)
    try:
        with BackgroundServer(service, conf):
            env = {
                k: v for k, v in os.environ.items() if not k.startswith("LOCALRT_") and k not in ("COLUMNS", "LINES")
            }
            env.update(
                LOCALRT_HOST=f"127.0.0.1:{conf.port}",
                LOCALRT_MODELS=str(conf.models_dir),
                LOCALRT_DATA=str(tmp_path / "data"),
                LOCALRT_API_KEY="",
                TERM="xterm",
            )
            yield env, script
    finally:
        service.close()


def test_pasted_lines_are_one_message(scripted):
    pytest.importorskip("readline")
    env, script = scripted
    child = pexpect.spawn(
        sys.executable,
        ["-m", "cli", "run", MODEL],
        cwd=str(REPO),
        env=env,
        encoding="utf-8",
        timeout=QUICK_S,
        dimensions=(40, 200),
    )
    try:
        child.expect_exact("\x1b[?2004h")  # the terminal is asked to mark pastes (CPython's readline does not)
        child.expect_exact(PROMPT)
        # a terminal sends a paste of two lines between the markers, then the user presses Enter once
        child.send("\x1b[200~line one\rline two\x1b[201~")
        child.send("\r")
        child.expect_exact(PROMPT)
        child.sendline("/bye")
        child.expect(pexpect.EOF, timeout=20)
    finally:
        child.close(force=True)
    turns = [p for p in script.prompts if "line" in p]
    assert len(turns) == 1, script.prompts  # one chat turn, not one per pasted line
    users = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", turns[0], re.S)
    assert users == ["line one\nline two"], turns[0]


def _said(capsys, line: str) -> str:
    Repl(client=None, model=MODEL).command(line)  # these commands never reach the daemon
    return capsys.readouterr().out


def test_help_and_set_alone_list_what_exists(capsys):
    helptext = _said(capsys, "/?")
    for cmd in ("/set", "/show", "/load", "/save", "/clear", "/bye", "/? shortcuts"):
        assert f"  {cmd}" in helptext, helptext
    assert _said(capsys, "/help") == helptext
    listed = _said(capsys, "/set")
    for what in (
        "parameter",
        "system",
        "format json",
        "noformat",
        "verbose",
        "quiet",
        "wordwrap",
        "nowordwrap",
        "think",
        "nothink",
    ):
        assert f"  /set {what} " in listed, listed
    assert _said(capsys, "/? set") == listed
    params = _said(capsys, "/set parameter")
    assert params.startswith("Available Parameters:")
    for name in (
        "seed",
        "num_predict",
        "top_k",
        "top_p",
        "min_p",
        "num_ctx",
        "temperature",
        "repeat_penalty",
        "repeat_last_n",
        "num_gpu",
        "stop",
    ):
        assert f"/set parameter {name} " in params, params
    assert "Ctrl + d" in _said(capsys, "/? shortcuts")
    assert "/show modelfile" in _said(capsys, "/show")


@pytest.mark.parametrize("name,arg,_what", PARAMETERS)
def test_every_listed_parameter_can_be_set(name, arg, _what):
    value = {"<int>": 1, "<float>": 0.5}.get(arg, ["a", "b"])
    got = getattr(resolve({name: value}), name)
    assert (list(got) if isinstance(got, tuple) else got) == value
