"""What the edge says about a request besides its reply: an `x-request-id` on every response (the client's own
when it sent a usable one, else a fresh one), and one warning line naming what a request ignored.

`RequestId` is a pure ASGI middleware around everything (guards included), so refusals carry the id too; the
id is in the scope under SCOPE_KEY for the routes and the log line.
"""
from __future__ import annotations

import logging
import re
import secrets
from typing import Any

from starlette.requests import Request

from ..api.types import ignored_keys

log = logging.getLogger("localrt.server")

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


class RequestId:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _client_id(scope) or new_request_id()
        scope[SCOPE_KEY] = rid

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = dict(message, headers=headers + [(HEADER, rid.encode("latin-1"))])
            await send(message)

        await self.app(scope, receive, send_with_id)


def request_id(request: Request) -> str:
    return request.scope.get(SCOPE_KEY) or "-"


def warn_ignored(request: Request, req: Any) -> None:
    """One WARNING line per request that names every key it ignored (request fields and options), as
    Ollama logs "invalid option provided"; nothing when it ignored nothing."""
    keys = ignored_keys(req)
    if keys:
        log.warning("%s %s (request %s): ignored unknown field(s): %s", request.method, request.url.path,
                    request_id(request), ", ".join(keys))
