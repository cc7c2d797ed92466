"""The `localrt` command. Every command but `serve` talks to the daemon through localrt.cli.client."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
import typer.core

from localrt.cli import store_cmd


class _Group(typer.core.TyperGroup):
    """Errors any command can meet (a mistyped LOCALRT_ variable, a daemon command that failed), mapped to one
    `Error:` line here, once, rather than in every command."""

    def invoke(self, ctx):
        from localrt.cli.daemon_cmd import CommandFailed
        from localrt.config import ConfigError

        try:
            return super().invoke(ctx)
        except (ConfigError, CommandFailed) as e:
            typer.echo(f"Error: {e}", err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    help="Run large language models locally.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _client():
    from localrt.cli.client import Client

    return Client()


def _fail(msg: str, code: int = 1) -> None:
    typer.echo(f"Error: {msg}", err=True)
    raise typer.Exit(code)


def _guard(fn):
    """Turn client errors into one line on stderr and an exit code."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        from localrt.cli.client import ApiError, DaemonGone, DaemonUnreachable
        from localrt.cli.daemon_cmd import live_log

        try:
            return fn(*a, **kw)
        except ApiError as e:
            _fail(e.message)
        except DaemonGone as e:
            from localrt import config

            _fail(f"{e}; see the daemon's log: {live_log(config.load())}")
        except DaemonUnreachable as e:
            _fail(f"{e}\nIs the daemon running? Start it with: localrt serve")
        except KeyboardInterrupt:
            raise typer.Exit(130)

    return wrapper


def _rotate_log(path: Path) -> None:
    from localrt.cli.daemon_cmd import rotate_log

    rotate_log(path)


def _serve_command() -> list[str]:
    from localrt.cli.daemon_cmd import serve_command

    return serve_command()


def ensure_daemon(client) -> None:
    """Start a daemon in the background when none answers, as `ollama run` expects one to be there."""
    from localrt import config
    from localrt.cli.daemon_cmd import ensure_daemon as _ensure

    _ensure(client, config.load())


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version as _v

        typer.echo(f"localrt version is {_v('localrt')}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", "-v", callback=_version_callback, is_eager=True, help="Show the version and exit"
    ),
) -> None:
    """Run large language models locally."""


@app.command()
def kit(
    dest: Path = typer.Argument(..., help="Folder to fill (created)"),
    platform: Optional[str] = typer.Option(
        None,
        "--platform",
        help="pip platform tag of the offline PC, e.g. win_amd64 or manylinux2014_x86_64 (default: this machine's)",
    ),
    python_version: Optional[str] = typer.Option(None, "--python-version", help="its Python, e.g. 3.11"),
) -> None:
    """Make an offline kit on a connected machine: wheels for localrt, its dependencies and the built-in models,
    and install scripts, for an air-gapped PC (sh DEST/install.sh, or DEST\\install.bat on Windows)."""
    from localrt.distribution.kit import KitError, make_kit

    typer.echo(f"building the kit in {dest} (pip resolves and downloads; a few minutes) ...", err=True)
    try:
        wheel = make_kit(dest, platform=platform, python_version=python_version)
    except KitError as e:
        _fail(str(e))
    size = sum(p.stat().st_size for p in (dest / "wheels").iterdir()) / 1e6
    typer.echo(
        f"kit ready: {dest} ({wheel.name} and {len(list((dest / 'wheels').iterdir())) - 1} more wheels, "
        f"{size:.0f} MB); install offline with: sh {dest / 'install.sh'}"
    )


@app.command("help")
def help_command(ctx: typer.Context, command: Optional[str] = typer.Argument(None)) -> None:
    """Show help: the commands, or one command's options."""
    root = ctx.find_root()
    group = root.command
    sub = group.get_command(root, command) if command else None
    if command and sub is None:
        _fail(f"unknown command {command!r}")
    target = sub or group
    with typer.Context(target, info_name=command or root.info_name, parent=root if sub else None) as sub_ctx:
        typer.echo(target.get_help(sub_ctx))


