"""Framing a stream of events for HTTP: the first event before the status line (so an early failure is a real
HTTP error), NDJSON or SSE after it (a failure after the first byte is one error line), a fold for non-streamed
replies, and cancellation when the client goes away."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any, Callable, Iterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from .. import errors
from ..api import types as api_types
from ..runtime.jobs import Cancel
from . import openai_compat
from .error_map import error_status

_END = object()  # the end of an event iterator


def _ndjson(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _public(item: Any) -> Any:
    """A native reply without the service's "_" keys (facts only /v1 reports, e.g. cached prompt tokens)."""
    if isinstance(item, dict) and any(isinstance(k, str) and k.startswith("_") for k in item):
        return {k: v for k, v in item.items() if not (isinstance(k, str) and k.startswith("_"))}
    return item


class EventPump:
    """Reads a reply's events from the event loop. A scheduler stream (one with `drain`, runtime.jobs.Stream) is read
    from its channel: every event waiting per wake-up, with no thread waiting on it. Any other blocking iterator (n
    choices merged, one reply) is pulled one item per worker-thread call."""

    def __init__(self, it: Iterator[dict]):
        self.it = it
        self._drain = getattr(it, "drain", None)
        self._ready: collections.deque = collections.deque()  # drained, not yet taken

    async def batch(self) -> list:
        """The events waiting, at least one; the last one is _END once the iterator is done."""
        if self._ready:
            out = list(self._ready)
            self._ready.clear()
            return out
        if self._drain is None:
            return [await run_in_threadpool(next, self.it, _END)]
        items, ended = await self._drain()
        return [*items, _END] if ended else items

    async def next(self) -> Any:
        items = await self.batch()
        self._ready.extend(items[1:])
        return items[0]

    def cancel(self) -> None:
        cancel = getattr(self.it, "cancel", None)
        if cancel is not None:
            cancel()  # thread-safe: the worker stops at its next step


async def _first(pump: EventPump, request: Request) -> Any:
    """The first event, pulled before any byte is written (errors here become HTTP statuses).

    Waiting for it can take long (queued behind other requests, loading, prompt eval), so the client's
    disconnect is watched meanwhile: a client that leaves cancels its work at once."""
    nxt = asyncio.ensure_future(pump.next())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        pump.cancel()
        raise
    finally:
        gone.cancel()
    if nxt in done:
        try:
            return nxt.result()
        except BaseException:
            pump.cancel()
            raise
    pump.cancel()
    nxt.add_done_callback(lambda t: t.cancelled() or t.exception())  # the thread ends after the cancel
    raise errors.Cancelled()


async def cancellable(request: Request, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args, cancel=...)` (blocking, one reply, e.g. embeddings) in a worker thread; the client's disconnect sets
    `cancel` (a jobs.Cancel) so that the work stops at its next step, and the route answers 499."""
    cancel = Cancel()
    task = asyncio.ensure_future(run_in_threadpool(fn, *args, cancel=cancel))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        cancel.set()
        raise
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    cancel.set()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # the thread ends after the cancel
    raise errors.Cancelled()


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away. The body has been read already, so receive() only sees that."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _stream(
    pump: EventPump,
    first: Any,
    frame: Callable[[Any], bytes],
    tail: Callable[[], bytes] | None = None,
    error_frame: Callable[[str], bytes] | None = None,
):
    async def body():
        batch = [first]
        try:
            while True:  # the events of one wake-up go out as one write
                done = any(item is _END for item in batch)
                chunk = b"".join(frame(item) for item in batch if item is not _END)
                if chunk:
                    yield chunk
                if done:
                    break
                batch = await pump.batch()
            if tail is not None:
                yield tail()
        except Exception as exc:  # after the first byte: one error line, then the stream ends
            _, msg, _ = error_status(exc)
            yield (error_frame or (lambda m: _ndjson({"error": m})))(msg)
        finally:
            pump.cancel()

    return body()


async def _drain(pump: EventPump, request: Request, first: Any) -> list:
    """Collect a whole non-streamed reply, cancelling the work if the client goes away meanwhile."""
    items, batch = [], [first]
    try:
        while True:
            items.extend(item for item in batch if item is not _END)
            if any(item is _END for item in batch):
                return items
            if await request.is_disconnected():
                raise errors.Cancelled()
            batch = await pump.batch()
    finally:
        pump.cancel()


async def json_body(request: Request) -> dict:
    return api_types.parse_json_body(await request.body())


async def streamed(request: Request, events: Iterator[dict], stream: bool, fold: Callable[[list], dict]):
    """A native reply: NDJSON lines, or one JSON object folded from the events when not streamed."""
    pump = EventPump(events)
    first = await _first(pump, request)
    if first is _END:
        return JSONResponse(fold([]))
    if first.get("done") and first.get("done_reason") in ("load", "unload"):
        pump.cancel()
        return JSONResponse(_public(first))
    if not stream:
        return JSONResponse(_public(fold(await _drain(pump, request, first))))
    return StreamingResponse(
        _stream(pump, first, lambda item: _ndjson(_public(item))), media_type="application/x-ndjson"
    )


async def openai_streamed(request: Request, events, opts, fmt):
    """A /v1 reply: SSE chunks in OpenAI's shapes, or one whole object when not streamed."""
    pump = EventPump(events)
    first = await _first(pump, request)
    if not opts.stream:
        items = [] if first is _END else await _drain(pump, request, first)
        return JSONResponse(fmt.whole(items))
    if first is _END:
        raise errors.LocalrtError("the model produced no events")
    return StreamingResponse(
        _stream(pump, first, fmt.chunk, fmt.tail, getattr(fmt, "error", openai_compat.sse_error)),
        media_type="text/event-stream",
    )


def fold_generate(items: list[dict]) -> dict:
    """A non-streamed /api/generate reply: the pieces concatenated, the final chunk's metrics."""
    if not items:
        return {}
    out = dict(items[-1])
    out["response"] = "".join(i.get("response", "") for i in items)
    thinking = "".join(i.get("thinking", "") for i in items)
    if thinking:
        out["thinking"] = thinking
    _fold_logprobs(out, items)
    return out


def _fold_logprobs(out: dict, items: list[dict]) -> None:
    """Every chunk's `logprobs` entries, in order, on the folded reply (left out when there are none, as Ollama)."""
    entries = [e for i in items for e in i.get("logprobs") or ()]
    if entries:
        out["logprobs"] = entries


def fold_chat(items: list[dict]) -> dict:
    if not items:
        return {}
    out = dict(items[-1])
    msg = dict(out.get("message") or {"role": "assistant"})
    msg["content"] = "".join((i.get("message") or {}).get("content", "") for i in items)
    thinking = "".join((i.get("message") or {}).get("thinking", "") for i in items)
    if thinking:
        msg["thinking"] = thinking
    calls = [c for i in items for c in (i.get("message") or {}).get("tool_calls", [])]
    if calls:
        msg["tool_calls"] = calls
    out["message"] = msg
    _fold_logprobs(out, items)
    return out


def fold_progress(items: list[dict]) -> dict:
    return items[-1] if items else {"status": "success"}
