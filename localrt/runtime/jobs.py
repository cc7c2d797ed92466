"""What the scheduler moves around: a request, its job in a queue, a loaded model's runner, the stream a caller
reads, and the memory a load needs. Plain data plus the little logic each owns; the rules live in scheduler.py."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, Mapping

from ..api.options import LOAD_TIME, Options, resolve
from ..errors import NonFiniteOutput
from .channel import END, ERROR, Channel

_END = object()  # a plain work's iterator is done
_CLOSED = iter(())  # a stream's source once closed: reads as empty

_UNSET = object()  # a request that did not say keep_alive
# Who sent the request being handled: set by the HTTP edge (serve/security.py) for the task of each request and
# carried into the worker threads it calls the service from, and by each job's Stream around the work it runs (the
# model's BatchDriver shares its slots by it); "" outside HTTP (one client: arrival order).
CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("localrt_client", default="")
# Whether the request comes from this machine itself (a loopback peer, not forwarding for someone else): only
# such a caller may name paths on the server (pull from a folder). True outside HTTP (the CLI, tests).
LOCAL_CALLER: contextvars.ContextVar[bool] = contextvars.ContextVar("localrt_local_caller", default=True)
DEFAULT_MAX_LOADED = 3  # Ollama's "auto" on a CPU-only machine
AUTO_PARALLEL = (
    4  # LOCALRT_NUM_PARALLEL=0 (the default): 4 requests per model where 4 KV slots fit in memory, as Ollama
)


@dataclass(frozen=True)
class MemoryNeed:
    private: int  # bytes allocated by the load (KV cache, scratch): must fit in available RAM
    mapped: int = 0  # bytes of weights read through mmap: page cache, reclaimable, not checked


@dataclass
class Request:
    """What `submit` takes. `options`: resolved Options (or an option mapping) whose load-time part picks
    the loaded instance; `keep_alive`: None when the request did not send one, else seconds or a duration
    string. `work(loaded, request, cancelled)` runs on the reader's thread once the model is granted (Stream),
    defaulting to `loaded.run(request, cancelled)`, and returns the request's events: any iterable, or one that can
    also be drained from an event loop (a Mapped batch-driver Submission), so no thread waits for the reader."""

    model: str
    options: Options | Mapping[str, Any] | None = None
    keep_alive: Any = None
    payload: Any = None
    work: Callable[[Any, "Request", threading.Event], Iterable[Any]] | None = None
    client: str | None = None  # who asked (fair share of the queue); None: the CLIENT of the calling context


@dataclass(frozen=True)
class RunnerInfo:
    """One loaded model, for /api/ps. `expires_at` None = kept until unloaded (keep_alive < 0)."""

    name: str
    size: int
    size_private: int
    size_mapped: int
    expires_at: datetime | None
    context_length: int
    load_options: dict[str, Any]
    busy: bool
    queued: int
    size_vram: int = 0  # bytes of the model in GPU memory (0: CPU only)
    slots_in_use: int = 0  # requests running on it now
    slots: Mapping[str, int] = field(default_factory=dict)  # the loaded model's KV slots and use (Loaded.slots)


def system_available_memory() -> int:
    """MemAvailable (counts reclaimable page cache), or the platform's free physical memory (engine.backends.sysmem)."""
    from ..engine.backends.sysmem import available_memory

    return available_memory()


