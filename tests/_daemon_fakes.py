"""A scripted engine for daemon tests: a real daemon (uvicorn, Guard, server, Service, Scheduler) whose model
loader returns a fake model that blocks where a test tells it to and records what it was asked to do.

Markers in the prompt text choose the behaviour of one generation:
  [prefill-gate]  block before the first token (prompt evaluation) until `lab.prefill_release` is set
  [decode-gate]   block after the first token until `lab.decode_release` is set
  [slow]          sleep SLOW_TOKEN_S before every token
  [eos]           end with done_reason "stop" (as a model's end-of-generation token does), not "length"
Every wait is bounded (GATE_TIMEOUT_S), so a broken test cannot hang the worker forever.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

from localrt import config as cfg
from localrt.serve.daemon import BackgroundServer, free_port
from localrt.engine.events import Done, Token
from localrt.runtime.service import Service

MODEL = "smollm2:135m"  # the built-in record (real manifest, template, params); only the loader is fake
GATE_TIMEOUT_S = 20.0
SLOW_TOKEN_S = 0.005
DEFAULT_TOKENS = 10_000  # num_predict -1: a bounded "long" answer (~50 s when [slow]) that only a cancel cuts short


@dataclasses.dataclass
class Run:
    """One call of FakeModel.generate, as the worker saw it."""

    text: str
    num_predict: int
    options: dict = dataclasses.field(default_factory=dict)  # the resolved options the engine was given
    tokens: int = 0
    started: threading.Event = dataclasses.field(default_factory=threading.Event)
    in_prefill: threading.Event = dataclasses.field(default_factory=threading.Event)
    in_decode: threading.Event = dataclasses.field(default_factory=threading.Event)
    closed: threading.Event = dataclasses.field(default_factory=threading.Event)
    cancelled: bool = False  # the consumer closed the generator before it finished (GeneratorExit)
    finished: bool = False  # it yielded its Done


class Lab:
    """What the fake loader and models share with the test: gates, and a record of loads and runs."""

    def __init__(self) -> None:
        self.load_gate = threading.Event()
        self.load_gate.set()  # loads pass unless a test clears this
        self.load_entered = threading.Event()
        self.prefill_release = threading.Event()
        self.decode_release = threading.Event()
        self.loads = 0
        self.loaded_from: list[tuple[str, dict]] = []  # (weights path, device options) per load
        self.closes = 0
        self.runs: list[Run] = []
        self._lock = threading.Lock()

    def load_model(self, path, num_ctx: int = 4096, num_batch: int = 512, **_device) -> "FakeModel":
        with self._lock:
            self.loads += 1
            self.loaded_from.append((str(path), dict(_device)))
        self.load_entered.set()
        if not self.load_gate.wait(GATE_TIMEOUT_S):
            raise RuntimeError("test load gate never opened")
        return FakeModel(self, num_ctx)

    def runs_with(self, marker: str) -> list[Run]:
        with self._lock:
            return [r for r in self.runs if marker in r.text]

    def wait_run(self, marker: str, timeout: float = 10.0) -> Run:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.runs_with(marker)
            if found:
                return found[-1]
            time.sleep(0.01)
        raise AssertionError(f"no generation with {marker!r} started within {timeout} s")

    def generate(self, model: "FakeModel", ids, options: dict, cancelled: threading.Event | None) -> Iterator:
        text = model.detokenize(ids)
        limit = options.get("num_predict", -1)
        run = Run(text, limit if limit >= 0 else DEFAULT_TOKENS, dict(options))
        with self._lock:
            self.runs.append(run)
        return self._events(run, len(ids), cancelled)

    def _events(self, run: Run, n_prompt: int, cancelled: threading.Event | None) -> Iterator:
        run.started.set()
        try:
            if "[prefill-gate]" in run.text:
                run.in_prefill.set()
                deadline = time.monotonic() + GATE_TIMEOUT_S
                while not self.prefill_release.wait(0.01) and time.monotonic() < deadline:
                    if cancelled is not None and cancelled.is_set():
                        run.cancelled = True  # stopped inside prompt evaluation, as a chunked prefill would
                        return
            for i in range(run.num_predict):
                if "[decode-gate]" in run.text and i == 1:
                    run.in_decode.set()
                    self.decode_release.wait(GATE_TIMEOUT_S)
                if "[slow]" in run.text:
                    time.sleep(SLOW_TOKEN_S)
                run.tokens += 1
                yield Token(token=ord("x"), text="x")
            run.finished = True
            yield Done(
                done_reason="stop" if "[eos]" in run.text else "length",
                prompt_eval_count=n_prompt,
                prompt_eval_duration=1,
                eval_count=run.tokens,
                eval_duration=1,
                total_duration=2,
                context=[],
            )
        except GeneratorExit:
            run.cancelled = True
            raise
        finally:
            run.closed.set()


class FakeModel:
    """What Service needs from a loaded model: generate, tokenize, detokenize, metadata, num_ctx, close."""

    metadata: dict = {}  # the built-in record carries its own TEMPLATE, so no GGUF template is needed

    def __init__(self, lab: Lab, num_ctx: int):
        self.lab = lab
        self.num_ctx = num_ctx

    def tokenize(self, text: str, special: bool = True, limit: int | None = None) -> list[int]:
        text = text if limit is None else text[: limit + 1]  # as Model.tokenize: stops once past the limit
        return [ord(c) for c in text]  # one id per character: the prompt text round-trips exactly

    def detokenize(self, ids) -> str:
        return "".join(chr(i) for i in ids)

    def generate(
        self, ids, options: dict, cancelled: threading.Event | None = None, constraint=None, cache_scope: str = ""
    ) -> Iterator:
        if constraint is not None:
            raise AssertionError("the fake model does not do structured outputs")
        return self.lab.generate(self, ids, options, cancelled)

    def close(self) -> None:
        with self.lab._lock:
            self.lab.closes += 1


_BUILTIN_STORE: list[Path] = []  # this test process's store holding the built-in chat model, made once


def seeded(models_dir: Path) -> Path:
    """models_dir, given the built-in chat model (MODEL) where it is still empty: hard links to a store made once
    per test process, instead of the built-in created again for each daemon. A daemon's store never writes a file
    in place (new files are renamed in, deleted ones unlinked), so no test's store reaches another's."""
    models_dir = Path(models_dir)
    if models_dir.exists() and any(models_dir.iterdir()):
        return models_dir
    if not _BUILTIN_STORE:
        import atexit
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="localrt-builtin-store-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        made = root / "models"
        conf = dataclasses.replace(cfg.load({}), models_dir=made, readonly_models_dirs=(), data_dir=root / "data")
        service = Service(conf)
        try:
            service.record(MODEL)
        finally:
            service.close()
        _BUILTIN_STORE.append(made)
    models_dir.parent.mkdir(parents=True, exist_ok=True)
    if models_dir.exists():
        models_dir.rmdir()
    shutil.copytree(_BUILTIN_STORE[0], models_dir, copy_function=os.link)
    return models_dir


def make_config(models_dir: Path, **overrides) -> cfg.Config:
    base = dataclasses.replace(
        cfg.load({}), host="127.0.0.1", port=free_port(), models_dir=Path(models_dir), readonly_models_dirs=()
    )
    # One request at a time per model unless a test asks for more: the fakes' queue/503/cancel tests count on it.
    # A fixed context: the fake models allocate nothing, and the automatic choice would read the real file's header
    # before the first request is queued (tests that time a disconnect to half a second count on it being quick).
    return dataclasses.replace(base, **{"num_parallel": 1, "context_length": 4096, **overrides})


@contextlib.contextmanager
def fake_daemon(models_dir: Path, service_kw: dict | None = None, **overrides):
    """A real daemon on a free loopback port over a Service whose loader is a Lab. Yields (server, lab).
    `service_kw`: more keyword arguments for Service (e.g. gpu_probe); `overrides`: Config fields."""
    lab = Lab()
    conf = make_config(seeded(models_dir), **overrides)
    service = Service(conf, load_model=lab.load_model, **(service_kw or {}))
    try:
        with BackgroundServer(service, conf) as srv:
            srv.service = service
            yield srv, lab
    finally:
        lab.load_gate.set()  # never leave a worker waiting on a gate
        lab.prefill_release.set()
        lab.decode_release.set()
        service.close()


@contextlib.contextmanager
def real_daemon(models_dir: Path, service_kw: dict | None = None, **overrides):
    """A real daemon over a real Service (the built-in models load for real) on a free loopback port, with the
    configuration's defaults but for `overrides` (Config fields). Yields the server."""
    conf = dataclasses.replace(
        cfg.load({}), port=free_port(), models_dir=seeded(models_dir), readonly_models_dirs=(), **overrides
    )
    service = Service(conf, **(service_kw or {}))
    try:
        with BackgroundServer(service, conf) as srv:
            yield srv
    finally:
        service.close()