@app.command()
def serve(
    status: bool = typer.Option(
        False,
        "--status",
        help="Tell whether this data directory's daemon runs: its pid, "
        "address, log and version (exit status 1 when it does not)",
    ),
    stop_daemon: bool = typer.Option(
        False,
        "--stop",
        help="Stop this data directory's daemon on LOCALRT_HOST's port (running replies end with an error)",
    ),
) -> None:
    """Start the daemon (LOCALRT_HOST, default 127.0.0.1:11434); one per port and data directory.

    Environment (* also read from its OLLAMA_ twin where unset; defaults in parentheses):
    LOCALRT_HOST* where it listens and commands find it (127.0.0.1:11434)
    LOCALRT_MODELS* the model store (LOCALRT_DATA/models)
    LOCALRT_KEEP_ALIVE* how long an idle model stays loaded (5m)
    LOCALRT_NUM_PARALLEL* requests one model runs together (0: automatic)
    LOCALRT_MAX_LOADED_MODELS* models loaded at once (3)
    LOCALRT_MAX_QUEUE* waiting requests before 503 (512)
    LOCALRT_ORIGINS* extra allowed browser origins, comma-separated
    LOCALRT_CONTEXT_LENGTH* default context length (0: per model)
    LOCALRT_DATA data directory: store, logs, daemon lock, history (the user data dir)
    LOCALRT_MODELS_READONLY extra read-only stores, os.pathsep-separated
    LOCALRT_API_KEY bearer token every request must carry; needed to listen beyond loopback
    LOCALRT_KV_BUDGET KV pool per model, positions or a size such as 2GiB (0: automatic)
    LOCALRT_PREFIX_CACHE whose cached prompt prefixes a request reuses: client or shared (client)
    LOCALRT_NUM_THREADS CPU threads (0: all cores)
    LOCALRT_REGISTRY registry (URL or host) or folder that short model names are pulled from
    LOCALRT_REGISTRY_TOKEN bearer token sent to registries on pull and push
    LOCALRT_REGISTRY_PUBLIC true: this store's /v2/ registry serves pulls without the API key, also on the LAN (false)
    """
    from localrt import config
    from localrt.cli import daemon_cmd

    if status and stop_daemon:
        _fail("--status and --stop cannot be used together")
    cfg = config.load()
    if status:
        raise typer.Exit(daemon_cmd.status(cfg))
    if stop_daemon:
        return daemon_cmd.stop(cfg)
    daemon_cmd.serve(cfg)


@app.command()
@_guard
def run(
    model: str,
    prompt: Optional[List[str]] = typer.Argument(None),
    verbose: bool = typer.Option(False, "--verbose", help="Show timings for the response"),
    format: Optional[str] = typer.Option(None, "--format", help="Response format (json)"),
    keepalive: Optional[str] = typer.Option(None, "--keepalive", help="How long to keep the model loaded"),
    nowordwrap: bool = typer.Option(False, "--nowordwrap", help="Don't wrap words to the next line"),
    think: Optional[str] = typer.Option(
        None, "--think", help="Let a thinking model think: --think, --think=low|medium|high, --think=false"
    ),
    hidethinking: bool = typer.Option(False, "--hidethinking", help="Don't show the reasoning of a thinking model"),
    truncate: Optional[bool] = typer.Option(
        None, "--truncate/--no-truncate", help="Embedding models: cut input to fit"
    ),
    dimensions: int = typer.Option(0, "--dimensions", help="Embedding models: truncate the embedding to this size"),
) -> None:
    """Run a model: one answer for a prompt (or stdin), else an interactive chat; an embedding model prints the
    embedding of the text."""
    from localrt.cli.run_once import ensure_model, is_embedding_model, print_embedding, stream_generate

    client = _client()
    ensure_daemon(client)
    info = ensure_model(client, model)  # a clear "not found" (or the pull that fixes it) before anything streams
    if format not in (None, "json"):
        _fail('invalid format: only "json" is supported')
    think_value = _think_value(think)
    text = " ".join(prompt or [])
    if not sys.stdin.isatty():
        piped = sys.stdin.read()
        text = f"{piped}\n{text}".strip() if text else piped
    if is_embedding_model(info):
        return print_embedding(client, model, text, keepalive, truncate, dimensions)
    if text:
        done = stream_generate(
            client, model, text, format, keepalive, wordwrap=not nowordwrap, think=think_value, hide=hidethinking
        )
        if verbose and done:
            from localrt.cli.cli_format import verbose_stats

            typer.echo(verbose_stats(done), err=True)
        return
    from localrt.cli.repl import Repl

    Repl(
        client,
        model,
        verbose=verbose,
        format=format,
        keepalive=keepalive,
        wordwrap=not nowordwrap,
        think=think_value,
        hidethinking=hidethinking,
    ).loop()


def _think_value(raw: str | None) -> bool | str | None:
    """--think's value as the API's `think`: true, false or a level; None when not given."""
    if raw is None:
        return None
    value = {"true": True, "false": False}.get(raw.lower(), raw.lower())
    if value not in (True, False, "low", "medium", "high"):
        _fail(f"invalid value for --think: {raw!r} (true, false, low, medium or high)")
    return value


@app.command("list")
@_guard
def list_models(prefix: Optional[str] = typer.Argument(None)) -> None:
    """List models."""
    from localrt.cli.cli_format import ago, human_bytes, table

    rows = [
        [m["name"], m["digest"][:12], human_bytes(m["size"]), ago(m["modified_at"])]
        for m in _client().list()
        if not prefix or m["name"].startswith(prefix)
    ]
    typer.echo(table(["NAME", "ID", "SIZE", "MODIFIED"], rows))


app.command("ls", help="List models.")(list_models)