class Cancel(threading.Event):
    """A cancel flag that also runs hooks when it is set (from any thread): the HTTP edge sets it when the client
    goes away, and a blocking service call hooks its scheduler stream's cancel() to it."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[Callable[[], Any]] = []
        self._hook_lock = threading.Lock()

    def add_hook(self, fn: Callable[[], Any]) -> None:
        with self._hook_lock:
            self._hooks.append(fn)
            now = self.is_set()
        if now:
            fn()

    def set(self) -> None:
        super().set()
        with self._hook_lock:
            hooks, self._hooks = self._hooks, []
        for fn in hooks:
            fn()


class _Job:
    def __init__(self, request: Request, load_options: dict[str, Any], keep_alive: Any, seq: int):
        self.request = request
        self.model = request.model
        self.load_options = load_options
        self.keep_alive = keep_alive
        self.seq = seq  # arrival number
        self.client = request.client if request.client is not None else CLIENT.get()
        self.need: MemoryNeed | None = None  # estimated once, outside the scheduler's lock (it reads the file)
        self.need_error: BaseException | None = None  # the estimate failed: the job fails with this
        self.estimating = False  # an estimate runs in a helper thread
        self.cancelled = threading.Event()
        self.out = Channel()  # the scheduler's word to the consumer: the loaded model granted, or the end or an error

    def fail(self, exc: BaseException) -> None:
        self.out.fail(exc)

    def end(self) -> None:
        self.out.end()


class _Runner:
    def __init__(self, key: str, load_options: dict[str, Any], keep_alive: float | None, need: MemoryNeed, now: float):
        self.key = key
        self.load_options = load_options
        self.keep_alive = keep_alive  # seconds; None = forever
        self.need = need
        self.state = "loading"  # loading -> ready -> closing -> closed
        self.loaded: Any = None
        self.queue: collections.deque[_Job] = collections.deque()
        self.active: set[_Job] = set()  # jobs running now (at most num_parallel)
        self.expires_at: float | None = None  # scheduler clock; None while busy or kept forever
        self.last_used = now
        self.thread: threading.Thread | None = None

    def accepts(self, load_options: dict[str, Any]) -> bool:
        for name in LOAD_TIME:
            want, have = load_options.get(name), self.load_options.get(name)
            if name == "num_ctx" and want is not None and have is not None:
                if want > have:
                    return False
            elif name == "draft_model" and not want:  # a request without a draft model runs on any instance
                continue
            elif want != have:
                return False
        return True

    def idle(self) -> bool:
        return self.state == "ready" and not self.active and not self.queue


class Mapped:
    """A source of events seen through `fn(event) -> list of items` (one request's replies made from the engine's
    events as they are read): iterable (blocking), drainable from an event loop where the source is, closable."""

    def __init__(self, source, fn: Callable[[Any], list]) -> None:
        self.source = source
        self.fn = fn
        self._ready: collections.deque = collections.deque()
        if hasattr(source, "drain"):
            self.drain = self._drain

    def __iter__(self) -> "Mapped":
        return self

    def __next__(self) -> Any:
        while not self._ready:
            self._ready.extend(self.fn(next(self.source)))
        return self._ready.popleft()

    async def _drain(self) -> tuple[list, bool]:
        while True:
            events, ended = await self.source.drain()
            items = [*self._ready, *(item for ev in events for item in self.fn(ev))]
            self._ready.clear()
            if items or ended:
                return items, ended

    def close(self) -> None:
        getattr(self.source, "close", lambda: None)()


class Stream:
    """The consumer's side of one request. The scheduler grants the job a loaded model (or fails or withdraws it);
    the reader then runs the request's work itself (`work(loaded, request, cancelled)`: render, tokenize, submit to
    the model's batch driver) and reads its events straight from where they are made. Iterate for events
    (blocking), or `await drain()` for all that are waiting (from an event loop: the work starts in the loop's
    executor, then its events come with no thread waiting); `cancel()` (or `close()`) from any thread stops the work
    at its next step and gives the job's slot back. An exception raised by the load or the work is re-raised here."""

    def __init__(self, scheduler, job: _Job):  # scheduler: the Scheduler that queued the job
        self._scheduler = scheduler
        self._job = job
        self._finished = False
        self._source: Any = None  # the work's events, once granted and started
        self._pulling = threading.Lock()  # held while the reader pulls from the source: cancel() closes it only then
        self._ctx = contextvars.copy_context()  # the work runs as its client's (the driver shares slots by it)
        self._ctx.run(CLIENT.set, job.client)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        try:
            if self._source is None:
                loaded = self._grant(self._job.out.get())
                if self._job.cancelled.is_set():  # cancelled as it was granted: no work to start
                    raise StopIteration
                self._start(loaded)
            if self._job.cancelled.is_set():
                raise StopIteration
            return self._pull()
        except BaseException as exc:
            self._end(exc)
            raise

    async def drain(self) -> tuple[list, bool]:
        """(every event waiting, at least one unless the stream ended; whether it ended). An error is raised once
        the events before it are out."""
        if self._finished:
            return [], True
        try:
            if self._source is None:
                loaded = self._grant((await self._job.out.drain())[0])  # one entry: the grant, an end or an error
                if self._job.cancelled.is_set():  # cancelled as it was granted: no work to start
                    raise StopIteration
                await asyncio.get_running_loop().run_in_executor(None, self._start, loaded)
            if self._job.cancelled.is_set():
                raise StopIteration
            drain = getattr(self._source, "drain", None)
            if drain is not None:
                items, ended = await drain()
            else:  # a plain iterable work (one reply): pulled in the executor
                item = await asyncio.get_running_loop().run_in_executor(None, self._pull, _END)
                items, ended = ([], True) if item is _END else ([item], False)
        except StopIteration as exc:
            self._end(exc)
            return [], True
        except BaseException as exc:
            self._end(exc)
            raise
        if ended:
            self._end(StopIteration())
        return items, ended

    def _grant(self, entry: tuple[str, Any]) -> Any:
        """The loaded model the scheduler granted; raises as the job ended before (withdrawn, failed)."""
        kind, value = entry
        if kind == ERROR:
            raise value
        if kind == END:
            raise StopIteration
        return value

    def _start(self, loaded: Any) -> None:
        req = self._job.request
        cancelled = self._job.cancelled
        work = req.work if req.work is not None else lambda loaded, req, cancelled: loaded.run(req, cancelled)
        self._source = iter(self._ctx.run(work, loaded, req, cancelled))

    def _pull(self, *default: Any) -> Any:
        """The source's next item (or `default` at its end), on the reader's thread."""
        with self._pulling:
            try:
                return self._ctx.run(next, self._source, *default)
            finally:
                if self._job.cancelled.is_set():  # cancelled meanwhile: nobody reads on
                    self._close_source()

    def _end(self, exc: BaseException) -> None:
        """The stream is over (exc: StopIteration, or what it fails with): close the work, give the slot back."""
        if self._finished:
            return
        self._finished = True
        self._job.cancelled.set()  # nothing more is read: a work still running stops at its next step
        self._close_if_idle()
        self._scheduler._withdraw(self._job)
        if isinstance(exc, NonFiniteOutput) and not exc.model:
            exc.model = self._job.model  # the engine knows its file, not the name the request used

    def cancel(self) -> None:
        """From any thread: the work stops at its next step (the model's driver drops the sequence) and the job's
        slot is given back now."""
        if not self._job.cancelled.is_set():
            self._job.cancelled.set()
            self._scheduler._withdraw(self._job)
            self._close_if_idle()

    def _close_if_idle(self) -> None:
        """Close the work's source now unless the reader is pulling from it (it closes it itself after the pull,
        seeing the cancel) or it holds the lock itself (the pull's own failure or end)."""
        if self._pulling.acquire(blocking=False):
            try:
                self._close_source()
            finally:
                self._pulling.release()

    def _close_source(self) -> None:
        source = self._source
        if source is not None and source is not _CLOSED:
            self._source = _CLOSED
            getattr(source, "close", lambda: None)()

    def close(self) -> None:
        """The reader is done (from its own thread): cancel, and close the work it was running."""
        self.cancel()
        self._end(StopIteration())

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._finished and not self._job.cancelled.is_set():
            self._job.cancelled.set()  # a dropped stream must not keep a slot: given back off the collector's path
            threading.Thread(target=self._scheduler._withdraw, args=(self._job,), daemon=True).start()


class Events:
    """What the service hands the HTTP layer: an iterator of reply dicts over a scheduler stream (or over one reply),
    with a thread-safe cancel(), and the stream's `drain` where the dicts are the stream's own events."""

    def __init__(self, it: Iterator[dict], stream=None):
        self._it = it
        self._stream = stream
        if stream is not None and it is stream:
            self.drain = stream.drain  # read from an event loop: every event waiting per wake-up (jobs.Stream)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return next(self._it)

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()


def _load_options(options: Options | Mapping[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return Options().load_options()
    if isinstance(options, Options):
        return options.load_options()
    return resolve(options).load_options()


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
