"""`localrt run` with a prompt: the model made present first (as `ollama run` pulls), then one streamed answer."""

from __future__ import annotations

import sys

from .client import ApiError


def ensure_model(client, model: str) -> dict:
    """As `ollama run` does, a model that is not in the store is pulled first, but only from where that works
    offline: a built-in model is created from its installed package, and other names are pulled only when they
    name their registry or LOCALRT_REGISTRY names a mirror. Otherwise "not found" stands, with the offline ways to
    get a model: an air-gapped PC has no default registry to try."""
    from localrt import config
    from localrt.cli.progress import render_progress
    from localrt.models.library import is_builtin

    try:
        return client.show(model)
    except ApiError as e:
        if e.status != 404:
            raise
        first, _, rest = model.partition("/")
        if not (is_builtin(model) or config.load().registry or ("." in first or ":" in first) and rest):
            raise ApiError(404, f"{e.message}\n{offline_ways()}") from None
    render_progress(client.pull(model))
    return client.show(model)


def offline_ways() -> str:
    """What `run` of a missing model says when there is nowhere to pull it from."""
    from localrt.models.builtins import BUILTINS

    return (
        "Nothing to pull it from: no mirror is set (LOCALRT_REGISTRY). Offline, a model comes from\n"
        "  localrt import PATH               a bundle written by `localrt export`, or an Ollama models folder\n"
        "  localrt create NAME -f Modelfile  a Modelfile whose FROM is the path of a .gguf file\n"
        f"  localrt run {next(iter(BUILTINS)):<22}a built-in model: {', '.join(BUILTINS)}"
    )


def is_embedding_model(info: dict) -> bool:
    caps = info.get("capabilities") or []
    return "embedding" in caps and "completion" not in caps


def print_embedding(client, model: str, text: str, keepalive, truncate: bool | None, dimensions: int) -> None:
    """`ollama run` on an embedding model: the text's embedding as one JSON array on stdout."""
    import json

    if not text:
        raise ApiError(400, f'embedding models require input text. Usage: localrt run {model} "your text here"')
    body = {
        "model": model,
        "input": text,
        **({"keep_alive": keepalive} if keepalive is not None else {}),
        **({"truncate": truncate} if truncate is not None else {}),
        **({"dimensions": dimensions} if dimensions else {}),
    }
    reply = client.embed(body)
    if not reply.get("embeddings"):
        raise ApiError(500, "no embeddings returned")
    print(json.dumps(reply["embeddings"][0], separators=(",", ":")))  # as Go marshals it


def stream_generate(
    client, model: str, text: str, format, keepalive, wordwrap: bool = True, think=None, hide: bool = False
) -> dict | None:
    import shutil

    from localrt.cli.repl import WordWrap, _Plain
    from localrt.cli.spinner import Spinner, kernel_detail
    from localrt.cli.thinking_view import ThinkingView

    # wrapping moves the cursor with escape codes: only on a terminal, never into a pipe or file
    tty = sys.stdout.isatty()
    out = WordWrap(sys.stdout, shutil.get_terminal_size((80, 20)).columns) if wordwrap and tty else _Plain(sys.stdout)
    view = ThinkingView(out, sys.stdout, hide=hide, tty=tty)
    done = None
    with Spinner(detail=kernel_detail(client)) as spinner:  # until the first token
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
