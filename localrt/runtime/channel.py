"""One request's events on their way from the thread that makes them to whoever reads them: the model's batch driver
to the request's work, and the work to the HTTP side. A thread reads with `get()` (blocking); an asyncio task reads
with `await drain()`, which takes every entry waiting at once and is woken through its event loop, so no thread
waits on its behalf (no worker-thread call per event)."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

ITEM, END, ERROR = "item", "end", "error"  # what an entry is: a value for the reader, the last one, a failure


class Channel:
    """An unbounded FIFO of (kind, value) entries: any number of `send`s, then one `end` or `fail`."""

    def __init__(self) -> None:
        self._entries: collections.deque[tuple[str, Any]] = collections.deque()
        self._cv = threading.Condition(threading.Lock())
        self._waker: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None  # the async reader's, once set

    def send(self, value: Any) -> None:
        self._put(ITEM, value)

    def end(self, value: Any = None) -> None:
        self._put(END, value)

    def fail(self, exc: BaseException) -> None:
        self._put(ERROR, exc)

    def _put(self, kind: str, value: Any) -> None:
        with self._cv:
            self._entries.append((kind, value))
            self._cv.notify()
            waker = self._waker
        if waker is not None:
            loop, ready = waker
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:  # the loop is closed: its reader is gone
                pass

    def get(self) -> tuple[str, Any]:
        """The next entry, waiting for it."""
        with self._cv:
            while not self._entries:
                self._cv.wait()
            return self._entries.popleft()

    async def drain(self) -> list[tuple[str, Any]]:
        """Every entry waiting, at least one: awaited on the reader's event loop, woken by the sender's put."""
        with self._cv:
            if self._waker is None:
                self._waker = (asyncio.get_running_loop(), asyncio.Event())
            ready = self._waker[1]
        while True:
            ready.clear()
            with self._cv:
                if self._entries:
                    out = list(self._entries)
                    self._entries.clear()
                    return out
            await ready.wait()
