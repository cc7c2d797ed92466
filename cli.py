"""The `localrt` command. Every command but `serve` talks to the daemon through localrt.client."""
from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run large language models locally.")


@app.command()
def version() -> None:
    """Print the localrt version."""
    from importlib.metadata import version as _v

    typer.echo(f"localrt version is {_v('localrt')}")


if __name__ == "__main__":
    app()
