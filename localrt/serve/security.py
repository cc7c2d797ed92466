"""Request guards in front of every route: Host allow-list (DNS rebinding), CORS origins, bearer token, body cap.

A pure ASGI middleware, so streamed responses pass through untouched.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import socket

from starlette.concurrency import run_in_threadpool

from ..config import is_loopback
from ..runtime.jobs import CLIENT, LOCAL_CALLER
from .malloc import BIG_BODY, release_after_big_body

DEFAULT_ORIGINS = (
    "http://localhost",
    "https://localhost",
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1",
    "https://127.0.0.1",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://[::1]",
    "https://[::1]",
    "http://[::1]:*",
    "https://[::1]:*",
    "http://0.0.0.0",
    "https://0.0.0.0",
    "http://0.0.0.0:*",
    "https://0.0.0.0:*",
)
# Names the variable, so a user who meets this knows what to set: the localrt command sends its own LOCALRT_API_KEY
UNAUTHORIZED = (
    "unauthorized: a valid bearer token is required (set LOCALRT_API_KEY to the daemon's key; other "
    "clients send it as Authorization: Bearer <key>)"
)
CORS_HEADERS = "Authorization, Content-Type, User-Agent, Accept, X-Requested-With, OpenAI-Beta, x-stainless-*"


def _host_name(header: str) -> str:
    h = header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_allowed(header: str | None) -> bool:
    """A Host a DNS-rebinding page cannot forge: an IP literal, localhost names, or this machine's name."""
    if not header:
        return True
    name = _host_name(header)
    if is_loopback(name):
        return True
    try:
        ipaddress.ip_address(name)
        return True  # rebinding needs a DNS name; a literal address is what the user typed
    except ValueError:
        pass
    return name == socket.gethostname().lower()


_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://(\[[0-9a-f:.]+\]|[^\[\]/:@?#\s]+)(?::(\d{1,5}|\*))?")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_origin(text: str, pattern: bool = False) -> tuple[str, str, int | None | str] | None:
    """An Origin (or an allow-list entry when `pattern`) as (scheme, host, port): lower case, IPv6 hosts without
    their brackets, the scheme's default port filled in (None when it has none). "*" is allowed only as a whole
    port or a whole host (`chrome-extension://*`), and only in a pattern: never a glob inside a name, so
    `[::1]` is an address, not a character class. None when it is not of the form scheme://host[:port]."""
    m = _ORIGIN.fullmatch(text.strip().lower())
    if m is None:
        return None
    scheme, host, port = m.group(1), m.group(2), m.group(3)
    if host.startswith("["):
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            return None
    if "*" in host and (host != "*" or not pattern):
        return None
    if port == "*":
        return (scheme, host, "*") if pattern else None
    if port is not None:
        if int(port) > 65535:
            return None
        return scheme, host, int(port)
    return scheme, host, _DEFAULT_PORTS.get(scheme)


def origin_allowed(origin: str, extra: tuple[str, ...]) -> bool:
    """Whether a browser Origin is on the allow-list: the defaults (loopback over http/https) plus configured
    entries. Entries are scheme://host[:port] with "*" only as a whole host or port, or "*" alone for any
    origin; `null` and file: origins only when listed verbatim."""
    o = origin.strip().lower()
    if o in ("null", "") or o.startswith("file:"):
        return any(p.strip().lower() == o for p in extra)
    if any(p.strip() == "*" for p in extra):
        return True
    got = parse_origin(o)
    if got is None:
        return False
    for p in DEFAULT_ORIGINS + extra:
        want = parse_origin(p, pattern=True)
        if want is not None and want[0] == got[0] and want[1] in ("*", got[1]) and want[2] in ("*", got[2]):
            return True
    return False


def client_key(scope, headers: dict[str, str]) -> str:
    """Who a request is from, for the scheduler's fair share of the queue and the prefix cache's scope: the peer's
    address (an IPv6 peer by its /64, the block one machine gets). A loopback peer may name the client it forwards
    for in X-Forwarded-For (a reverse proxy on this machine); such a client is named apart ("forwarded:ADDR"), so
    what a process on this machine claims never joins the scope of a client that connects itself. From anywhere
    else the header is ignored, so a remote caller cannot claim more than its own share."""
    peer = (scope.get("client") or ("",))[0] or ""
    if is_loopback(peer) and headers.get("x-forwarded-for"):
        claimed = headers["x-forwarded-for"].split(",")[0].strip()[:64]
        if claimed:
            return "forwarded:" + _address_key(claimed)
    return _address_key(peer)


