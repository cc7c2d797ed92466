"""The daemon's life from the terminal: `localrt serve` (one per port and data directory), `serve --status`,
`serve --stop`, and the background start by `run` when no daemon answers (as `ollama run` expects one).

Which daemon is "this store's" is decided by localrt.serve.lockfile: the lock of LOCALRT_HOST's port in the
LOCALRT_DATA directory, and the record (pid, address, log, version) its holder wrote. Failures are
CommandFailed, printed as one `Error:` line by cli.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import typer

from ..serve import lockfile

START_LOCK_WAIT_S = 90.0  # another client starting the daemon holds the start lock at most until its child claims
CLAIM_DEADLINE_S = 60.0  # a started child must have taken the daemon lock by then (Python start-up, imports)
ANSWER_DEADLINE_S = 120.0  # and answer HTTP by then (the daemon imports the engine and opens the store first)
# `serve --stop` waits this long for the daemon to be gone: the grace of running replies (daemon.STOP_GRACE_S),
# the release of the loaded models (Scheduler.stop waits up to 10 s for their workers) and a margin
STOP_DEADLINE_S = 30.0
UNNAMED_LOG = "its stderr (a terminal or a pipe)"


class CommandFailed(Exception):
    """A daemon command failed; the message is the one line the user sees."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("localrt")
    except PackageNotFoundError:  # a source tree that was never installed
        from localrt import __version__

        return __version__


# ---- the log --------------------------------------------------------------------------------------------------


def log_path(cfg) -> Path:
    """Where a daemon started in the background writes: one file per data directory."""
    return Path(cfg.data_dir) / "logs" / "server.log"


def live_log(cfg) -> Path | str:
    """The log of the daemon that runs now, as its record says, else where a background start would write."""
    info = lockfile.running(cfg)
    return info.log if info is not None and info.log else log_path(cfg)


def rotate_log(path: Path) -> None:
    """A fresh server.log per daemon start; the previous one is kept as server-1.log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        os.replace(path, path.with_name("server-1.log"))


def log_tail(path: Path | str, n: int = 12) -> str:
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("  " + ln for ln in lines[-n:]) or "  (the log is empty)"


def _own_log(cfg) -> str | None:
    """The file this process's stderr goes to, for the record: server.log when a client started it, a file the
    user redirected to (where the OS tells), or None for a terminal or a pipe."""
    try:
        fd = sys.stderr.fileno()
        st = os.fstat(fd)
    except (OSError, ValueError, AttributeError):  # no real stderr (an embedding, a test runner)
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    default = log_path(cfg)
    try:
        if os.path.samestat(st, os.stat(default)):
            return str(default)
    except OSError:
        pass
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")  # Linux; elsewhere the log stays unnamed
    except OSError:
        return None
    return target if os.path.isabs(target) else None


# ---- serve ----------------------------------------------------------------------------------------------------


def serve(cfg) -> None:
    """Run the daemon in the foreground until stopped; refuse at once when this store's daemon already runs."""
    import logging

    from localrt.serve.malloc import limit_arenas

    limit_arenas()  # before the daemon starts its threads (localrt.serve.malloc)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    claim = _claim(cfg)
    try:
        _serve_claimed(cfg)
    finally:
        claim.release()


def _claim(cfg) -> lockfile.Claim:
    try:
        return lockfile.claim(cfg, _own_log(cfg), _version())
    except lockfile.AlreadyRunning as e:
        raise CommandFailed(f"{e}; log: {e.info.log or UNNAMED_LOG}; stop it with: localrt serve --stop") from None
    except lockfile.LockError as e:
        raise CommandFailed(f"cannot start: {e}") from None


def _serve_claimed(cfg) -> None:
    from localrt.serve.daemon import BindError, bind, serve_forever

    try:
        sock = bind(cfg)
    except BindError as e:
        raise CommandFailed(str(e)) from None
    from localrt.runtime.service import Service

    try:
        service = Service(cfg)
    except Exception as e:  # noqa: BLE001 - a start-up failure is one line for the user
        sock.close()
        raise CommandFailed(f"could not start: {e}") from None
    from localrt.engine.loader import warm_up

    warm_up()  # Numba's start-up on a background thread while the daemon waits for its first request
    typer.echo(f"localrt listening on {cfg.base_url} (pid {os.getpid()})", err=True)
    try:
        serve_forever(service, cfg, sock)
    finally:
        service.close()
    typer.echo("localrt stopped", err=True)


# ---- status and stop ------------------------------------------------------------------------------------------


def _answers(cfg) -> bool:
    from .client import Client

    client = Client(cfg.base_url)
    try:
        return client.is_running()
    finally:
        client.close()


def _not_ours(cfg) -> str:
    return (
        f"no localrt daemon of this data directory ({cfg.data_dir}) runs on port {cfg.port}, but a server "
        f"answers on {cfg.base_url}: one started with another LOCALRT_DATA, or another program"
    )


def status(cfg) -> int:
    """Print whether this store's daemon runs, with its pid, address, log and version. The exit status: 0 when
    it runs, 1 when not (as `systemctl is-active` for scripts)."""
    info = lockfile.running(cfg)
    if info is None:
        typer.echo(
            f"localrt is not running ({_not_ours(cfg)})"
            if _answers(cfg)
            else f"localrt is not running on {cfg.base_url}"
        )
        return 1
    typer.echo("localrt is running" if _answers(cfg) else "localrt is starting (it does not answer yet)")
    rows = [
        ("pid", str(info.pid or "unknown yet")),
        ("address", info.url),
        ("log", info.log or UNNAMED_LOG),
        ("version", info.version),
        ("data", str(cfg.data_dir)),
    ]
    for key, value in rows:
        typer.echo(f"{key + ':':<9}{value}")
    return 0


