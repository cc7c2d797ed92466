"""The chat's input history is kept across sessions (issue 46 friction: up-arrow finds yesterday's questions), in the
data directory's `history` file, as `ollama run` keeps ~/.ollama/history."""

from __future__ import annotations

import pytest


def test_repl_history_is_kept_across_sessions(tmp_path):
    readline = pytest.importorskip("readline")
    from localrt.cli.repl import _line_editing

    history = tmp_path / "data" / "history"
    save = _line_editing(history)
    readline.clear_history()
    readline.add_history("Why is the sky blue?")
    save()
    readline.clear_history()
    _line_editing(history)  # the next session reads it back
    assert readline.get_history_item(readline.get_current_history_length()) == "Why is the sky blue?"
