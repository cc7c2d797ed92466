"""The HTTP edge: routes, JSON in and out, NDJSON / SSE framing, and the one error -> HTTP mapping.

Handlers parse and validate, hand a request to the service (no HTTP below this file) and frame what comes back.
A streamed reply takes its first event before the status line is sent, so an early failure is a real HTTP error;
a failure after the first byte becomes one `{"error": ...}` line.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, Iterator

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from . import api_types, errors, openai_compat
from .access_log import AccessLog
from .security import BodyTooLarge, Guard, is_loopback

log = logging.getLogger("localrt.server")

API_VERSION = "0.13.0"  # the Ollama wire format we speak; clients gate features on it
_END = object()


def error_status(exc: BaseException) -> tuple[int, str, dict[str, str]]:
    """The one mapping from typed errors to (HTTP status, message, extra headers)."""
    name = type(exc).__name__
    if isinstance(exc, errors.Busy):
        return 503, str(exc) or "server busy, please try again.  maximum pending requests exceeded", {"Retry-After": "5"}
    if isinstance(exc, errors.ModelNotFound) or name in ("ManifestNotFound", "BlobNotFound"):
        return 404, str(exc), {}
    if isinstance(exc, BodyTooLarge):
        return 413, str(exc), {}
    if isinstance(exc, errors.Cancelled):
        return 499, "request canceled", {}
    if isinstance(exc, (errors.InvalidRequest, errors.InvalidModelName, errors.ContextLengthExceeded)) or name in (
        "InvalidName", "InvalidDigest", "DigestMismatch", "ModelfileError", "TemplateError", "InvalidGGUF",
        "SchemaError", "QuantError", "CreateError", "ParamError",
    ):
        return 400, str(exc), {}
    if isinstance(exc, errors.LocalrtError):
        return 500, str(exc), {}
    log.exception("internal error", exc_info=exc)
    return 500, f"internal error: {name}", {}


def _error_response(exc: BaseException, openai: bool = False) -> Response:
    status, msg, headers = error_status(exc)
    if openai:
        return JSONResponse(openai_compat.error_body(status, msg), status_code=status, headers=headers)
    return JSONResponse({"error": msg}, status_code=status, headers=headers)


def _ndjson(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class EventPump:
    """Pulls a blocking event iterator from a worker thread one item at a time, and cancels it on disconnect."""

    def __init__(self, it: Iterator[dict]):
        self.it = it

    async def next(self) -> Any:
        return await run_in_threadpool(next, self.it, _END)

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


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away. The body has been read already, so receive() only sees that."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _stream(pump: EventPump, first: Any, frame: Callable[[Any], bytes], tail: Callable[[], bytes] | None = None,
            error_frame: Callable[[str], bytes] | None = None):
    async def body():
        item = first
        try:
            while item is not _END:
                yield frame(item)
                item = await pump.next()
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
    items, item = [], first
    try:
        while item is not _END:
            items.append(item)
            if await request.is_disconnected():
                raise errors.Cancelled()
            item = await pump.next()
    finally:
        pump.cancel()
    return items


async def _json_body(request: Request) -> dict:
    return api_types.parse_json_body(await request.body())


def make_app(service, config) -> Starlette:
    """Build the ASGI app over a service object (see localrt.service.Service for the interface)."""

    async def streamed(request: Request, events: Iterator[dict], stream: bool, fold: Callable[[list], dict]):
        pump = EventPump(events)
        first = await _first(pump, request)
        if first is _END:
            return JSONResponse(fold([]))
        if first.get("done") and first.get("done_reason") in ("load", "unload"):
            pump.cancel()
            return JSONResponse(first)
        if not stream:
            return JSONResponse(fold(await _drain(pump, request, first)))
        return StreamingResponse(_stream(pump, first, _ndjson), media_type="application/x-ndjson")

    def guarded(handler, openai: bool = False):
        """The one place a route's exceptions become HTTP replies (native or OpenAI error shape)."""
        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except (ClientDisconnect, errors.Cancelled):
                return Response(status_code=499)
            except Exception as exc:  # noqa: BLE001 - mapped once, here
                return _error_response(exc, openai=openai)
        return route

    native = guarded

    def openai(handler):
        return guarded(handler, openai=True)

    async def root(request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(request: Request) -> Response:
        return JSONResponse({"version": API_VERSION})

    async def generate(request: Request) -> Response:
        req = api_types.GenerateRequest.from_json(await _json_body(request))
        events = await run_in_threadpool(service.generate, req)
        return await streamed(request, events, req.stream, fold_generate)

    async def chat(request: Request) -> Response:
        req = api_types.ChatRequest.from_json(await _json_body(request))
        events = await run_in_threadpool(service.chat, req)
        return await streamed(request, events, req.stream, fold_chat)

    async def embed(request: Request) -> Response:
        req = api_types.EmbedRequest.from_json(await _json_body(request))
        return JSONResponse(await run_in_threadpool(service.embed, req))

    async def embeddings(request: Request) -> Response:
        req = api_types.EmbedRequest.from_json(await _json_body(request), legacy=True)
        return JSONResponse(await run_in_threadpool(service.embed, req))

    async def tags(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(service.tags))

    async def ps(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(service.ps))

    async def show(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(service.show, await _json_body(request)))

    async def copy(request: Request) -> Response:
        await run_in_threadpool(service.copy, await _json_body(request))
        return Response(status_code=200)

    async def delete(request: Request) -> Response:
        await run_in_threadpool(service.delete, await _json_body(request))
        return Response(status_code=200)

    def progress_route(method_name: str):
        async def route(request: Request) -> Response:
            body = await _json_body(request)
            stream = body.get("stream", True)
            if stream is not None and not isinstance(stream, bool):
                raise errors.InvalidRequest("stream must be a boolean")
            events = await run_in_threadpool(getattr(service, method_name), body)
            return await streamed(request, events, stream is not False, fold_progress)
        return route

    async def blob_head(request: Request) -> Response:
        digest = request.path_params["digest"]
        found = await run_in_threadpool(service.blob_exists, digest)
        if not found:
            return JSONResponse({"error": f'blob "{digest}" not found'}, status_code=404)
        return Response(status_code=200)

    async def blob_post(request: Request) -> Response:
        digest = request.path_params["digest"]
        if await run_in_threadpool(service.blob_exists, digest):
            return Response(status_code=200)
        writer = await run_in_threadpool(service.blob_writer, digest)
        try:
            async for chunk in request.stream():
                if chunk:
                    await run_in_threadpool(writer.write, chunk)
            await run_in_threadpool(writer.commit)
        except BaseException:
            await run_in_threadpool(writer.abort)
            raise
        return Response(status_code=201)

    async def v1_chat(request: Request) -> Response:
        body = await _json_body(request)
        req, opts = openai_compat.chat_request(body)
        events = await run_in_threadpool(service.chat, req)
        return await _openai_stream(request, events, opts, openai_compat.ChatStream(req.model, opts))

    async def v1_completions(request: Request) -> Response:
        body = await _json_body(request)
        req, opts = openai_compat.completion_request(body)
        events = await run_in_threadpool(service.generate, req)
        return await _openai_stream(request, events, opts, openai_compat.CompletionStream(req.model, opts))

    async def _openai_stream(request: Request, events, opts, fmt) -> Response:
        pump = EventPump(events)
        first = await _first(pump, request)
        if not opts.stream:
            items = [] if first is _END else await _drain(pump, request, first)
            return JSONResponse(fmt.whole(items))
        if first is _END:
            raise errors.LocalrtError("the model produced no events")
        return StreamingResponse(
            _stream(pump, first, fmt.chunk, fmt.tail, openai_compat.sse_error),
            media_type="text/event-stream",
        )

    async def v1_embeddings(request: Request) -> Response:
        body = await _json_body(request)
        req, encoding = openai_compat.embeddings_request(body)
        native_reply = await run_in_threadpool(service.embed, req)
        return JSONResponse(openai_compat.embeddings_reply(req.model, native_reply, encoding))

    async def v1_models(request: Request) -> Response:
        return JSONResponse(openai_compat.models_reply(await run_in_threadpool(service.tags)))

    async def v1_model(request: Request) -> Response:
        name = request.path_params["model"]
        tags = await run_in_threadpool(service.tags)
        found = openai_compat.model_reply(tags, name)
        if found is None:
            raise errors.ModelNotFound(name)
        return JSONResponse(found)

    routes = [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/api/version", native(version), methods=["GET", "HEAD"]),
        Route("/api/generate", native(generate), methods=["POST"]),
        Route("/api/chat", native(chat), methods=["POST"]),
        Route("/api/embed", native(embed), methods=["POST"]),
        Route("/api/embeddings", native(embeddings), methods=["POST"]),
        Route("/api/tags", native(tags), methods=["GET", "HEAD"]),
        Route("/api/ps", native(ps), methods=["GET"]),
        Route("/api/show", native(show), methods=["POST"]),
        Route("/api/copy", native(copy), methods=["POST"]),
        Route("/api/delete", native(delete), methods=["DELETE"]),
        Route("/api/create", native(progress_route("create")), methods=["POST"]),
        Route("/api/pull", native(progress_route("pull")), methods=["POST"]),
        Route("/api/push", native(progress_route("push")), methods=["POST"]),
        Route("/api/blobs/{digest}", native(blob_head), methods=["HEAD"]),
        Route("/api/blobs/{digest}", native(blob_post), methods=["POST"]),
        Route("/v1/chat/completions", openai(v1_chat), methods=["POST"]),
        Route("/v1/completions", openai(v1_completions), methods=["POST"]),
        Route("/v1/embeddings", openai(v1_embeddings), methods=["POST"]),
        Route("/v1/models", openai(v1_models), methods=["GET"]),
        Route("/v1/models/{model}", openai(v1_model), methods=["GET"]),
    ]
    from .registry import registry_enabled, registry_routes

    if registry_enabled(config):
        routes += registry_routes(lambda: service.store, config)
    app = Starlette(routes=routes)
    public = ("/v2/",) if getattr(config, "registry_public", False) else ()
    return AccessLog(Guard(app, loopback_bind=is_loopback(config.host), origins=config.origins,
                           api_key=config.api_key, public_read_prefixes=public))


def fold_generate(items: list[dict]) -> dict:
    """A non-streamed /api/generate reply: the pieces concatenated, the final chunk's metrics."""
    if not items:
        return {}
    out = dict(items[-1])
    out["response"] = "".join(i.get("response", "") for i in items)
    return out


def fold_chat(items: list[dict]) -> dict:
    if not items:
        return {}
    out = dict(items[-1])
    msg = dict(out.get("message") or {"role": "assistant"})
    msg["content"] = "".join((i.get("message") or {}).get("content", "") for i in items)
    calls = [c for i in items for c in (i.get("message") or {}).get("tool_calls", [])]
    if calls:
        msg["tool_calls"] = calls
    out["message"] = msg
    return out


def fold_progress(items: list[dict]) -> dict:
    return items[-1] if items else {"status": "success"}