def stop(cfg) -> None:
    """Stop this store's daemon as Ctrl-C would, and wait until it is gone. Not running is not an error."""
    info = lockfile.running(cfg)
    if info is None:
        if _answers(cfg):
            raise CommandFailed(_not_ours(cfg))
        typer.echo(f"localrt is not running on {cfg.base_url}")
        return
    if not info.pid:
        raise CommandFailed("the daemon is starting and has not written its pid yet; try again in a moment")
    typer.echo(f"stopping localrt (pid {info.pid}) on {info.url}", err=True)
    _terminate(info.pid)
    deadline = time.monotonic() + STOP_DEADLINE_S
    while (now := lockfile.running(cfg)) is not None and now.pid == info.pid:
        if time.monotonic() > deadline:
            raise CommandFailed(
                f"the daemon (pid {info.pid}) did not stop within {STOP_DEADLINE_S:.0f} s; "
                f"see its log: {info.log or UNNAMED_LOG}"
            )
        time.sleep(0.1)
    typer.echo("stopped")


def _terminate(pid: int) -> None:
    """SIGTERM: the daemon stops listening, fails waiting requests, ends running replies, releases the models.
    On Windows os.kill can only terminate the process outright (TerminateProcess): not graceful, but it stops."""
    import signal

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # it ended between the look and the signal
    except PermissionError:
        raise CommandFailed(f"not allowed to stop pid {pid}: the daemon runs as another user") from None


# ---- the background start by `run` ----------------------------------------------------------------------------


def serve_command() -> list[str]:
    """`localrt serve`, through the console script of this same install (so ps shows `localrt serve`)."""
    import shutil

    exe = shutil.which("localrt", path=str(Path(sys.executable).parent)) or shutil.which("localrt")
    return [exe, "serve"] if exe else [sys.executable, "-m", "localrt", "serve"]


def ensure_daemon(client, cfg) -> None:
    """Start a daemon in the background when none answers, or wait for this store's daemon that is starting.

    Two clients at once start one daemon: the start lock makes the second wait for the first's child to claim
    the port, and then wait for that daemon. Only a client that starts a daemon rotates server.log, so a live
    daemon's log is never moved away under it."""
    if client.is_running():
        return
    with lockfile.starting(cfg, START_LOCK_WAIT_S):
        if client.is_running():  # the client we waited for has started it
            return
        info = lockfile.running(cfg)
        child = None
        if info is None:
            child = _spawn(cfg, client.base_url)
            info = _wait_claimed(cfg, client, child)
    if info is None:
        return  # answering already
    if child is None:
        typer.echo(
            f"localrt: waiting for the daemon (pid {info.pid}) to start (log: {info.log or UNNAMED_LOG})", err=True
        )
    _wait_answer(cfg, client, child, info)


def _spawn(cfg, url: str) -> subprocess.Popen:
    path = log_path(cfg)
    rotate_log(path)
    typer.echo(f"localrt: starting the daemon on {url} (log: {path}; stop it with: localrt serve --stop)", err=True)
    with open(path, "ab") as log:
        return subprocess.Popen(
            serve_command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )


def _wait_claimed(cfg, client, child) -> lockfile.DaemonInfo | None:
    """The record of the daemon that holds the port once our child has claimed it (or lost it to a `serve`
    started by hand at the same moment); None when one already answers."""
    deadline = time.monotonic() + CLAIM_DEADLINE_S
    while True:
        info = lockfile.recorded(cfg)
        if info is not None and info.pid == child.pid:
            return info
        if child.poll() is not None:
            return _after_child_exit(cfg, client, child)
        if time.monotonic() > deadline:
            raise CommandFailed(f"the daemon did not start within {CLAIM_DEADLINE_S:.0f} s; see {log_path(cfg)}")
        time.sleep(0.05)


def _after_child_exit(cfg, client, child) -> lockfile.DaemonInfo | None:
    """Our child exited: fine when another daemon of this store holds the port or one answers; else its log."""
    info = lockfile.running(cfg)
    if info is not None or client.is_running():
        return info
    path = log_path(cfg)
    raise CommandFailed(
        f"the daemon exited (status {child.returncode}) while starting. The end of {path}:\n{log_tail(path)}"
    )


def _wait_answer(cfg, client, child, info: lockfile.DaemonInfo) -> None:
    from .spinner import Spinner

    deadline = time.monotonic() + ANSWER_DEADLINE_S
    next_look = time.monotonic() + 1.0
    with Spinner():
        while not client.is_running():
            if child is not None and child.poll() is not None:
                info = _after_child_exit(cfg, client, child) or info  # another daemon took the port: wait for it
                child = None
            if time.monotonic() > next_look:  # a daemon that has died gives its lock back: no need to wait on
                next_look = time.monotonic() + 1.0
                if child is None and lockfile.running(cfg) is None and not client.is_running():
                    log = info.log or log_path(cfg)
                    raise CommandFailed(
                        f"the daemon (pid {info.pid}) exited while starting. The end of {log}:\n{log_tail(log)}"
                    )
            if time.monotonic() > deadline:
                raise CommandFailed(
                    f"the daemon did not answer within {ANSWER_DEADLINE_S:.0f} s; see {info.log or log_path(cfg)}"
                )
            time.sleep(0.1)
