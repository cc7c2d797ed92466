"""The registry over HTTP(S): manifests and blob GETs, with the mirror treated as untrusted.

Manifests are capped and parsed by `store.manifests`; bodies are requested with `Accept-Encoding: identity`
and an encoded body is refused; redirects are followed for blobs only, at most MAX_REDIRECTS hops, to the same
host name, never from https to plain http."""

from __future__ import annotations

import http.client
import urllib.parse
import urllib.request
from typing import Iterator

import httpx

from store import digest as dg
from store import manifests as mf
from store import names

from ..config import is_loopback
from .registry import MirrorError, RegistryError

STREAMS = 4  # at most this many range requests per blob at once (Ollama's newest default)
STALL_S = 30.0  # no byte for this long: the request is dropped and retried
MAX_REDIRECTS = 5
USER_AGENT = "localrt (ollama-compatible)"


def _registry_base(spec: str, insecure: bool, configured: bool) -> str:
    """`http(s)://host[:port]` from a host or URL. A plain-http URL needs `insecure`, unless it was configured."""
    scheme = "http" if insecure else "https"
    if "://" in spec:
        scheme, spec = spec.split("://", 1)
        if scheme not in ("http", "https"):
            raise RegistryError(f"unsupported registry scheme {scheme!r}")
        if scheme == "http" and not (insecure or configured):
            raise RegistryError("insecure protocol http")
    host = spec.rstrip("/")
    if not host or "/" in host:
        raise RegistryError(f"a registry is host[:port] with no path, got {spec!r}")
    return f"{scheme}://{host}"


def _check_redirect(origin: str, target: str, insecure: bool) -> None:
    o, t = urllib.parse.urlparse(origin), urllib.parse.urlparse(target)
    if t.scheme not in ("http", "https"):
        raise MirrorError(f"refusing redirect to {target!r}: not http(s)")
    if (o.hostname or "").lower() != (t.hostname or "").lower():
        raise MirrorError(
            f"refusing redirect from {o.hostname} to another host ({t.hostname}): blobs are only "
            "fetched from the mirror's own host"
        )
    if o.scheme == "https" and t.scheme == "http" and not insecure:
        raise MirrorError(f"refusing redirect from https to plain http ({target})")


class RegistrySource:
    def __init__(self, base: str, name: names.ModelName, token: str | None, insecure: bool):
        self.base = base
        self.name = name
        self.insecure = insecure
        host = urllib.parse.urlparse(base).hostname or ""
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.headers = headers
        self.client = httpx.Client(
            headers=headers,
            follow_redirects=False,
            timeout=httpx.Timeout(connect=10.0, read=STALL_S, write=60.0, pool=None),
            limits=httpx.Limits(max_connections=STREAMS * 4, max_keepalive_connections=STREAMS * 4),
            trust_env=not is_loopback(host),  # a proxy setting must never capture a loopback mirror
        )
        self.direct: dict[str, str] = {}  # blob digest -> URL after redirects (one discovery per blob)

    def close(self) -> None:
        self.client.close()

    def _repo(self) -> str:
        return f"{self.base}/v2/{self.name.namespace}/{self.name.model}"

    def manifest(self) -> tuple[names.ModelName, bytes]:
        url = f"{self._repo()}/manifests/{self.name.tag}"
        try:
            with self.client.stream("GET", url, headers={"Accept": mf.MANIFEST_MEDIA_TYPE}) as r:
                if r.status_code == 404:
                    raise RegistryError("pull model manifest: file does not exist")
                if r.status_code in (401, 403):
                    raise RegistryError(
                        f"{self.base} refused the manifest request (HTTP {r.status_code}): the mirror requires a token"
                    )
                if 300 <= r.status_code < 400:
                    raise MirrorError(f"refusing redirect for a manifest ({r.headers.get('location', '')!r})")
                if r.status_code != 200:
                    raise RegistryError(f"pull model manifest: {r.status_code}: {_peek(r)}")
                _refuse_encoding(r, "manifest")
                data = _read_capped(r, mf.MAX_MANIFEST_BYTES, "manifest")
        except httpx.TransportError as e:
            raise RegistryError(f"cannot reach {self.base}: {e}") from None
        claimed = r.headers.get("docker-content-digest")
        if claimed and claimed != dg.of_bytes(data):
            raise MirrorError(f"the manifest does not hash to the Docker-Content-Digest the mirror sent ({claimed})")
        return self.name, data

    def open_blob(self, digest: str, headers: dict) -> "_BlobResponse":
        """A GET of the blob, following allowed redirects. The caller closes the response.
        Network failures come out as _Transient."""
        url = self.direct.get(digest) or f"{self._repo()}/blobs/{digest}"
        for _ in range(MAX_REDIRECTS + 1):
            r = _BlobResponse.get(url, {**self.headers, **headers})
            location = r.headers.get("location")
            if r.status_code in (301, 302, 303, 307, 308) and location:
                r.close()
                target = urllib.parse.urljoin(url, location)
                _check_redirect(url, target, self.insecure)
                url = target
                continue
            self.direct[digest] = url
            return r
        raise MirrorError(f"more than {MAX_REDIRECTS} redirects for blob {digest}")


