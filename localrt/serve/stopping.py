"""What a client sees when the daemon stops (`localrt serve --stop`, SIGTERM, Ctrl-C) while its request is open.

The service fails the requests it has not started with Cancelled, which the routes answer as for a client that
left (an empty 499); and the server cancels replies still running after its grace. Without this wrapper a client
would read an empty error, or a stream that stops short as if complete. With it, once the stop has begun:
- a reply that had not started is 503 "the server is shutting down", in the error shape of its API;
- a streamed reply that is cut ends with one error line (NDJSON) or OpenAI's error event (SSE); the Responses
  API's stream, whose failure event needs the reply's own state, is closed unfinished instead.
Before the stop it passes everything through untouched.
"""

from __future__ import annotations

import asyncio
import json

from . import openai_compat

MESSAGE = "the server is shutting down"
CANCELED = 499  # what the routes answer for a Cancelled request (server.guarded)


def _error_reply(path: str) -> bytes:
    if path.startswith("/v1/"):
        return json.dumps(openai_compat.error_body(503, MESSAGE)).encode()
    return json.dumps({"error": MESSAGE}).encode()


def _error_frame(path: str, content_type: bytes) -> bytes | None:
    """The last frame of a cut stream, or None where the stream's own shape has no such frame."""
    if content_type.startswith(b"application/x-ndjson"):
        return json.dumps({"error": MESSAGE}).encode() + b"\n"
    if content_type.startswith(b"text/event-stream") and not path.startswith("/v1/responses"):
        return openai_compat.sse_error(MESSAGE)
    return None


class StopReplies:
    """ASGI wrapper; `stopping` is set (from the signal handler) when the stop begins."""

    def __init__(self, app):
        self.app = app
        self.stopping = False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = {"started": False, "swallow": False, "type": b"", "done": False}

        async def guarded_send(message):
            kind = message["type"]
            if kind == "http.response.start":
                if self.stopping and message["status"] == CANCELED:
                    state["swallow"] = True  # its (empty) body too: the 503 below replaces the whole reply
                    return await self._refuse(scope, send, state)
                state["started"] = True
                state["type"] = dict(message.get("headers", [])).get(b"content-type", b"")
            elif state["swallow"]:
                return None
            elif kind == "http.response.body" and not message.get("more_body", False):
                state["done"] = True
            await send(message)

        try:
            await self.app(scope, receive, guarded_send)
        except asyncio.CancelledError:
            if not self.stopping or state["done"]:
                raise
            await self._end_cut_reply(scope, send, state)  # the server's stop cut it: say so, then finish

    async def _refuse(self, scope, send, state) -> None:
        body = _error_reply(scope["path"])
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        state["done"] = True

    async def _end_cut_reply(self, scope, send, state) -> None:
        if state["swallow"]:
            return
        if not state["started"]:
            return await self._refuse(scope, send, state)
        frame = _error_frame(scope["path"], state["type"])
        if frame is None:
            return  # unfinished: uvicorn closes the connection (and logs one line that it did)
        await send({"type": "http.response.body", "body": frame, "more_body": False})
