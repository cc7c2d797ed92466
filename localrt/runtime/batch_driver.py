"""One loaded model's decode loop: a thread that owns the model and a `Batcher`, so that the requests running on
the model (up to LOCALRT_NUM_PARALLEL of them) are stepped together (continuous batching).

`submit` (any thread) queues a sequence and returns an iterator of its events (Token ... Done); the driver
admits queued sequences while the Batcher has a free slot, steps, and routes each sequence's events to its
queue. `exclusive()` runs work that uses slot 0 on its own (embeddings): it waits until no sequence holds a
slot, and nothing is admitted while it runs. The Batcher keeps each sequence's numerics the same alone or
batched, so a request's greedy output does not depend on what runs beside it."""
from __future__ import annotations

import collections
import contextlib
import queue
import threading
from typing import Any, Iterator

from ..engine.batch import Batcher
from ..errors import Cancelled

_EVENTS, _END, _ERROR = "events", "end", "error"


class _Either:
    """Set when the request's cancel flag or the consumer's own (it stopped reading) is set."""

    def __init__(self, outer: threading.Event | None) -> None:
        self.outer = outer
        self.inner = threading.Event()

    def is_set(self) -> bool:
        return self.inner.is_set() or (self.outer is not None and self.outer.is_set())


class BatchDriver:
    def __init__(self, model: Any, n_slots: int, drafter: Any = None) -> None:
        self.model = model
        self._batcher = Batcher(model, n_slots, drafter=drafter)  # drafter: the draft model loaded beside it
        self._cv = threading.Condition()
        self._pending: collections.deque = collections.deque()  # (args, kwargs, out queue)
        self._routes: dict[int, queue.SimpleQueue] = {}  # id(sequence) -> its consumer's queue
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

    def submit(self, ids, options, constraint=None, cancelled: threading.Event | None = None,
               load_duration_ns: int = 0, **sampling) -> Iterator:
        """The events of one sequence; closing the iterator early drops the sequence at the next step.
        Raises as `Batcher.add` does (ContextLengthExceeded, ...), and Cancelled if cancelled during its prompt.
        `sampling`: Batcher.add's logprobs and logit_bias."""
        flag = _Either(cancelled)
        out: queue.SimpleQueue = queue.SimpleQueue()
        with self._cv:
            if self._closed:
                raise Cancelled("the model is being unloaded")
            self._pending.append(((ids, options), dict(constraint=constraint, cancelled=flag,
                                                         load_duration_ns=load_duration_ns, **sampling), out))
            self._cv.notify_all()
        return self._events(out, flag)

    def _events(self, out: queue.SimpleQueue, flag: _Either) -> Iterator:
        try:
            while True:
                kind, value = out.get()
                if kind == _EVENTS:
                    yield from value
                elif kind == _ERROR:
                    raise value
                else:
                    if value:  # dropped before its prompt was evaluated
                        raise Cancelled()
                    return
        finally:
            flag.inner.set()  # a consumer that stops early frees the slot
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
        """Under the lock: queued sequences into free slots (errors go to their consumer)."""
        b = self._batcher
        while self._pending and b.free_slots > 0 and not self._exclusive:
            args, kwargs, out = self._pending.popleft()
            if kwargs["cancelled"].is_set():
                out.put((_END, True))
                continue
            try:
                seq = b.add(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the request's own error (context length, bad ids)
                out.put((_ERROR, exc))
                continue
            self._routes[id(seq)] = out
        self._held = len(b.sequences)

    def _loop(self) -> None:
        b = self._batcher
        while True:
            with self._cv:
                while True:
                    self._admit()
                    if self._held:
                        break
                    if self._closed:
                        for _, _, out in self._pending:
                            out.put((_ERROR, Cancelled("the model is being unloaded")))
                        self._pending.clear()
                        return
                    self._cv.wait()
            try:
                results = b.step()
            except BaseException as exc:  # noqa: BLE001 - every sequence in the batch fails with it
                b.close()
                for out in self._routes.values():
                    out.put((_ERROR, exc))
                self._routes.clear()
                with self._cv:
                    self._held = len(b.sequences)
                    self._cv.notify_all()
                continue
            with self._cv:  # before any event goes out: a consumer that saw its Done sees its slot free
                self._held = len(b.sequences)
                if not self._held:
                    self._cv.notify_all()  # exclusive() waits for this
            for seq, events in results:
                out = self._routes[id(seq)]
                if events:
                    out.put((_EVENTS, events))
                if seq.finished:
                    del self._routes[id(seq)]
                    out.put((_END, seq.state == "cancelled" and not seq.prefilled))