def _peek(r: httpx.Response) -> str:
    try:
        return _read_capped(r, 4096, "error body", strict=False).decode("utf-8", "replace").strip()
    except (httpx.HTTPError, MirrorError):
        return ""


def _refuse_encoding(r, what: str) -> None:
    enc = r.headers.get("content-encoding", "identity").strip().lower()
    if enc not in ("", "identity"):
        raise MirrorError(
            f"the mirror sent the {what} {enc}-encoded although identity was requested; refused "
            "(a compressed body can expand without bound)"
        )


def _read_capped(r: httpx.Response, cap: int, what: str, strict: bool = True) -> bytes:
    buf = bytearray()
    for chunk in r.iter_raw(65536):
        buf += chunk
        if len(buf) > cap:
            if not strict:
                return bytes(buf[:cap])
            raise MirrorError(f"the {what} is larger than {cap} bytes; refused")
    return bytes(buf)


class _Transient(Exception):
    """A failure worth retrying: connection dropped, body ended early, server busy."""


class _NoRanges(Exception):
    """The mirror ignores Range; the blob is fetched in one request from byte 0."""


def _proxy_for(url: urllib.parse.ParseResult) -> urllib.parse.ParseResult | None:
    if is_loopback(url.hostname or "") or urllib.request.proxy_bypass(url.hostname or ""):
        return None
    proxy = urllib.request.getproxies().get(url.scheme)
    return urllib.parse.urlparse(proxy) if proxy else None


class _BlobResponse:
    """One blob GET over http.client: its `readinto` fills a reused buffer straight from the socket, about
    2.5x the throughput of httpx's streaming on this path (the bulk of a pull)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self.conn, self.resp = conn, resp
        self.status_code = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    @classmethod
    def get(cls, url: str, headers: dict) -> "_BlobResponse":
        u = urllib.parse.urlparse(url)
        proxy = _proxy_for(u)
        # Through an http proxy the request line carries the whole URL; otherwise (or tunnelled) just the path.
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        target = url if proxy is not None and u.scheme == "http" else path
        via = proxy or u
        conn_cls = http.client.HTTPSConnection if via.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(via.hostname, via.port, timeout=STALL_S)
        if proxy is not None and u.scheme == "https":
            conn.set_tunnel(u.hostname, u.port or 443)
        try:
            conn.request("GET", target, headers=headers)
            return cls(conn, conn.getresponse())
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _Transient(f"{type(e).__name__}: {e}") from None

    def chunks(self, buf: memoryview) -> Iterator[memoryview]:
        while True:
            try:
                n = self.resp.readinto(buf)
            except (OSError, http.client.HTTPException) as e:
                raise _Transient(f"{type(e).__name__}: {e}") from None
            if not n:
                return
            yield buf[:n]

    def peek(self) -> str:
        try:
            return self.resp.read(4096).decode("utf-8", "replace").strip()
        except (OSError, http.client.HTTPException):
            return ""

    def close(self) -> None:
        self.conn.close()
