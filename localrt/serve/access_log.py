"""One log line per request, as Ollama's server log has: client, method, path, status, duration.

An ASGI middleware around the whole app (guards included), so refused requests are logged too. A streamed
reply is logged when its last byte has gone, with the time the whole reply took."""
from __future__ import annotations

import logging
import time

log = logging.getLogger("localrt.access")


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.2f}s"


class AccessLog:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [0]  # 0 until the response starts: a client that left before any reply is logged as 499

        async def send_logged(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            client = scope.get("client") or ("-", 0)
            log.info("%s %s %s %d %s", client[0], scope["method"], scope["path"], status[0] or 499,
                     _duration(time.perf_counter() - t0))
