"""`localrt run` with a prompt: the model made present first (as `ollama run` pulls), then one streamed answer."""
from __future__ import annotations

import sys

from .client import ApiError


def ensure_model(client, model: str) -> None:
    """As `ollama run` does, a model that is not in the store is pulled first, but only from where that works
    offline: a built-in model is created from its installed package, and other names are pulled only when they
    name their registry or LOCALRT_REGISTRY names a mirror. Otherwise "not found" stands: an air-gapped PC has no
    default registry to try."""
    from localrt import config
    from localrt.cli.progress import render_progress
    from localrt.models.library import is_builtin

    try:
        client.show(model)
        return
    except ApiError as e:
        if e.status != 404:
            raise
        first, _, rest = model.partition("/")
        if not (is_builtin(model) or config.load().registry or ("." in first or ":" in first) and rest):
            raise
    render_progress(client.pull(model))


def stream_generate(client, model: str, text: str, format, keepalive, wordwrap: bool = True, think=None,
                     hide: bool = False) -> dict | None:
    import shutil

    from localrt.cli.repl import WordWrap, _Plain
    from localrt.cli.spinner import Spinner
    from localrt.cli.thinking_view import ThinkingView

    # wrapping moves the cursor with escape codes: only on a terminal, never into a pipe or file
    tty = sys.stdout.isatty()
    out = WordWrap(sys.stdout, shutil.get_terminal_size((80, 20)).columns) if wordwrap and tty else _Plain(sys.stdout)
    view = ThinkingView(out, sys.stdout, hide=hide, tty=tty)
    done = None
    with Spinner() as spinner:  # until the first token
        for ev in client.generate(model, text, format=format, keep_alive=keepalive, think=think):
            piece, thinking = ev.get("response", ""), ev.get("thinking", "")
            if piece or thinking or ev.get("done"):
                spinner.stop()
            view.write(thinking, piece)
            if ev.get("done"):
                done = ev
    view.end()
    sys.stdout.write("\n")
    return done
