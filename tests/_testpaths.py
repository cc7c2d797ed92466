"""Where things are, for tests in any folder under tests/: the tests' root (helpers, conftest.py, data/, fixtures/)
and the repository's.

    from _testpaths import DATA, REPO   # pytest puts tests/ on sys.path (conftest.py's folder)
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
FIXTURES = TESTS / "fixtures"