def _address_key(peer: str) -> str:
    try:
        ip = ipaddress.ip_address(peer)
    except ValueError:
        return peer
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        if not ip.is_loopback:
            return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class Guard:
    """ASGI middleware. `loopback_bind` turns the Host check on, as Ollama does for a loopback listener."""

    def __init__(
        self,
        app,
        *,
        loopback_bind: bool,
        origins: tuple[str, ...] = (),
        api_key: str | None = None,
        max_body: int = 64 * 1024 * 1024,
        unlimited_body_prefixes: tuple[str, ...] = ("/api/blobs/", "/v2/"),
        public_read_prefixes: tuple[str, ...] = (),
    ):
        self.app = app
        self.loopback_bind = loopback_bind
        self.origins = origins
        self.api_key = api_key
        self.max_body = max_body
        self.unlimited = unlimited_body_prefixes
        self.public_read = public_read_prefixes  # GET/HEAD here need no token (a public LAN mirror)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path, method = scope["path"], scope["method"]
        if self.loopback_bind and not host_allowed(headers.get("host")):
            return await _reply(send, 403, _error(path, 403, "forbidden host"))
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            if not origin_allowed(origin, self.origins):
                return await _reply(send, 403, _error(path, 403, f"origin {origin!r} is not allowed"))
            cors = [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"vary", b"Origin"),
                (b"access-control-allow-methods", b"GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"),
                (b"access-control-allow-headers", CORS_HEADERS.encode()),
            ]
        if method == "OPTIONS":
            return await _reply(send, 204, None, cors)
        public = method in ("GET", "HEAD") and (path == "/" or path.startswith(self.public_read))
        if self.api_key and not public:
            auth = headers.get("authorization", "")
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                return await _reply(send, 401, _error(path, 401, UNAUTHORIZED), cors)
        limit = None if path.startswith(self.unlimited) else self.max_body
        size = _Size()
        if limit is not None:
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > limit):
                return await _reply(send, 413, _error(path, 413, f"request body too large (limit {limit} bytes)"), cors)
            receive = _capped(receive, limit, size)

        async def send_with_cors(message):
            if cors and message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", [])) + cors)
            await send(message)

        token = CLIENT.set(client_key(scope, headers))  # the service's worker threads inherit both
        local = LOCAL_CALLER.set(
            is_loopback((scope.get("client") or ("",))[0] or "") and "x-forwarded-for" not in headers
        )
        try:
            await self.app(scope, receive, send_with_cors)
        finally:
            LOCAL_CALLER.reset(local)
            CLIENT.reset(token)
            if size.seen >= BIG_BODY:  # the reply is sent and the body's copies are freed: hand the pages back
                await run_in_threadpool(release_after_big_body)


def _error(path: str, status: int, message: str) -> dict:
    """A refusal in the shape of the API the path belongs to: OpenAI's error object under /v1, else Ollama's."""
    if not path.startswith("/v1/"):
        return {"error": message}
    code = "invalid_api_key" if status == 401 else None  # what api.openai.com sends for a bad key
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


class BodyTooLarge(Exception):
    pass


class _Size:
    seen = 0  # body bytes received so far


def _capped(receive, limit: int, size: _Size):
    async def wrapped():
        message = await receive()
        if message["type"] == "http.request":
            size.seen += len(message.get("body", b""))
            if size.seen > limit:
                raise BodyTooLarge(f"request body too large (limit {limit} bytes)")
        return message

    return wrapped


async def _reply(send, status: int, body: dict | None, extra_headers=()) -> None:
    data = b"" if body is None else json.dumps(body).encode()
    headers = [(b"content-type", b"application/json; charset=utf-8"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + list(extra_headers)})
    await send({"type": "http.response.body", "body": data})
