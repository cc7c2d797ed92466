"""The one mapping from typed errors to HTTP status, message and headers, and the error bodies of both APIs."""

from __future__ import annotations

import errno
import logging

from starlette.responses import JSONResponse, Response

from .. import errors
from . import openai_compat
from .security import BodyTooLarge

log = logging.getLogger("localrt.server")


def error_status(exc: BaseException) -> tuple[int, str, dict[str, str]]:
    """The one mapping from typed errors to (HTTP status, message, extra headers)."""
    name = type(exc).__name__
    if isinstance(exc, errors.Busy):
        return (
            503,
            str(exc) or "server busy, please try again.  maximum pending requests exceeded",
            {"Retry-After": "5"},
        )
    if isinstance(exc, errors.ModelNotFound) or name in ("ManifestNotFound", "BlobNotFound"):
        return 404, str(exc), {}
    if isinstance(exc, BodyTooLarge):
        return 413, str(exc), {}
    if isinstance(exc, errors.Cancelled):
        return 499, "request canceled", {}
    if isinstance(exc, (errors.InvalidRequest, errors.InvalidModelName, errors.ContextLengthExceeded)) or name in (
        "InvalidName",
        "InvalidDigest",
        "DigestMismatch",
        "ModelfileError",
        "TemplateError",
        "InvalidGGUF",
        "SchemaError",
        "QuantError",
        "CreateError",
        "ParamError",
    ):
        return 400, str(exc), {}
    if name == "InsufficientSpace" or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
        msg = str(exc) if name == "InsufficientSpace" else f"not enough disk space to store this: {exc.strerror}"
        return 507, msg, {}
    if isinstance(exc, errors.LocalrtError):
        return 500, str(exc), {}
    if isinstance(exc, OSError) and exc.strerror:
        log.exception("storage error", exc_info=exc)
        return 500, f"storage error: {exc.strerror}", {}  # no path: it would tell a caller about the server's disk
    log.exception("internal error", exc_info=exc)
    return 500, f"internal error: {name}", {}


def error_response(exc: BaseException, openai: bool = False) -> Response:
    status, msg, headers = error_status(exc)
    if openai and isinstance(exc, errors.ContextLengthExceeded):  # OpenAI's code: clients' context fallbacks fire
        body = openai_compat.error_body(status, exc.openai_message(), "context_length_exceeded")
        return JSONResponse(body, status_code=status, headers=headers)
    if openai:
        return JSONResponse(openai_compat.error_body(status, msg), status_code=status, headers=headers)
    return JSONResponse({"error": msg}, status_code=status, headers=headers)
