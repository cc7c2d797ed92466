"""Running the ASGI app on a real socket with uvicorn: in the foreground (`localrt serve`) or in a thread (tests)."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from .security import is_loopback
from .server import make_app


class InsecureBind(RuntimeError):
    pass


def check_bind(config) -> None:
    """Refuse to listen beyond loopback without a bearer token: the API can read and delete every model."""
    if not is_loopback(config.host) and not config.api_key:
        raise InsecureBind(
            f"refusing to listen on {config.host}: set LOCALRT_API_KEY to require a bearer token on a non-loopback "
            "address"
        )


def _uvicorn_config(app, config, sock_host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=sock_host, port=port, log_level="warning", access_log=False,
        timeout_keep_alive=5, limit_concurrency=256, lifespan="off",
    )


def serve_forever(service, config) -> None:
    check_bind(config)
    uvicorn.Server(_uvicorn_config(make_app(service, config), config, config.host, config.port)).run()


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
