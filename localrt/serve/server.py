"""The HTTP app: the route table, the one place a route's exceptions become HTTP replies, and the guards around
it all. The routes themselves live in routes_native (Ollama's /api) and routes_openai (/v1); framing in streaming.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .. import errors
from ..config import is_loopback
from . import routes_native as native
from . import routes_openai as v1
from . import ui_routes as ui
from .access_log import AccessLog
from .error_map import error_response, error_status  # noqa: F401 - error_status: the mapping, for callers
from .routes_native import API_VERSION  # noqa: F401
from .security import Guard
from .streaming import fold_chat, fold_generate, fold_progress  # noqa: F401


def guarded(handler: Callable, openai: bool = False) -> Callable:
    """The one place a route's exceptions become HTTP replies (native or OpenAI error shape)."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except (ClientDisconnect, errors.Cancelled):
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001 - mapped once, here
            return error_response(exc, openai=openai)

    return route


def _v1(handler: Callable) -> Callable:
    return guarded(handler, openai=True)


ROUTES = [
    ("/", ui.root, ["GET", "HEAD"], None),
    ("/ui", ui.to_page, ["GET", "HEAD"], None),
    ("/ui/", ui.page, ["GET", "HEAD"], None),
    ("/ui/{name}", ui.page, ["GET", "HEAD"], None),
    ("/api/version", native.version, ["GET", "HEAD"], guarded),
    ("/api/generate", native.generate, ["POST"], guarded),
    ("/api/chat", native.chat, ["POST"], guarded),
    ("/api/embed", native.embed, ["POST"], guarded),
    ("/api/embeddings", native.embeddings, ["POST"], guarded),
    ("/api/tags", native.tags, ["GET", "HEAD"], guarded),
    ("/api/ps", native.ps, ["GET"], guarded),
    ("/api/kernels", native.kernels, ["GET"], guarded),
    ("/api/show", native.show, ["POST"], guarded),
    ("/api/copy", native.copy, ["POST"], guarded),
    ("/api/delete", native.delete, ["DELETE"], guarded),
    ("/api/create", native.create, ["POST"], guarded),
    ("/api/pull", native.pull, ["POST"], guarded),
    ("/api/push", native.push, ["POST"], guarded),
    ("/api/blobs/{digest}", native.blob_head, ["HEAD"], guarded),
    ("/api/blobs/{digest}", native.blob_post, ["POST"], guarded),
    ("/v1/chat/completions", v1.chat_completions, ["POST"], _v1),
    ("/v1/completions", v1.completions, ["POST"], _v1),
    ("/v1/responses", v1.responses, ["POST"], _v1),
    ("/v1/responses/input_tokens", v1.responses_input_tokens, ["POST"], _v1),
    ("/v1/embeddings", v1.embeddings, ["POST"], _v1),
    ("/v1/rerank", v1.rerank, ["POST"], _v1),  # llama-server's four names for it
    ("/rerank", v1.rerank, ["POST"], _v1),
    ("/v1/reranking", v1.rerank, ["POST"], _v1),
    ("/reranking", v1.rerank, ["POST"], _v1),
    ("/v1/models", v1.models, ["GET"], _v1),
    ("/v1/models/{model}", v1.model, ["GET"], _v1),
]


def make_app(service, config):
    """The ASGI app over a service object (see localrt.runtime.service.Service for the interface), behind the
    guards and the access log; every reply carries an x-request-id."""
    from ..runtime import kernel_prep

    kernel_prep.install_in_background()  # counts kernel compiles from here on, for /api/kernels
    routes = [Route(path, wrap(fn) if wrap else fn, methods=methods) for path, fn, methods, wrap in ROUTES]
    from ..distribution.registry import registry_enabled, registry_routes

    if registry_enabled(config):
        routes += registry_routes(lambda: service.store, config)
    app = Starlette(routes=routes)
    app.state.service = service
    public = ("/ui/",) + (("/v2/",) if getattr(config, "registry_public", False) else ())  # the page asks for the key
    return AccessLog(
        Guard(
            app,
            loopback_bind=is_loopback(config.host),
            origins=config.origins,
            api_key=config.api_key,
            public_read_prefixes=public,
        )
    )
