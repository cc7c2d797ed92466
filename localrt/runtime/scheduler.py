"""Which models are loaded, and who runs when: one worker thread per loaded model loads it, then grants its slots
to the requests in its bounded queue (each request's reader runs its own work: jobs.Stream).

Ollama's rules (`server/sched.go`, `shared/reference/ollama_spec.md` section 6):
- keep_alive: a request that carries one replaces the model's duration; one without leaves it alone (the
  server default applies when the model is first loaded). The expiry clock starts when the model goes
  idle; 0 unloads right after the request, negative keeps the model until it is unloaded or evicted.
- At most `max_loaded_models` models (0 = auto = 3, Ollama's CPU value); to load another, the least
  recently used idle model is unloaded. A model with work in flight is never evicted: the request waits.
- A request with a smaller num_ctx than the loaded one is served by it; a larger num_ctx or any other
  changed load-time option (num_batch, num_gpu, main_gpu, use_mmap, num_thread) reloads the model once the
  work before it is done.
- Up to `num_parallel` requests for one model run at once (the scheduler grants each a slot and the loaded model;
  its consumer runs the work and reads its events straight from the model's BatchDriver, which steps them together);
  the others wait. At most `max_queue` requests wait (not yet running, all
  models together); one more raises Busy (HTTP 503).

Fairness across clients (a client is the caller's address, see serve/security.client_key): the next request
a model serves is the waiting one whose client was served least recently (round robin; one client's requests
keep their arrival order). When the queue is full, a request from a client that was served less recently than
the client of some waiting request (or, never served either, that has fewer requests waiting) takes that
request's place: the newest request of the client served most recently gets Busy instead. So under overload
every client progresses, whatever the others send, and 503 is only ever answered with the queue at its bound.
A running request holds its slot to its end, except where a client holds more than its share of a model's slots
while another client waits: the model's driver then pauses that client's newest request (localrt.runtime.fairness).

Memory: `estimate_fn(model, load_options)` says what a load needs as `MemoryNeed(private, mapped)`. It reads
the model file, so it never runs under the scheduler's lock: `submit` runs it in the caller's thread when no
loaded model can take the request, and a job that still lacks one when it must load gets it from a helper
thread while everything else goes on (a slow file never stalls the models already loaded). Only
the private part (KV cache, scratch) must fit in available memory; weights read through mmap are file-backed
page cache that the kernel can drop and re-read, so they never block a load (Ollama refuses models that
would fit through mmap; pain_points P3.5). Private memory of idle models is freed by eviction first.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from ..api.options import parse_duration
from ..errors import Busy, Cancelled, InvalidRequest, ModelLoadError
from . import fairness
from .jobs import (
    _UNSET,
    AUTO_PARALLEL,
    CLIENT,
    DEFAULT_MAX_LOADED,
    MemoryNeed,
    Request,
    RunnerInfo,
    Stream,
    _gib,
    _Job,
    _load_options,
    _Runner,
    system_available_memory,
)

MAX_CLIENTS = 4096  # clients whose last service is remembered for fairness


class Scheduler:
    def __init__(
        self,
        load_fn: Callable[[str, dict[str, Any]], Any],
        config: Any,
        clock: Callable[[], float] = time.monotonic,
        *,
        estimate_fn: Callable[[str, dict[str, Any]], MemoryNeed | int] | None = None,
        available_fn: Callable[[], int] | None = None,
        wall_clock: Callable[[], float] = time.time,
        reap_interval: float = 1.0,
        on_unloaded: Callable[[], None] | None = None,
    ):
        parallel = getattr(config, "num_parallel", 1)
        if not 0 <= parallel <= 16:
            raise ValueError(f"LOCALRT_NUM_PARALLEL must be in 1..16 (or 0: automatic), got {parallel}")
        self.num_parallel = parallel or AUTO_PARALLEL  # auto: a model with fewer slots queues the rest (batch_driver)
        if config.max_queue < 1:
            raise ValueError(f"LOCALRT_MAX_QUEUE must be at least 1, got {config.max_queue}")
        if config.max_loaded_models < 0:
            raise ValueError(f"LOCALRT_MAX_LOADED_MODELS must be 0 (auto) or more, got {config.max_loaded_models}")
        try:
            self.default_keep_alive = parse_duration(config.keep_alive, bare_seconds=True)
        except InvalidRequest as exc:
            raise ValueError(f"LOCALRT_KEEP_ALIVE: {exc}") from None
        self.max_loaded = config.max_loaded_models or DEFAULT_MAX_LOADED
        self.max_queue = config.max_queue
        self._load_fn = load_fn
        self._clock = clock
        self._wall_clock = wall_clock
        self._estimate_fn = estimate_fn
        self._available_fn = (
            available_fn if available_fn is not None else (system_available_memory if estimate_fn is not None else None)
        )
        self._reap_interval = reap_interval
        self._on_unloaded = on_unloaded or (lambda: None)  # after a model is closed and dropped
        self._cv = threading.Condition()
        self._pending: collections.deque[_Job] = collections.deque()  # jobs not yet given to a runner
        self._runners: dict[str, _Runner] = {}  # live runners (loading or ready), by model
        self._closing: list[_Runner] = []  # retired, still releasing their model
        self._seq = itertools.count()
        self._served: collections.OrderedDict[str, int] = collections.OrderedDict()  # client -> when last served
        self._serve_seq = itertools.count()
        self._stopped = False
        self._reaper = threading.Thread(target=self._reap_loop, name="localrt-sched-reaper", daemon=True)
        self._reaper.start()

    # ---- public API ---------------------------------------------------------------------------------

    def submit(self, request: Request) -> Stream:
        """Queue a request; returns its event stream at once. Raises Busy when max_queue requests wait."""
        keep = _UNSET if request.keep_alive is None else parse_duration(request.keep_alive)
        job = _Job(request, _load_options(request.options), keep, next(self._seq))
        if self._estimate_fn is not None:
            with self._cv:
                served = self._accepting_runner(job) is not None
            if not served:
                self._fill_estimate(job)  # outside the lock
        with self._cv:
            if self._stopped:
                raise Busy("the server is shutting down")
            if self._waiting() >= self.max_queue:
                victim = self._displaced_by(job)
                if victim is None:
                    raise Busy("server busy, please try again.  maximum pending requests exceeded")
                self._unqueue(victim)
                victim.fail(Busy("server busy, please try again.  maximum pending requests exceeded"))
            self._pending.append(job)
            self._dispatch()
        return Stream(self, job)

    def ps(self) -> list[RunnerInfo]:
        """Loaded models, most recently used first."""
        with self._cv:
            self._dispatch()
            now, wall = self._clock(), self._wall_clock()
            ready = [r for r in self._runners.values() if r.state == "ready"]
            return [self._info(r, now, wall) for r in sorted(ready, key=lambda r: -r.last_used)]

    def unload(self, name: str, wait: float | None = None) -> bool:
        """Unload `name` now if idle, else right after its queued work. False if it is not loaded.
        With `wait`, block up to that many seconds until the model is released."""
        with self._cv:
            r = self._runners.get(name)
            if r is None:
                return False
            r.keep_alive = 0.0
            if r.idle():
                self._retire(r)
            if wait is not None:
                self._cv.wait_for(lambda: r.state == "closed", timeout=wait)
            return True

    def reap(self) -> None:
        """Unload models whose keep_alive has run out (the reaper thread does this on its own too)."""
        with self._cv:
            self._dispatch()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new work, fail waiting requests with Cancelled, let running ones finish for up to
        `timeout` seconds (then cancel them), and release every model."""
        with self._cv:
            self._stopped = True
            waiting = list(self._pending) + [j for r in self._runners.values() for j in r.queue]
            self._pending.clear()
            for r in list(self._runners.values()):
                r.queue.clear()
                if r.idle():
                    self._retire(r)
            self._cv.notify_all()
        for job in waiting:
            job.fail(Cancelled("the server is shutting down"))
        deadline = time.monotonic() + timeout
        with self._cv:
            if not self._cv.wait_for(self._all_closed, timeout=timeout):
                for r in list(self._runners.values()) + self._closing:
                    for job in r.active:  # their consumers stop at their next read
                        job.cancelled.set()
                    r.active.clear()
                    if r.idle():
                        self._after_work(r)
                self._cv.notify_all()
        threads = [r.thread for r in list(self._runners.values()) + self._closing if r.thread is not None]
        for t in threads + [self._reaper]:
            t.join(timeout=max(0.1, deadline - time.monotonic()))

    # ---- dispatch (always under self._cv) -------------------------------------------------------------

    def _waiting(self) -> int:
        return len(self._pending) + sum(len(r.queue) for r in self._runners.values())

    def _waiting_jobs(self) -> list[_Job]:
        return list(self._pending) + [j for r in self._runners.values() for j in r.queue]

    def _last_served(self, client: str) -> int:
        return self._served.get(client, -1)

    def _displaced_by(self, job: _Job) -> _Job | None:
        """With the queue full: the waiting job that `job` takes the place of, if its client deserves it more."""
        waiting = self._waiting_jobs()
        counts = collections.Counter(j.client for j in waiting)

        def rank(client: str, extra: int = 0) -> tuple[int, int]:  # larger = served more recently, holds more
            return self._last_served(client), counts[client] + extra

        victim = max(waiting, key=lambda j: (rank(j.client), j.seq), default=None)
        if victim is None or rank(job.client, 1) >= rank(victim.client):
            return None
        return victim

    def _unqueue(self, job: _Job) -> None:
        if job in self._pending:
            self._pending.remove(job)
            return
        for r in self._runners.values():
            if job in r.queue:
                r.queue.remove(job)
                return

    def _next_job(self, r: _Runner) -> _Job | None:
        """The job r starts now, taken off its queue (fairness.next_job: round robin across clients, and past
        num_parallel for a client below its share of the slots while another holds more); None: wait."""
        job = fairness.next_job(r, self.num_parallel, self._last_served)
        if job is None:
            return None
        r.queue.remove(job)
        self._served[job.client] = next(self._serve_seq)
        self._served.move_to_end(job.client)
        while len(self._served) > MAX_CLIENTS:
            self._served.popitem(last=False)  # forgotten clients count as never served: first in line
        return job

    def _all_closed(self) -> bool:
        return not self._runners and not self._closing

    def _dispatch(self) -> None:
        """Hand pending jobs to runners in arrival order; start, reload or evict runners as needed."""
        self._reap_expired()
        blocked: set[str] = set()  # a job that must wait holds back every later job for its model
        for job in list(self._pending):
            if job.cancelled.is_set():
                self._pending.remove(job)
                job.end()
                continue
            key = job.model
            if key in blocked:
                continue
            r = self._runners.get(key)
            if r is not None and r.accepts(job.load_options):
                self._pending.remove(job)
                self._hand(r, job)
                continue
            blocked.add(key)
            if r is not None:
                if r.idle():  # loaded with other load-time options: reload, once nothing runs on it
                    self._retire(r)
                continue
            if any(c.key == key for c in self._closing):
                continue  # the old instance is still releasing its memory
            if job.need is None and job.need_error is None and self._estimate_fn is not None:
                if not job.estimating:
                    self._estimate_later(job)
                continue  # the file is being read: other models' requests go on meanwhile
            try:
                need = self._make_room(job)
            except Exception as exc:  # estimate failed, or the model can never fit
                self._pending.remove(job)
                job.fail(exc)
                blocked.discard(key)
                continue
            if need is None:
                # Waiting for a model to be evicted: later requests wait too, or a busy model that keeps
                # getting work would never go idle (Ollama's pending queue is first-come, first-served too).
                break
            self._pending.remove(job)
            self._hand(self._start(job, need), job)
            blocked.discard(key)
        self._cv.notify_all()

    def _hand(self, r: _Runner, job: _Job) -> None:
        if job.keep_alive is not _UNSET:
            r.keep_alive = job.keep_alive
        r.queue.append(job)
        r.expires_at = None
        r.last_used = self._clock()

    def _start(self, job: _Job, need: MemoryNeed) -> _Runner:
        keep = self.default_keep_alive if job.keep_alive is _UNSET else job.keep_alive
        r = _Runner(job.model, dict(job.load_options), keep, need, self._clock())
        r.thread = threading.Thread(target=self._worker, args=(r,), name=f"localrt-worker-{job.model}", daemon=True)
        self._runners[job.model] = r
        r.thread.start()
        return r

    def _retire(self, r: _Runner) -> None:
        r.state = "closing"
        r.expires_at = None
        if self._runners.get(r.key) is r:
            del self._runners[r.key]
        self._closing.append(r)
        self._cv.notify_all()

    def _make_room(self, job: _Job) -> MemoryNeed | None:
        """The job's memory need if a new runner may start now; None to wait (evicting an idle model first)."""
        need = self._estimate(job)
        if need is None:
            return None  # being estimated: wait for it
        live = list(self._runners.values())
        count_ok = len(live) + len(self._closing) < self.max_loaded
        available = None
        if self._available_fn is not None:
            loading = sum(r.need.private for r in live if r.state == "loading")  # allocated soon, not yet
            available = self._available_fn() - loading
        if count_ok and (available is None or need.private <= available):
            return need
        if self._closing:
            return None  # memory or a slot is on its way back
        idle = [r for r in live if r.idle()]
        if idle:
            self._retire(min(idle, key=lambda r: r.last_used))
            return None
        if not live:
            raise ModelLoadError(
                f"model {job.model!r} requires more system memory ({_gib(need.private)}) "
                f"than is available ({_gib(max(available or 0, 0))})"
            )
        return None  # every loaded model is busy: wait for one to finish

    def _accepting_runner(self, job: _Job) -> _Runner | None:
        r = self._runners.get(job.model)
        return r if r is not None and r.state != "closing" and r.accepts(job.load_options) else None

    def _fill_estimate(self, job: _Job) -> None:
        """Run the estimate (never under the lock); its failure is kept for the job to fail with."""
        try:
            need = self._estimate_fn(job.model, dict(job.load_options))  # type: ignore[misc]
            job.need = need if isinstance(need, MemoryNeed) else MemoryNeed(int(need), 0)
        except Exception as exc:  # noqa: BLE001 - reported to the request
            job.need_error = exc

    def _estimate_later(self, job: _Job) -> None:
        def run() -> None:
            self._fill_estimate(job)
            with self._cv:
                job.estimating = False
                self._dispatch()

        job.estimating = True
        threading.Thread(target=run, name=f"localrt-estimate-{job.model}", daemon=True).start()

    def _estimate(self, job: _Job) -> MemoryNeed | None:
        """The job's memory need, or None while a helper thread works it out (under the lock: never reads)."""
        if job.need_error is not None:
            raise job.need_error
        if job.need is None:
            if self._estimate_fn is None:
                job.need = MemoryNeed(0, 0)
            else:
                if not job.estimating:
                    self._estimate_later(job)
                return None
        return job.need

    def _reap_expired(self) -> None:
        now = self._clock()
        for r in list(self._runners.values()):
            if self._stopped and r.idle():
                self._retire(r)
            elif r.idle() and r.expires_at is not None and now >= r.expires_at:
                self._retire(r)

    def _withdraw(self, job: _Job) -> None:
        """A consumer is done with its job: drop it if it has not started (a load in progress goes on), else give
        its slot back (its work, run by the consumer, has ended or stops at its next step)."""
        with self._cv:
            if job in self._pending:
                self._pending.remove(job)
                job.end()
            else:
                for r in [*self._runners.values(), *self._closing]:
                    if job in r.queue:
                        r.queue.remove(job)
                        job.end()
                    elif job in r.active:
                        r.active.discard(job)
                    else:
                        continue
                    if r.idle():
                        self._after_work(r)
                    break
            self._dispatch()

    def _after_work(self, r: _Runner) -> None:
        """r just went idle: start its keep_alive clock, or release it."""
        r.last_used = self._clock()
        if self._stopped or r.keep_alive == 0:
            self._retire(r)
        else:
            r.expires_at = None if r.keep_alive is None else r.last_used + r.keep_alive

    def _reap_loop(self) -> None:
        with self._cv:
            while not (self._stopped and self._all_closed()):
                self._dispatch()
                timeout = self._reap_interval
                expiries = [r.expires_at for r in self._runners.values() if r.expires_at is not None]
                if expiries:
                    timeout = min(timeout, max(min(expiries) - self._clock(), 0.001))
                self._cv.wait(timeout)

    # ---- worker thread ------------------------------------------------------------------------------

    def _worker(self, r: _Runner) -> None:
        try:
            loaded = self._load_fn(r.key, dict(r.load_options))
        except Exception as exc:
            with self._cv:
                jobs = list(r.queue)
                r.queue.clear()
                r.state = "closed"
                if self._runners.get(r.key) is r:
                    del self._runners[r.key]
                self._dispatch()
            for job in jobs:
                job.fail(exc)
            return
        with self._cv:
            r.loaded = loaded
            if r.state == "loading":
                r.state = "ready"
            if r.idle():
                self._after_work(r)  # every waiting request was withdrawn during the load
            self._dispatch()
        while True:
            with self._cv:
                while r.state == "ready" and (job := self._next_job(r)) is None:
                    self._cv.wait()
                if r.state != "ready":
                    self._cv.wait_for(lambda: not r.active)
                    break  # retired
                r.active.add(job)
            job.out.send(loaded)  # granted: the consumer runs the work (jobs.Stream) and gives the slot back
        try:
            getattr(loaded, "close", lambda: None)()
        finally:
            with self._cv:
                r.state = "closed"
                r.loaded = None
                self._closing.remove(r)
                self._dispatch()
        del loaded  # this thread's last reference: on_unloaded may hand the model's memory back
        self._on_unloaded()

    def _info(self, r: _Runner, now: float, wall: float) -> RunnerInfo:
        if r.keep_alive is None:
            expires = None
        else:
            at = r.expires_at if r.expires_at is not None else now + r.keep_alive
            expires = datetime.fromtimestamp(wall + (at - now), tz=timezone.utc)
        size = getattr(r.loaded, "size", None)
        private = r.need.private
        mapped = r.need.mapped
        total = int(size) if isinstance(size, int) and size > 0 else private + mapped
        ctx = getattr(r.loaded, "context_length", None)
        return RunnerInfo(
            name=r.key,
            size=total,
            size_private=private,
            size_mapped=mapped,
            expires_at=expires,
            context_length=int(ctx) if isinstance(ctx, int) else int(r.load_options.get("num_ctx") or 0),
            load_options=dict(r.load_options),
            busy=bool(r.active),
            slots_in_use=len(r.active),
            queued=len(r.queue),
            size_vram=min(int(getattr(r.loaded, "size_vram", 0) or 0), total),
            slots=dict(getattr(r.loaded, "slots", None) or {}),
        )


__all__ = ["CLIENT", "MemoryNeed", "Request", "RunnerInfo", "Scheduler", "Stream", "system_available_memory"]
