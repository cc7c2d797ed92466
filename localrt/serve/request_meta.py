"""What the routes say about a request besides its reply: its id (set by the access log, serve/access_log.py)
and one warning line naming what a request ignored."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request

from ..api.types import ignored_keys

log = logging.getLogger("localrt.server")

from .access_log import SCOPE_KEY


def request_id(request: Request) -> str:
    return request.scope.get(SCOPE_KEY) or "-"


def warn_ignored(request: Request, req: Any) -> None:
    """One WARNING line per request that names every key it ignored (request fields and options), as
    Ollama logs "invalid option provided"; nothing when it ignored nothing."""
    keys = ignored_keys(req)
    if keys:
        log.warning(
            "%s %s (request %s): ignored unknown field(s): %s",
            request.method,
            request.url.path,
            request_id(request),
            ", ".join(keys),
        )
