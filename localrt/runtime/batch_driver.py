"""One loaded model's decode loop: a thread that owns the model and a `Batcher`, so that the requests running on
the model (up to LOCALRT_NUM_PARALLEL of them) are stepped together (continuous batching).

`submit` (any thread) queues a sequence and returns its events (Token ... Done) as a `Submission`; the driver
admits queued sequences while the Batcher has a free slot, steps, and sends each sequence's events to its
channel (runtime.channel), which the caller reads directly: a thread blocking, an event loop per wake-up. `exclusive()` runs work that uses slot 0 on its own (embeddings): it waits until no
sequence holds a slot, and nothing is admitted while it runs. The Batcher keeps each sequence's numerics the same
alone or batched, so a request's greedy output does not depend on what runs beside it.

Slots are shared by client (jobs.Stream sets CLIENT around the work that submits): a free slot goes to the waiting request of the
client holding the fewest, and while a client holds more than its share and another waits below its own, the
first one's newest request is paused (localrt.runtime.fairness): parked out of its slot, preempted as when the KV
pool runs dry, and back in line to resume with the tokens it would have given anyway (localrt.engine.preempt)."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any

from ..engine.batch import Batcher
from ..engine.preempt import parkable
from ..errors import Cancelled
from . import fairness
from .channel import END, ERROR, Channel
from .jobs import CLIENT

log = logging.getLogger("localrt.service")
MAX_CLIENTS = 4096  # clients whose last admission is remembered for the order of the waiting ones


@dataclass(eq=False)
class _Ticket:
    """One request in the driver: who sent it, when it came, where its events go; its sequence once admitted."""

    client: str
    arrival: int
    out: Channel  # lists of events, then the end (True: dropped before its prompt was evaluated) or an error
    call: tuple  # (args, kwargs) of Batcher.add
    seq: Any = None  # its Sequence once admitted; kept while it is parked for fairness

    def cancelled(self) -> bool:
        return self.seq.is_cancelled() if self.seq is not None else self.call[1]["cancelled"].is_set()


class _Either:
    """Set when the request's cancel flag or the consumer's own (it stopped reading) is set."""

    def __init__(self, outer: threading.Event | None) -> None:
        self.outer = outer
        self.inner = threading.Event()

    def is_set(self) -> bool:
        return self.inner.is_set() or (self.outer is not None and self.outer.is_set())


class Submission:
    """One sequence's events as the driver sends them: iterate it (blocking) or `await drain()` from an event loop
    (every event waiting, per wake-up); `close()` drops the sequence at the driver's next step. It ends when the
    sequence finishes, raising the sequence's error, or Cancelled where it was dropped before its prompt ran."""

    def __init__(self, driver: "BatchDriver", out: Channel, flag: _Either) -> None:
        self._driver = driver
        self._out = out  # lists of events, then the end (True: dropped before its prompt ran) or an error
        self._flag = flag
        self._ready: collections.deque = collections.deque()  # events received, not yet handed out
        self._ended = False
        self._error: BaseException | None = None  # raised once the events before it are out

    def __iter__(self) -> "Submission":
        return self

    def __next__(self):
        while not self._ready:
            if self._ended:
                self._raise_end()
            self._take(self._out.get())
        return self._ready.popleft()

    async def drain(self) -> tuple[list, bool]:
        """(every event waiting, at least one unless it ended; whether it ended)."""
        if not self._ready and not self._ended:
            for entry in await self._out.drain():
                self._take(entry)
        items = list(self._ready)
        self._ready.clear()
        if items:
            return items, self._ended and self._error is None
        try:
            self._raise_end()
        except StopIteration:
            return [], True

    def _take(self, entry: tuple) -> None:
        kind, value = entry
        if kind not in (END, ERROR):
            self._ready.extend(value)
            return
        self._ended = True
        self._error = value if kind == ERROR else Cancelled() if value else None
        self.close()

    def _raise_end(self):
        err, self._error = self._error, None
        if err is not None:
            raise err
        raise StopIteration

    def close(self) -> None:
        """Stop reading: the driver drops the sequence at its next step (a no-op once it ended)."""
        if not self._flag.inner.is_set():
            self._flag.inner.set()
            self._driver._wake()

    def __del__(self) -> None:
        self._flag.inner.set()  # a dropped reader must not keep a slot (the driver sees it at its next step)


