"""Issue 43, part 4: one channel type from the batch driver to the HTTP side (runtime.channel), read by a thread with
get() or by an event loop with drain(): every event waiting per wake-up, no worker-thread call per event."""
from __future__ import annotations

import asyncio
import threading

import pytest
from test_scheduler import req, sched, wait_until  # noqa: F401 - sched: the scheduler fixture, shared

from localrt.runtime import channel as ch
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


def _finished_job(sched, **payload):
    s, zoo, _ = sched()
    stream = s.submit(req(id=1, **payload))
    entries = stream._job.out._entries
    wait_until(lambda: entries and entries[-1][0] != ch.ITEM)  # the work is over: its events wait in the channel
    return stream


def test_a_stream_drains_every_waiting_event_at_once_then_ends(sched):
    stream = _finished_job(sched, steps=5)
    assert asyncio.run(stream.drain()) == ([("a", 1, i) for i in range(5)], True)
    assert asyncio.run(stream.drain()) == ([], True)
    assert list(stream) == []


def test_a_streams_error_comes_after_the_events_before_it(sched):
    stream = _finished_job(sched, steps=5, fail_at=2)
    assert asyncio.run(stream.drain()) == ([("a", 1, 0), ("a", 1, 1)], False)
    with pytest.raises(ValueError, match="boom at 2"):
        asyncio.run(stream.drain())


def test_the_pump_reads_a_stream_with_no_worker_thread_call(sched, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a worker-thread call per event")

    monkeypatch.setattr(streaming, "run_in_threadpool", refuse)
    stream = _finished_job(sched, steps=4)
    pump = streaming.EventPump(stream)

    async def read():
        first = await pump.next()
        return [first, *await pump.batch()]

    assert asyncio.run(read()) == [("a", 1, i) for i in range(4)] + [streaming._END]
