"""The OpenAI-compatible API (`/v1/*`): one function per route, each a translation in front of the same service
calls as the native routes (never a second engine path)."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import errors
from . import openai_compat, openai_replies, openai_responses, rerank_compat
from .openai_choices import BestOf, run_choices, run_prompts
from .openai_responses_reply import ResponsesStream
from .request_meta import warn_ignored
from .streaming import cancellable, json_body, openai_streamed


def _service(request: Request):
    return request.app.state.service


async def chat_completions(request: Request) -> Response:
    req, opts = openai_compat.chat_request(await json_body(request))
    warn_ignored(request, req)
    events = await run_in_threadpool(run_choices, _service(request).chat, req, opts.n)
    return await openai_streamed(request, events, opts, openai_replies.ChatStream(req.model, opts))


async def completions(request: Request) -> Response:
    reqs, opts = openai_compat.completion_request(await json_body(request))
    req = reqs[0]
    warn_ignored(request, req)
    events = await run_in_threadpool(run_prompts, _service(request).generate, reqs, opts.best_of)
    fmt: Any = openai_replies.CompletionStream(req.model, opts)
    if opts.best_of > opts.n:  # never streamed (a 400 in completion_request)
        fmt = BestOf(fmt, opts.n)
    return await openai_streamed(request, events, opts, fmt)


async def responses(request: Request) -> Response:
    """The Responses API: a chat request underneath (openai_responses), its events as typed response events."""
    req, opts = openai_responses.responses_request(await json_body(request))
    warn_ignored(request, req)
    events = await run_in_threadpool(_service(request).chat, req)
    return await openai_streamed(request, events, opts, ResponsesStream(req.model, opts))


async def responses_input_tokens(request: Request) -> Response:
    """The prompt /v1/responses would run for this body, counted in the model's tokens (nothing is generated)."""
    req, _opts = openai_responses.responses_request(await json_body(request))
    warn_ignored(request, req)
    events = await run_in_threadpool(_service(request).chat, req, count_only=True)
    counted = await cancellable(request, _drain, events)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": counted[-1]["input_tokens"]})


def _drain(events, cancel) -> list:
    cancel.add_hook(events.cancel)  # a client gone withdraws the request, queued or loading
    out = list(events)
    if not out:
        raise errors.Cancelled()
    return out


async def embeddings(request: Request) -> Response:
    req, encoding = openai_compat.embeddings_request(await json_body(request))
    warn_ignored(request, req)
    native_reply = await cancellable(request, _service(request).embed, req)
    return JSONResponse(openai_compat.embeddings_reply(req.model, native_reply, encoding))


async def rerank(request: Request) -> Response:
    """llama-server's rerank endpoint (serve.rerank_compat), on a reranker model."""
    req = rerank_compat.rerank_request(await json_body(request))
    warn_ignored(request, req)
    native_reply = await cancellable(request, _service(request).rerank, req)
    return JSONResponse(rerank_compat.rerank_reply(req, native_reply))


async def models(request: Request) -> Response:
    return JSONResponse(openai_compat.models_reply(await run_in_threadpool(_service(request).tags)))


async def model(request: Request) -> Response:
    name = request.path_params["model"]
    found = openai_compat.model_reply(await run_in_threadpool(_service(request).tags), name)
    if found is None:
        raise errors.ModelNotFound(name)
    return JSONResponse(found)