class BatchDriver:
    pauses = True  # a client over its share of the slots gives one back (fairness.pausable)

    def __init__(self, model: Any, n_slots: int, drafter: Any = None) -> None:
        self.model = model
        self._batcher = Batcher(model, n_slots, drafter=drafter)  # drafter: the draft model loaded beside it
        self._cv = threading.Condition()
        self._pending: list[_Ticket] = []  # waiting for a slot: new requests, and admitted ones parked for fairness
        self._routes: dict[int, _Ticket] = {}  # id(sequence) -> its ticket, while it is admitted (running or parked)
        self._arrivals = itertools.count()
        self._served: collections.OrderedDict[str, int] = collections.OrderedDict()  # client -> its last admission
        self._held = 0  # sequences holding a slot (after the last admission or step)
        self._exclusive = 0  # exclusive() callers waiting or running: nothing is admitted meanwhile
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="localrt-batch", daemon=True)
        self._thread.start()

    @property
    def n_slots(self) -> int:
        return self._batcher.n_slots

    @property
    def slots_in_use(self) -> int:
        return self._held

    def submit(
        self,
        ids,
        options,
        constraint=None,
        cancelled: threading.Event | None = None,
        load_duration_ns: int = 0,
        **sampling,
    ) -> "Submission":
        """The events of one sequence (a Submission: iterate it, or drain it from an event loop); closing it early
        drops the sequence at the next step. Raises as `Batcher.add` does (ContextLengthExceeded, ...), and
        Cancelled if cancelled during its prompt. `sampling`: Batcher.add's logprobs and logit_bias."""
        flag = _Either(cancelled)
        out = Channel()
        with self._cv:
            if self._closed:
                raise Cancelled("the model is being unloaded")
            call = (
                (ids, options),
                dict(constraint=constraint, cancelled=flag, load_duration_ns=load_duration_ns, **sampling),
            )
            self._pending.append(_Ticket(CLIENT.get(), next(self._arrivals), out, call))
            self._cv.notify_all()
        return Submission(self, out, flag)

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        """Hold the model alone (no sequence in a slot, none admitted) for the body of the with."""
        with self._cv:
            self._exclusive += 1
            self._cv.notify_all()
            try:
                self._cv.wait_for(lambda: self._held == 0 and not self._running_exclusive)
            except BaseException:
                self._exclusive -= 1
                raise
            self._running_exclusive = True
        try:
            yield self.model
        finally:
            with self._cv:
                self._running_exclusive = False
                self._exclusive -= 1
                self._cv.notify_all()

    _running_exclusive = False

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- the driver thread ------------------------------------------------------------------------

    def _admit(self) -> None:
        """Under the lock: end the cancelled waiters, then fill the free slots in fair order, parking a client's
        newest running sequence while another client below its share waits (fairness.victim)."""
        for t in [t for t in self._pending if t.cancelled()]:
            self._pending.remove(t)
            self._drop(t)
        while not self._exclusive:
            while self._pending and self._batcher.free_slots > 0:
                self._start(self._next())
            if not self._pending or not self._park_one():
                break
        self._held = len(self._batcher.sequences)

    def _next(self) -> _Ticket:
        """The waiting ticket the next free slot goes to, taken off the line."""
        holders = [self._routes[id(s)].client for s in self._batcher.sequences]
        t = fairness.first(
            self._pending, holders, lambda t: t.client, lambda t: t.arrival, lambda c: self._served.get(c, -1)
        )
        self._pending.remove(t)
        self._served[t.client] = next(self._arrivals)
        self._served.move_to_end(t.client)
        while len(self._served) > MAX_CLIENTS:
            self._served.popitem(last=False)  # forgotten clients count as never served, as in the scheduler
        return t

    def _start(self, t: _Ticket) -> None:
        """t takes a free slot: a new request is added (its error goes to its consumer), a parked one unparked."""
        if t.seq is not None:
            self._batcher.unpark(t.seq)  # it resumes from its cached prefix (preempt.resume_waiting)
            return
        args, kwargs = t.call
        try:
            t.seq = self._batcher.add(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the request's own error (context length, bad ids)
            t.out.fail(exc)
            return
        self._routes[id(t.seq)] = t

    def _park_one(self) -> bool:
        """Park one running sequence for a waiting client's request, if fairness.victim names one."""
        b = self._batcher
        holders = [(self._routes[id(s)].client, self._routes[id(s)].arrival, s) for s in b.sequences]
        seq = fairness.victim(holders, [t.client for t in self._pending], b.n_slots, parkable)
        if seq is None:
            return False
        t = self._routes[id(seq)]
        log.info(
            "a request of client %r paused after %d tokens: %d clients share %d slots",
            t.client,
            seq.n_gen,
            len({c for c, _, _ in holders} | {w.client for w in self._pending}),
            b.n_slots,
        )
        b.park(seq)
        self._pending.append(t)
        return True

    def _drop(self, t: _Ticket) -> None:
        """A cancelled waiter ends: Cancelled for one whose prompt was never evaluated (as a dropped sequence)."""
        if t.seq is not None:
            del self._routes[id(t.seq)]
            t.seq.state = "cancelled"
        t.out.end(t.seq is None or not t.seq.prefilled)

    def _loop(self) -> None:
        b = self._batcher
        while True:
            with self._cv:
                while True:
                    self._admit()
                    if self._held:
                        break
                    if self._closed:
                        for t in self._pending:
                            t.out.fail(Cancelled("the model is being unloaded"))
                        self._pending.clear()
                        return
                    self._cv.wait()
            try:
                results = b.step()
            except BaseException as exc:  # noqa: BLE001 - every sequence in the batch fails with it
                b.close()
                for t in self._routes.values():  # the parked ones too: their batch failed under them
                    t.out.fail(exc)
                self._routes.clear()
                with self._cv:
                    self._pending = [t for t in self._pending if t.seq is None]
                    self._held = len(b.sequences)
                    self._cv.notify_all()
                continue
            with self._cv:  # before any event goes out: a consumer that saw its Done sees its slot free
                self._held = len(b.sequences)
                if not self._held:
                    self._cv.notify_all()  # exclusive() waits for this
            for seq, events in results:
                out = self._routes[id(seq)].out
                if events:
                    out.send(events)
                if seq.finished:
                    del self._routes[id(seq)]
                    out.end(seq.state == "cancelled" and not seq.prefilled)
