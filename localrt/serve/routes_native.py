"""Ollama's native API (`/api/*`): one function per route. Each parses and validates its body, hands the request
to the service (`request.app.state.service`; no HTTP below this layer) and frames what comes back."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import errors
from ..api import types as api_types
from .request_meta import warn_ignored
from .streaming import (
    cancellable,
    fold_chat,
    fold_generate,
    fold_progress,
    json_body,
    streamed,
)

API_VERSION = "0.13.0"  # the Ollama wire format we speak; clients gate features on it


def _service(request: Request):
    return request.app.state.service


async def version(request: Request) -> Response:
    return JSONResponse({"version": API_VERSION})


async def generate(request: Request) -> Response:
    req = api_types.GenerateRequest.from_json(await json_body(request))
    warn_ignored(request, req)
    events = await run_in_threadpool(_service(request).generate, req)
    return await streamed(request, events, req.stream, fold_generate)


async def chat(request: Request) -> Response:
    req = api_types.ChatRequest.from_json(await json_body(request))
    warn_ignored(request, req)
    events = await run_in_threadpool(_service(request).chat, req)
    return await streamed(request, events, req.stream, fold_chat)


async def embed(request: Request) -> Response:
    req = api_types.EmbedRequest.from_json(await json_body(request))
    warn_ignored(request, req)
    return JSONResponse(await cancellable(request, _service(request).embed, req))


async def embeddings(request: Request) -> Response:
    req = api_types.EmbedRequest.from_json(await json_body(request), legacy=True)
    warn_ignored(request, req)
    return JSONResponse(await cancellable(request, _service(request).embed, req))


async def tags(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(_service(request).tags))


async def ps(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(_service(request).ps))


async def kernels(request: Request) -> Response:
    """localrt's own: whether the daemon is compiling kernels for this CPU (localrt.runtime.kernel_prep), which the
    CLI shows while a first answer waits on it."""
    from ..runtime import kernel_prep

    return JSONResponse(kernel_prep.status())


async def show(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(_service(request).show, await json_body(request)))


async def copy(request: Request) -> Response:
    await run_in_threadpool(_service(request).copy, await json_body(request))
    return Response(status_code=200)


async def delete(request: Request) -> Response:
    await run_in_threadpool(_service(request).delete, await json_body(request))
    return Response(status_code=200)


async def _progress(request: Request, method_name: str) -> Response:
    """create / pull / push: a stream of progress events, or the last one when not streamed."""
    body = await json_body(request)
    stream = body.get("stream", True)
    if stream is not None and not isinstance(stream, bool):
        raise errors.InvalidRequest("stream must be a boolean")
    events = await run_in_threadpool(getattr(_service(request), method_name), body)
    return await streamed(request, events, stream is not False, fold_progress)


async def create(request: Request) -> Response:
    return await _progress(request, "create")


async def pull(request: Request) -> Response:
    return await _progress(request, "pull")


async def push(request: Request) -> Response:
    return await _progress(request, "push")


async def blob_head(request: Request) -> Response:
    digest = request.path_params["digest"]
    if not await run_in_threadpool(_service(request).blob_exists, digest):
        return JSONResponse({"error": f'blob "{digest}" not found'}, status_code=404)
    return Response(status_code=200)


async def blob_post(request: Request) -> Response:
    service = _service(request)
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
