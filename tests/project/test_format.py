"""The code is as `ruff format` writes it at the project's 120 columns (pyproject.toml's [tool.ruff]; the dev extra
pins ruff's minor version, whose style is stable within it). Fix a failure with `python3 -m ruff format .`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _testpaths import REPO


def test_the_code_is_as_ruff_format_writes_it():
    pytest.importorskip("ruff", reason="ruff is not installed (the dev extra has it)")
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"run `python3 -m ruff format .`:\n{r.stdout}{r.stderr}"
