"""One log line per request, as Ollama's server log has: client, method, path, status, duration, request id; and
an `x-request-id` on every response (the client's own when it sent a usable one, else a fresh one).

An ASGI middleware around the whole app (guards included), so refused requests are logged and carry the id too;
the id is in the scope under SCOPE_KEY for the routes. A streamed reply is logged when its last byte has gone,
with the time the whole reply took."""

from __future__ import annotations

import logging
import re
import secrets
import time

log = logging.getLogger("localrt.access")

SCOPE_KEY = "localrt.request_id"
HEADER = b"x-request-id"
# A client's id is echoed only when it is short, visible ASCII: it goes into our headers and log lines.
_USABLE = re.compile(r"[!-~]{1,200}")


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def _client_id(scope) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == HEADER:
            text = value.decode("latin-1").strip()
            return text if _USABLE.fullmatch(text) else None
    return None


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
        rid = scope[SCOPE_KEY] = _client_id(scope) or new_request_id()
        status = [0]  # 0 until the response starts: a client that left before any reply is logged as 499

        async def send_logged(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = dict(message, headers=headers + [(HEADER, rid.encode("latin-1"))])
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            client = scope.get("client") or ("-", 0)
            log.info(
                "%s %s %s %d %s %s",
                client[0],
                scope["method"],
                scope["path"],
                status[0] or 499,
                _duration(time.perf_counter() - t0),
                rid,
            )