@contextlib.contextmanager
def scripted_daemon(models_dir: Path, script: "Script", name: str, template: str):
    """real_daemon over a Script's loader, with model `name` created from smollm2:135m under `template` (what the
    model says is the script's; the prompt it was given, the script's `prompts`). Yields (server, ollama client)."""
    import ollama

    with real_daemon(models_dir, service_kw={"load_model": script.load}) as srv:
        client = ollama.Client(host=srv.url)
        client.create(model=name, from_="smollm2:135m", template=template)
        yield srv, client


@contextlib.contextmanager
def pinned_daemon(models_dir: Path, **overrides):
    """A real daemon over a real Service (the real loader, quantizer and templates) with make_config's pinned
    settings (one request at a time, a fixed 4096 context) but for `overrides`. Yields the server, its `service`
    attached."""
    conf = make_config(seeded(models_dir), **overrides)
    service = Service(conf)
    try:
        with BackgroundServer(service, conf) as srv:
            srv.service = service
            yield srv
    finally:
        service.close()


def create_from_file(url: str, name: str, path: Path) -> None:
    """Creates model `name` on the daemon at url from the GGUF at path, as a client does: the file uploaded as a
    blob, then /api/create naming it."""
    import hashlib

    import httpx

    data = Path(path).read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = httpx.post(f"{url}/api/blobs/{digest}", content=data, timeout=30)
    assert r.status_code in (200, 201), r.text
    r = httpx.post(url + "/api/create", json={"model": name, "files": {"m.gguf": digest}, "stream": False}, timeout=60)
    assert r.status_code == 200, r.text


