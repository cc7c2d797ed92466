"""Configuration from the environment: a mistyped LOCALRT_ (or OLLAMA_) value is one `Error:` line naming the
variable in every command; Ollama's variables are read where localrt's are unset; the refusals of a shared
daemon name LOCALRT_API_KEY."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _daemon_fakes import Lab, make_config
from typer.testing import CliRunner

from cli import app
from localrt import config as cfg
from localrt.runtime.service import Service
from localrt.serve.daemon import BackgroundServer, InsecureBind, check_bind, free_port
from _testpaths import REPO


def _clean_env(tmp_path: Path, **extra: str) -> dict:
    """For CliRunner: this machine's LOCALRT_ and OLLAMA_ variables removed (None), temporary directories."""
    gone = {k: None for k in os.environ if k.startswith(("LOCALRT_", "OLLAMA_"))}
    return {
        **gone,
        "LOCALRT_DATA": str(tmp_path / "data"),
        "LOCALRT_MODELS": str(tmp_path / "models"),
        "LOCALRT_HOST": f"127.0.0.1:{free_port()}",
        **extra,
    }


# ---- one line per mistake, in every command ---------------------------------------------------------------------

COMMANDS = [
    ["list"],
    ["ps"],
    ["run", "m", "hi"],
    ["show", "m"],
    ["rm", "m"],
    ["cp", "a", "b"],
    ["stop", "m"],
    ["pull", "m"],
    ["push", "m"],
    ["version"],
    ["serve"],
    ["serve", "--status"],
    ["serve", "--stop"],
    ["export", "m", "out"],
    ["import", "in"],
    ["verify"],
    ["prune"],
]
MISTAKES = [
    ({"LOCALRT_HOST": "127.0.0.1:99999"}, "Error: LOCALRT_HOST has an invalid port"),
    ({"LOCALRT_NUM_PARALLEL": "abc"}, "Error: LOCALRT_NUM_PARALLEL must be an integer, got 'abc'"),
    ({"OLLAMA_MAX_QUEUE": "0"}, "Error: OLLAMA_MAX_QUEUE must be at least 1, got 0"),  # named as the user set it
    ({"LOCALRT_KEEP_ALIVE": "5 minutes"}, "Error: LOCALRT_KEEP_ALIVE: invalid keep_alive duration"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
@pytest.mark.parametrize("env, line", MISTAKES, ids=lambda v: next(iter(v)) if isinstance(v, dict) else "")
def test_a_mistyped_variable_is_one_line_in_every_command(tmp_path, args, env, line):
    r = CliRunner().invoke(app, args, env=_clean_env(tmp_path, **env))
    assert r.exit_code == 1 and r.stderr.startswith(line) and r.stderr.count("\n") == 1, r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit)  # no traceback behind it


def test_a_mistyped_variable_is_one_line_for_the_real_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCALRT_", "OLLAMA_"))}
    env.update(LOCALRT_DATA=str(tmp_path / "d"), LOCALRT_NUM_PARALLEL="abc")
    r = subprocess.run(
        [sys.executable, "-m", "cli", "list"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and r.stderr == "Error: LOCALRT_NUM_PARALLEL must be an integer, got 'abc'\n"


@pytest.mark.parametrize(
    "env, words",
    [
        ({"LOCALRT_HOST": ":0"}, "LOCALRT_HOST has an invalid port"),
        ({"LOCALRT_NUM_PARALLEL": "-1"}, "LOCALRT_NUM_PARALLEL must be 0 (automatic) or a positive integer"),
        ({"LOCALRT_MAX_LOADED_MODELS": "-2"}, "LOCALRT_MAX_LOADED_MODELS must be 0 (automatic) or more"),
        ({"LOCALRT_NUM_THREADS": "two"}, "LOCALRT_NUM_THREADS must be an integer"),
        ({"OLLAMA_CONTEXT_LENGTH": "8k"}, "OLLAMA_CONTEXT_LENGTH must be an integer"),
        ({"OLLAMA_KEEP_ALIVE": "forever"}, "OLLAMA_KEEP_ALIVE: invalid keep_alive duration"),
    ],
)
def test_each_check_names_its_variable(env, words):
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(env)
    assert str(e.value).startswith(words)
    assert isinstance(e.value, ValueError)  # callers that caught ValueError still do


def test_serve_help_lists_every_variable_config_reads():
    """`serve --help` names every LOCALRT_ variable localrt/config.py reads (the registry's three were missing),
    the ones with an OLLAMA_ twin marked with *."""
    import ast
    import re

    tree = ast.parse(Path(cfg.__file__).read_text(encoding="utf-8"))
    read = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"LOCALRT_[A-Z_]+", n.value)
    }
    assert {"LOCALRT_REGISTRY", "LOCALRT_REGISTRY_TOKEN", "LOCALRT_REGISTRY_PUBLIC", "LOCALRT_DATA"} <= read
    r = CliRunner().invoke(app, ["serve", "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    listed = dict(re.findall(r"^\s*(LOCALRT_[A-Z_]+)(\*?) ", r.stdout, re.MULTILINE))  # one line per variable
    assert read - set(listed) == set(), r.stdout
    assert {k for k, star in listed.items() if star} == {f"LOCALRT_{x}" for x in cfg.OLLAMA_TWINS}


def test_keep_alive_reads_as_ollama_reads_it():
    assert cfg.load({"LOCALRT_KEEP_ALIVE": "300"}).keep_alive == "300"  # bare seconds, as OLLAMA_KEEP_ALIVE
    assert cfg.load({"LOCALRT_KEEP_ALIVE": "-1"}).keep_alive == "-1"  # forever
    assert cfg.load({"LOCALRT_KEEP_ALIVE": "1h30m"}).keep_alive == "1h30m"


# ---- Ollama's variables ------------------------------------------------------------------------------------------


def test_ollama_variables_are_read_where_localrt_ones_are_unset(tmp_path):
    ollama = {
        "OLLAMA_HOST": "0.0.0.0:8080",
        "OLLAMA_MODELS": str(tmp_path / "ollama-models"),
        "OLLAMA_KEEP_ALIVE": "10m",
        "OLLAMA_NUM_PARALLEL": "2",
        "OLLAMA_MAX_LOADED_MODELS": "1",
        "OLLAMA_MAX_QUEUE": "64",
        "OLLAMA_ORIGINS": "http://app.example, chrome-extension://*",
        "OLLAMA_CONTEXT_LENGTH": "8192",
    }
    c = cfg.load(ollama)
    assert (c.host, c.port, c.models_dir, c.keep_alive) == ("0.0.0.0", 8080, tmp_path / "ollama-models", "10m")
    assert (c.num_parallel, c.max_loaded_models, c.max_queue, c.context_length) == (2, 1, 64, 8192)
    assert c.origins == ("http://app.example", "chrome-extension://*")
    mine = cfg.load(
        {
            **ollama,
            "LOCALRT_HOST": "127.0.0.1:9000",
            "LOCALRT_NUM_PARALLEL": "3",
            "LOCALRT_MODELS": str(tmp_path / "mine"),
        }
    )
    assert (mine.port, mine.num_parallel, mine.models_dir) == (9000, 3, tmp_path / "mine")  # LOCALRT_ wins
    assert cfg.load({**ollama, "LOCALRT_HOST": ""}).port == 8080  # empty is unset, as Ollama reads its own


def test_the_command_reaches_the_daemon_that_ollama_host_names(tmp_path):
    service = Service(make_config(tmp_path / "models"), load_model=Lab().load_model)
    try:
        with BackgroundServer(service, service.config) as srv:
            env = {**_clean_env(tmp_path), "LOCALRT_HOST": None, "OLLAMA_HOST": f"127.0.0.1:{srv.config.port}"}
            r = CliRunner().invoke(app, ["list"], env=env)
            assert r.exit_code == 0 and r.stdout.startswith("NAME"), r.stderr
            st = CliRunner().invoke(app, ["serve", "--status"], env=env)
            assert f"127.0.0.1:{srv.config.port}" in st.stdout  # a server answers there (not this store's)
    finally:
        service.close()


# ---- sharing on the LAN --------------------------------------------------------------------------------------------


def test_the_refusals_of_a_shared_daemon_name_localrt_api_key(tmp_path):
    with pytest.raises(InsecureBind, match="LOCALRT_API_KEY"):
        check_bind(dataclasses.replace(cfg.load({}), host="0.0.0.0"))
    with pytest.raises(InsecureBind, match="LOCALRT_API_KEY"):  # OLLAMA_HOST=0.0.0.0 is refused the same way
        check_bind(cfg.load({"OLLAMA_HOST": "0.0.0.0"}))
    conf = dataclasses.replace(make_config(tmp_path / "models"), api_key="s3cret")
    service = Service(conf, load_model=Lab().load_model)
    try:
        with BackgroundServer(service, conf) as srv:
            for key in ("wrong", None):
                env = {**_clean_env(tmp_path), "LOCALRT_HOST": f"127.0.0.1:{srv.config.port}", "LOCALRT_API_KEY": key}
                r = CliRunner().invoke(app, ["list"], env=env)
                assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
                assert r.stderr.startswith("Error: unauthorized") and "LOCALRT_API_KEY" in r.stderr
            ok = CliRunner().invoke(app, ["list"], env={**env, "LOCALRT_API_KEY": "s3cret"})
            assert ok.exit_code == 0
    finally:
        service.close()
