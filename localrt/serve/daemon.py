"""Running the ASGI app on a real socket with uvicorn: in the foreground (`localrt serve`) or in a thread (tests)."""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import threading
import time
from collections.abc import Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..config import is_loopback
from .server import make_app
from .stopping import StopReplies


class BindError(RuntimeError):
    """The daemon's address cannot be listened on: in use, not this machine's, not resolvable, or refused."""


class InsecureBind(BindError):
    pass


def check_bind(config) -> None:
    """Refuse to listen beyond loopback without a bearer token: the API can read and delete every model."""
    if not is_loopback(config.host) and not config.api_key:
        raise InsecureBind(
            f"refusing to listen on {config.host}: set LOCALRT_API_KEY to require a bearer token on a non-loopback "
            "address (clients send it as Authorization: Bearer <key>)"
        )


HEADER_TIMEOUT_S = 5.0  # a connection must send a whole request head within this, or it is closed
BODY_GRACE_S = 10.0  # a request body may take this long (reading time) before its rate is checked
BODY_MIN_RATE = 4096  # bytes/s a body must average after the grace: a GB upload is fine at far less than a LAN
WATCH_TICK_S = 0.5  # how often each connection's deadlines are looked at
LIMIT_CONCURRENCY = 256  # requests being served (uvicorn's 503 "Exceeded concurrency limit")
MAX_CONNECTIONS = 512  # open sockets of all kinds; beyond this the slowest waiting ones are closed
SHED_MIN_AGE_S = 0.5  # a connection this young is never shed: it has not had the time to send anything
# On a stop, replies still running this long after it (a generation, a pull) are cut, each ending with an error
# that says why (stopping.StopReplies): a stop must end soon, whatever a client is doing. Ollama cuts at once;
# a few seconds let a reply that is about to end, end.
STOP_GRACE_S = 5.0


class _DeadlineH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol plus deadlines for the phases where the server waits on the client (slowloris):
    the request head must arrive within HEADER_TIMEOUT_S (also on a kept-alive connection), and a request body
    must average BODY_MIN_RATE bytes/s once BODY_GRACE_S of reading time has passed (time the server itself
    paused reading, because the route has not consumed what came, does not count).

    Connections waiting on their client do not count toward the concurrency limit: a few hundred sockets that
    sent a head and one body byte cannot make every other request answer 503. Past MAX_CONNECTIONS, a new
    connection closes the slowest waiting ones, so they cannot use up the sockets either."""

    _phase = "head"  # head (waiting for a request head), body (reading a request body), app (serving)
    _since = 0.0  # when the phase began
    _bytes = 0  # bytes received on this connection
    _phase_bytes = 0  # bytes received when the phase began
    _active = 0.0  # seconds of the body phase while reading was not paused
    _last = 0.0
    _watch = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._since = self._last = time.monotonic()
        self._watch = self.loop.call_later(WATCH_TICK_S, self._check)
        if len(self.connections) > MAX_CONNECTIONS:
            self._shed()

    def data_received(self, data: bytes) -> None:
        self._bytes += len(data)
        super().data_received(data)

    def handle_events(self) -> None:
        base = LIMIT_CONCURRENCY
        if len(self.connections) >= base or len(self.tasks) >= base:
            # only requests being served count; connections waiting on their client are the deadlines' business
            self.limit_concurrency = base + sum(1 for c in self.connections if c is not self and _waiting(c))
        else:
            self.limit_concurrency = base
        super().handle_events()

    def connection_lost(self, exc) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def _enter(self, phase: str, now: float) -> None:
        self._phase, self._since, self._phase_bytes, self._active, self._last = phase, now, self._bytes, 0.0, now

    def _check(self) -> None:
        self._watch = None
        if self.transport.is_closing():
            return
        now = time.monotonic()
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._phase != "head":
                self._enter("head", now)
            elif now - self._since > HEADER_TIMEOUT_S:
                return self.transport.close()
        elif state is h11.SEND_BODY:
            if self._phase != "body":
                self._enter("body", now)
            if not self.flow.read_paused:
                self._active += now - self._last
            self._last = now
            if self._active > BODY_GRACE_S and self._bytes - self._phase_bytes < BODY_MIN_RATE * self._active:
                return self.transport.close()  # the route sees a disconnect (499)
        else:
            self._phase = "app"
        self._watch = self.loop.call_later(WATCH_TICK_S, self._check)

    def _rate(self, now: float) -> float:
        return (self._bytes - self._phase_bytes) / max(now - self._since, 1e-3)

    def _shed(self) -> None:
        now = time.monotonic()
        victims = [
            c
            for c in self.connections
            if c is not self and _waiting(c) and now - c._since >= SHED_MIN_AGE_S and not c.transport.is_closing()
        ]
        victims.sort(key=lambda c: c._rate(now))
        for c in victims[: len(self.connections) - MAX_CONNECTIONS]:
            c.transport.close()


def _waiting(c) -> bool:
    """The connection waits on its client: for a request head (idle keep-alive included) or for body bytes."""
    return isinstance(c, _DeadlineH11) and c.conn.their_state in (h11.IDLE, h11.SEND_BODY)


def _uvicorn_config(app, config) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        http=_DeadlineH11,
        timeout_keep_alive=5,
        limit_concurrency=LIMIT_CONCURRENCY,
        lifespan="off",
        timeout_graceful_shutdown=STOP_GRACE_S,
    )


class StoppableServer(uvicorn.Server):
    """uvicorn's server whose stop (SIGTERM from `localrt serve --stop`, Ctrl-C) also stops the service at once:
    waiting requests fail with 503 "the server is shutting down", running ones get STOP_GRACE_S, then end with
    that error (stopping.StopReplies). uvicorn alone would wait for every open reply, so one long generation
    could hold the stop for minutes. `on_stop` runs once, on its own thread, as soon as the stop is asked for.

    A stop is a clean exit: uvicorn re-raises the signal it stopped on once it is done, which would kill the
    process before `localrt serve` removes its record and releases the models; here it is dropped instead."""

    def __init__(self, app, config, on_stop: Callable[[], None] | None = None):
        self.replies = StopReplies(app)
        super().__init__(_uvicorn_config(self.replies, config))
        self._on_stop = on_stop
        self._stopping = threading.Lock()

    def handle_exit(self, sig, frame) -> None:
        self.replies.stopping = True  # before uvicorn's shutdown can cut anything
        super().handle_exit(sig, frame)
        if self._on_stop is not None and self._stopping.acquire(blocking=False):
            threading.Thread(target=self._on_stop, name="localrt-stop", daemon=True).start()

    def stop(self) -> None:
        """Stop as a SIGTERM would (for callers on another thread: tests, embedding)."""
        self.handle_exit(signal.SIGTERM, None)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            try:
                yield
            finally:
                getattr(self, "_captured_signals", []).clear()  # uvicorn >= 0.29 keeps them to re-raise


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
    """Serve on `sock` (from bind()) until stopped (SIGTERM, Ctrl-C); the service is stopped with it."""
    StoppableServer(make_app(service, config), config, on_stop=service.close).run(sockets=[sock])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """A real daemon on a real socket, in a thread. Used by tests and benchmarks."""

    def __init__(self, service, config, on_stop: Callable[[], None] | None = None):
        check_bind(config)
        self.config = config
        self.server = StoppableServer(make_app(service, config), config, on_stop=on_stop)
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
