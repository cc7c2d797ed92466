"""Issue 43, part 4: one channel type from the batch driver to the HTTP side (runtime.channel), read by a thread with
get() or by an event loop with drain(): every event waiting per wake-up, no worker-thread call per event."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest
from _sched_fakes import sched  # noqa: F401 - sched: the scheduler fixture, shared

from localrt.runtime import batch_driver, jobs
from localrt.runtime import channel as ch
from localrt.runtime.scheduler import Request
from localrt.serve import streaming


def test_a_thread_and_an_event_loop_read_the_same_entries():
    c = ch.Channel()
    for i in range(3):
        c.send(i)
    c.end("done")
    assert asyncio.run(c.drain()) == [(ch.ITEM, 0), (ch.ITEM, 1), (ch.ITEM, 2), (ch.END, "done")]
    got = []
    t = threading.Thread(target=lambda: got.append(c.get()))
    t.start()
    c.fail(ValueError("x"))
    t.join(5)
    assert got[0][0] == ch.ERROR and isinstance(got[0][1], ValueError)


def test_drain_waits_for_a_sender_on_another_thread():
    c = ch.Channel()

    async def read():
        threading.Timer(0.05, lambda: (c.send("a"), c.send("b"))).start()
        first = await c.drain()
        rest = [] if len(first) == 2 else await c.drain()
        return first + rest

    assert asyncio.run(read()) == [(ch.ITEM, "a"), (ch.ITEM, "b")]


def _submission(events, error=None):
    """A batch driver's Submission whose sequence already sent `events` (over two steps), then ended or failed."""
    out = ch.Channel()
    out.send(events[:2])
    out.send(events[2:])
    out.fail(error) if error is not None else out.end(False)
    return batch_driver.Submission(types.SimpleNamespace(_wake=lambda: None), out, batch_driver._Either(None))


def _granted(sched, source):
    """A scheduler stream whose work (run by its reader, as the service's is) returns `source`, mapped 1:1."""
    s, _, _ = sched()
    return s.submit(Request(model="a", work=lambda loaded, request, cancelled: jobs.Mapped(source, lambda e: [e])))


def test_a_stream_drains_every_waiting_event_at_once_then_ends(sched):
    stream = _granted(sched, _submission(list(range(5))))
    assert asyncio.run(stream.drain()) == ([0, 1, 2, 3, 4], True)
    assert asyncio.run(stream.drain()) == ([], True)
    assert list(stream) == []


def test_a_streams_error_comes_after_the_events_before_it(sched):
    stream = _granted(sched, _submission([0, 1], ValueError("boom at 2")))
    assert asyncio.run(stream.drain()) == ([0, 1], False)
    with pytest.raises(ValueError, match="boom at 2"):
        asyncio.run(stream.drain())


def test_the_pump_starts_the_work_once_then_reads_with_no_thread(sched, monkeypatch):
    """The reader's one executor call renders and submits (the work); every event after it comes off the driver's
    channel on the event loop."""

    def refuse(*a, **k):
        raise AssertionError("a worker-thread call per event")

    monkeypatch.setattr(streaming, "run_in_threadpool", refuse)
    stream = _granted(sched, _submission(list(range(4))))
    pump = streaming.EventPump(stream)

    async def read():
        loop = asyncio.get_running_loop()
        calls, run = [], loop.run_in_executor
        loop.run_in_executor = lambda *a: calls.append(a[1]) or run(*a)
        first = await pump.next()
        return [first, *await pump.batch()], calls

    items, calls = asyncio.run(read())
    assert items == [0, 1, 2, 3, streaming._END]
    assert calls == [stream._start]
