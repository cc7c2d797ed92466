"""The llama.cpp Python binding as an oracle, or a skip where it is not usable.

`pytest.importorskip` only catches ImportError; llama-cpp-python installed without its shared library raises
FileNotFoundError/OSError (or RuntimeError in some versions) at import, which must skip, not fail.
"""

from __future__ import annotations

import pytest


def llama_cpp_or_skip():
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError) as e:
        pytest.skip(f"llama-cpp-python is not usable here: {e}")
    return llama_cpp
