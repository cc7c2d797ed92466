"""Fairness across clients at the scheduler's queue (issue 12, part 3): with MAX_QUEUE=4 and 32 clients, each
client progresses; the next job is the one whose client was served least recently; with the queue full a
less recently served client takes the place of the newest job of the most recently served one; Busy only at the
bound. Clients are named through Request.client (the HTTP edge sets it from the caller's address)."""

from __future__ import annotations

import threading
import time

import pytest

from localrt.errors import Busy
from _sched_fakes import Reader, req, sched  # noqa: F401 - sched: the scheduler fixture


def _req(client: str, id=None, **payload):
    r = req(id=id, **payload)
    r.client = client
    return r


def test_next_job_is_round_robin_across_clients(sched):
    s, zoo, _ = sched(max_queue=16)
    gate = threading.Event()
    first = Reader(s.submit(_req("a", id="a0", gate=gate, steps=1)))
    zoo_started = lambda: zoo.started  # noqa: E731
    deadline = time.monotonic() + 5
    while not zoo_started() and time.monotonic() < deadline:
        time.sleep(0.002)
    streams = [Reader(s.submit(_req("a", id=f"a{i}", steps=1))) for i in range(1, 4)]  # one client queues three
    streams += [Reader(s.submit(_req("b", id="b1", steps=1))), Reader(s.submit(_req("c", id="c1", steps=1)))]
    gate.set()
    for st in [first] + streams:
        list(st)
    order = [i for _, i in zoo.started]
    assert order == ["a0", "b1", "c1", "a1", "a2", "a3"]  # b and c were never served: they go before a's rest


def test_full_queue_newcomer_displaces_the_flooders_newest_job(sched):
    s, zoo, _ = sched(max_queue=4)
    gate = threading.Event()
    running = Reader(s.submit(_req("flood", id="f0", gate=gate, steps=1)))
    deadline = time.monotonic() + 5
    while not zoo.started and time.monotonic() < deadline:
        time.sleep(0.002)
    queued = [Reader(s.submit(_req("flood", id=f"f{i}", steps=1))) for i in range(1, 5)]  # the queue is full
    with pytest.raises(Busy):
        list(s.submit(_req("flood", id="f5", steps=1)))  # more of the same: refused at the bound
    newcomer = Reader(s.submit(_req("new", id="n1", steps=1)))  # never served: takes the place of f4
    gate.set()
    assert list(newcomer) == [("a", "n1", 0)]
    with pytest.raises(Busy):
        list(queued[-1])
    for st in [running] + queued[:-1]:
        list(st)
    assert [i for _, i in zoo.started] == ["f0", "n1", "f1", "f2", "f3"]


def test_32_clients_on_a_queue_of_4_all_progress(sched):
    """Clients that were just served resubmit at once; refused ones wait a little (a Retry-After). Before, the
    quick resubmitters kept taking every freed place and 20 of 32 clients got nothing at all."""
    s, zoo, _ = sched(max_queue=4)
    served = {f"c{i}": 0 for i in range(32)}
    stop = threading.Event()

    def work(loaded, request, cancelled):
        time.sleep(0.01)  # a generation takes a while: the queue stays full
        yield request.client

    def client(name: str) -> None:
        while not stop.is_set():
            r = _req(name)
            r.work = work
            try:
                st = s.submit(r)
            except Busy:
                time.sleep(0.05)
                continue
            try:
                list(st)
                served[name] += 1
            except Busy:  # displaced while waiting: the queue was at its bound
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in served]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while min(served.values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(5)
    assert min(served.values()) >= 2, served
