"""HTTP client for the daemon, used by the CLI. Streams parsed NDJSON events; raises ApiError on failure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

from .. import config as _config


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class DaemonUnreachable(ConnectionError):
    pass


class DaemonGone(DaemonUnreachable):
    """The daemon was reached, then closed the connection (or stopped answering) before its reply was whole."""


def _gone(e: httpx.TransportError) -> DaemonGone:
    return DaemonGone(f"the daemon closed the connection before the reply was complete ({type(e).__name__})")


def _message(resp: httpx.Response) -> str:
    """One line for an error reply: localrt's own message, else what answered (another web server on the port
    answers HTML, which is never printed)."""
    try:
        body = resp.json()
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return body["error"]
    except ValueError:
        pass
    if not resp.content:
        return {499: "request canceled"}.get(resp.status_code) or resp.reason_phrase or f"HTTP {resp.status_code}"
    kind = resp.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    if "json" not in kind and not kind.startswith("text/plain"):
        url = resp.request.url
        return (
            f"{url.scheme}://{url.host}:{url.port} answered HTTP {resp.status_code} with {kind}: it is not "
            "localrt (another server holds this address?); set LOCALRT_HOST to localrt's address"
        )
    return resp.text.strip().splitlines()[0][:300]


class Client:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float | None = None):
        cfg = _config.load()
        self.base_url = base_url or cfg.base_url
        key = api_key if api_key is not None else cfg.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.ConnectError as e:
            raise DaemonUnreachable(f"could not connect to localrt at {self.base_url}: {e}") from None
        except httpx.TransportError as e:
            raise _gone(e) from None
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, _message(resp))
        return resp

    def _stream(self, path: str, body: dict) -> Iterator[dict]:
        try:
            with self._http.stream("POST", path, json=body) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise ApiError(resp.status_code, _message(resp))
                for line in resp.iter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if isinstance(event, dict) and event.get("error"):
                        raise ApiError(500, event["error"])
                    yield event
        except httpx.ConnectError as e:
            raise DaemonUnreachable(f"could not connect to localrt at {self.base_url}: {e}") from None
        except httpx.TransportError as e:
            raise _gone(e) from None

    # health
    def version(self) -> str:
        return self._request("GET", "/api/version").json()["version"]

    def is_running(self) -> bool:
        try:
            self._http.get("/", timeout=2.0)
            return True
        except httpx.HTTPError:
            return False

    def kernels(self) -> dict | None:
        """The daemon's kernel compiling (GET /api/kernels); None where it does not say (an older daemon, no reply)."""
        try:
            resp = self._http.get("/api/kernels")
            body = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        ok = (
            isinstance(body, dict) and isinstance(body.get("compiled"), int) and isinstance(body.get("compiling"), bool)
        )
        return body if ok else None

    # inference
    def generate(self, model: str, prompt: str = "", stream: bool = True, **fields: Any) -> Iterator[dict]:
        body = {"model": model, "prompt": prompt, "stream": stream, **_drop_none(fields)}
        if stream:
            return self._stream("/api/generate", body)
        return iter([self._request("POST", "/api/generate", json=body).json()])

    def chat(self, model: str, messages: list[dict], stream: bool = True, **fields: Any) -> Iterator[dict]:
        body = {"model": model, "messages": messages, "stream": stream, **_drop_none(fields)}
        if stream:
            return self._stream("/api/chat", body)
        return iter([self._request("POST", "/api/chat", json=body).json()])

    # models
    def list(self) -> list[dict]:
        return self._request("GET", "/api/tags").json()["models"]

    def ps(self) -> list[dict]:
        return self._request("GET", "/api/ps").json()["models"]

    def show(self, model: str, verbose: bool = False) -> dict:
        return self._request("POST", "/api/show", json={"model": model, "verbose": verbose}).json()

    def embed(self, body: dict) -> dict:
        return self._request("POST", "/api/embed", json=body).json()

    def delete(self, model: str) -> None:
        self._request("DELETE", "/api/delete", json={"model": model})

    def copy(self, source: str, destination: str) -> None:
        self._request("POST", "/api/copy", json={"source": source, "destination": destination})

    def create(self, body: dict) -> Iterator[dict]:
        return self._stream("/api/create", {**body, "stream": True})

    def pull(self, model: str, insecure: bool = False) -> Iterator[dict]:
        return self._stream("/api/pull", {"model": model, "insecure": insecure, "stream": True})

    def push(self, model: str, insecure: bool = False) -> Iterator[dict]:
        return self._stream("/api/push", {"model": model, "insecure": insecure, "stream": True})

    def create_blob(self, path: Path, digest: str, progress: Callable[[int], None] | None = None) -> None:
        """Upload `path` as blob `digest` unless the daemon has it; `progress(bytes sent)` as it goes."""
        if self._http.head(f"/api/blobs/{digest}").status_code == 200:
            return
        with open(path, "rb") as fh:
            self._request("POST", f"/api/blobs/{digest}", content=_chunks(fh, progress))


def _chunks(fh, progress: Callable[[int], None] | None = None, size: int = 1 << 20) -> Iterator[bytes]:
    sent = 0
    while True:
        block = fh.read(size)
        if not block:
            return
        yield block
        sent += len(block)
        if progress is not None:
            progress(sent)


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}
