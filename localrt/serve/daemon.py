"""Running the ASGI app on a real socket with uvicorn: in the foreground (`localrt serve`) or in a thread (tests)."""
from __future__ import annotations

import errno
import socket
import threading
import time

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..config import is_loopback
from .server import make_app


class BindError(RuntimeError):
    """The daemon's address cannot be listened on: in use, not this machine's, not resolvable, or refused."""


class InsecureBind(BindError):
    pass


def check_bind(config) -> None:
    """Refuse to listen beyond loopback without a bearer token: the API can read and delete every model."""
    if not is_loopback(config.host) and not config.api_key:
        raise InsecureBind(
            f"refusing to listen on {config.host}: set LOCALRT_API_KEY to require a bearer token on a non-loopback "
            "address"
        )


HEADER_TIMEOUT_S = 5.0  # a connection must send a whole request head within this, or it is closed


class _DeadlineH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol plus a deadline for the request head: a client that connects and trickles
    (or never sends) its headers is dropped, so stalled sockets cannot use up the connection limit (slowloris)."""

    _deadline = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._head_overdue)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def _head_overdue(self) -> None:
        self._deadline = None
        if self.cycle is None:
            self.transport.close()


def _uvicorn_config(app, config, sock_host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=sock_host, port=port, log_level="warning", access_log=False, http=_DeadlineH11,
        timeout_keep_alive=5, limit_concurrency=256, lifespan="off",
    )


def bind(config) -> socket.socket:
    """The listening socket, bound before anything says "listening"; BindError is one line for the user."""
    check_bind(config)
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise BindError(f"cannot listen on {config.base_url}: unknown host {config.host!r} ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart at once after a stop (TIME_WAIT)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        why = "the address is in use (is a daemon already running?)" if e.errno == errno.EADDRINUSE else e.strerror
        raise BindError(f"cannot listen on {config.base_url}: {why}") from None
    sock.set_inheritable(True)
    return sock


def serve_forever(service, config, sock: socket.socket) -> None:
    """Serve on `sock` (from bind()) until interrupted."""
    uvicorn.Server(_uvicorn_config(make_app(service, config), config, config.host, config.port)).run(sockets=[sock])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """A real daemon on a real socket, in a thread. Used by tests and benchmarks."""

    def __init__(self, service, config):
        check_bind(config)
        self.config = config
        self.server = uvicorn.Server(_uvicorn_config(make_app(service, config), config, config.host, config.port))
        self.thread = threading.Thread(target=self.server.run, name="localrt-daemon", daemon=True)

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("daemon did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def url(self) -> str:
        return self.config.base_url