def raw_request(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send bytes on a fresh socket and read the reply until the server closes or the status line and headers
    (and, with Content-Length, the body) are in."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return read_reply(s)


def read_reply(s: socket.socket) -> bytes:
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return buf
        if not chunk:
            return buf
        buf += chunk
        head, sep, body = buf.partition(b"\r\n\r\n")
        if sep:
            length = [
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            if length and len(body) >= length[0]:
                return buf


def status_of(reply: bytes) -> int:
    assert reply.startswith(b"HTTP/1.1 "), reply[:200]
    return int(reply.split(b" ", 2)[1])


def wait_until(pred, timeout: float, what: str, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class ScriptModel:
    """Answers every prompt with `script.answer`, split into pieces of `script.piece` characters; records the prompts
    it saw (the text of a tool call or a reasoning block, as a test writes it)."""

    metadata: dict = {}

    def __init__(self, script: "Script", num_ctx: int):
        self.script, self.num_ctx = script, num_ctx

    def tokenize(self, text: str, special: bool = True, limit: int | None = None) -> list[int]:
        text = text if limit is None else text[: limit + 1]  # as Model.tokenize: stops once past the limit
        return [ord(c) % 256 for c in text]

    def detokenize(self, ids) -> str:
        return "".join(chr(i) for i in ids)

    def generate(self, ids, options, cancelled=None, constraint=None, cache_scope=""):
        self.script.prompts.append(self.detokenize(ids))
        step = self.script.piece
        pieces = [self.script.answer[i : i + step] for i in range(0, len(self.script.answer), step)]
        for p in pieces:
            yield Token(token=1, text=p)
        yield Done(done_reason="stop", prompt_eval_count=len(ids), eval_count=len(pieces))

    def close(self) -> None:
        pass


@dataclasses.dataclass
class Script:
    """A Service's `load_model` whose models all answer `answer`."""

    answer: str = ""
    piece: int = 5
    prompts: list = dataclasses.field(default_factory=list)

    def load(self, path, num_ctx: int = 4096, num_batch: int = 512, **_device) -> ScriptModel:
        return ScriptModel(self, num_ctx)