@app.command()
@_guard
def ps() -> None:
    """List running models."""
    from localrt.cli.cli_format import human_bytes, processor, table, until

    rows = [
        [
            m["name"],
            m["digest"][:12],
            human_bytes(m["size"]),
            processor(m["size"], m.get("size_vram", 0)),
            str(m.get("context_length", "")),
            f"{m['slots_in_use']}/{m['slots']}" if "slots" in m else "",
            until(m["expires_at"]),
        ]
        for m in _client().ps()
    ]
    typer.echo(table(["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "SLOTS", "UNTIL"], rows))


@app.command()
@_guard
def show(
    model: str,
    modelfile: bool = typer.Option(False, "--modelfile"),
    parameters: bool = typer.Option(False, "--parameters"),
    template: bool = typer.Option(False, "--template"),
    system: bool = typer.Option(False, "--system"),
    license: bool = typer.Option(False, "--license"),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show the model's metadata too"),
    full: bool = typer.Option(False, "--full", help="With -v: print whole metadata arrays (tokens, merges)"),
) -> None:
    """Show information for a model."""
    picked = [
        k
        for k, v in dict(
            modelfile=modelfile, parameters=parameters, template=template, system=system, license=license
        ).items()
        if v
    ]
    if len(picked) > 1:
        _fail("only one of --license, --modelfile, --parameters, --system, or --template can be specified")
    info = _client().show(model, verbose=verbose)
    if picked:
        typer.echo(info.get(picked[0]) or "")
        return
    from localrt.cli.repl import describe

    typer.echo(describe(info, verbose, full))


@app.command()
@_guard
def rm(models: List[str]) -> None:
    """Remove models."""
    client = _client()
    for m in models:
        try:
            list(client.generate(m, "", stream=False, keep_alive=0))
        except Exception:  # noqa: BLE001 - unloading is best effort; the delete below reports real errors
            pass
        client.delete(m)
        typer.echo(f"deleted '{m}'")


@app.command()
@_guard
def cp(source: str, destination: str) -> None:
    """Copy a model."""
    _client().copy(source, destination)
    typer.echo(f"copied '{source}' to '{destination}'")


@app.command()
@_guard
def stop(model: str) -> None:
    """Stop (unload) a running model."""
    client = _client()
    client.show(model)
    list(client.generate(model, "", stream=False, keep_alive=0))


@app.command()
@_guard
def create(
    model: str,
    file: Path = typer.Option(Path("Modelfile"), "-f", "--file", help="Name of the Modelfile"),
    quantize: Optional[str] = typer.Option(None, "-q", "--quantize", help="Quantize model to this level"),
) -> None:
    """Create a model from a Modelfile."""
    from localrt.cli.create_cmd import AdapterMissing, create_body
    from localrt.cli.progress import ProgressView
    from modelfile import ModelfileError

    if not file.is_file():
        _fail(f"no Modelfile at {file}")
    client = _client()
    try:
        with ProgressView() as view:  # the uploads' bars, then the daemon's statuses and bars, in order
            body = create_body(client, model, file, quantize, view)
            for ev in client.create(body):
                view.event(ev)
    except ModelfileError as e:
        _fail(f"{file} {e}")  # the message carries the line: "Modelfile (line 2): unknown parameter ..."
    except AdapterMissing as e:
        _fail(str(e))


@app.command()
@_guard
def pull(model: str, insecure: bool = typer.Option(False, "--insecure")) -> None:
    """Pull a model from a registry or mirror, or from a local folder / bundle / file:// path."""
    from localrt.cli.progress import render_progress

    local = Path(os.path.expanduser(model.split("#", 1)[0]))
    if "://" not in model and local.exists():
        # the daemon resolves paths against its own working directory: send an absolute one
        model = str(local.resolve()) + (("#" + model.split("#", 1)[1]) if "#" in model else "")
    render_progress(_client().pull(model, insecure=insecure))


@app.command()
@_guard
def push(model: str, insecure: bool = typer.Option(False, "--insecure")) -> None:
    """Push a model to a registry or mirror."""
    from localrt.cli.progress import render_progress

    render_progress(_client().push(model, insecure=insecure))


@app.command()
def version() -> None:
    """Print the daemon's and the client's version."""
    from importlib.metadata import version as _v

    from localrt.cli.client import DaemonUnreachable

    mine = _v("localrt")
    try:
        server = _client().version()
        typer.echo(f"localrt daemon speaks Ollama API {server}")
    except DaemonUnreachable:
        typer.echo("Warning: could not connect to a running localrt daemon")
    typer.echo(f"localrt version is {mine}")


# The store's own commands (localrt.cli.store_cmd), which need no daemon.
app.command("export")(store_cmd.export_model)
app.command("import")(store_cmd.import_model)
app.command()(store_cmd.verify)
app.command()(store_cmd.prune)


def _bare_think(args: list[str]) -> list[str]:
    """`--think` alone is `--think=true`, as in ollama (an option whose value is optional, which typer lacks)."""
    return ["--think=true" if a == "--think" else a for a in args]


def entry() -> None:
    """The `localrt` command."""
    app(args=_bare_think(sys.argv[1:]), prog_name="localrt")


if __name__ == "__main__":
    entry()
