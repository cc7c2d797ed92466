"""The chat page: static files from `ui/` (shipped inside the package, no CDN, no build step), served under /ui/
with a strict Content-Security-Policy, and `GET /` answered by a redirect for browsers (an Accept of text/html)
while API clients that probe `/` keep getting "Ollama is running"."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

UI = Path(__file__).with_name("ui")
FILES = {
    "": ("index.html", "text/html; charset=utf-8"),
    "app.js": ("app.js", "text/javascript; charset=utf-8"),
    "markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
    "math.js": ("math.js", "text/javascript; charset=utf-8"),
    "convs.js": ("convs.js", "text/javascript; charset=utf-8"),
    "app.css": ("app.css", "text/css; charset=utf-8"),
}
# Scripts and styles from this origin's files only (no inline code, no eval), requests to this origin only, no
# frames, forms or plugins: a reply that slipped markup past the renderer still could not run or load anything.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
}


def wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


async def root(request: Request) -> Response:
    if request.method == "GET" and wants_html(request):
        return RedirectResponse("/ui/", status_code=302)
    return PlainTextResponse("Ollama is running")


async def to_page(request: Request) -> Response:
    return RedirectResponse("/ui/", status_code=301)


async def page(request: Request) -> Response:
    name = request.path_params.get("name", "")
    if name == "config.json":
        return JSONResponse({"builtins": chat_builtins()}, headers=HEADERS)
    if name not in FILES:
        return PlainTextResponse("not found", status_code=404, headers=HEADERS)
    file, media = FILES[name]
    return Response((UI / file).read_bytes(), media_type=media, headers=HEADERS)


def chat_builtins() -> list[str]:
    """The built-in models a chat can use (not the embedding ones), for the picker before they are created."""
    from ..models.builtins import BUILTINS

    return [name for name, spec in BUILTINS.items() if not spec.converted]
