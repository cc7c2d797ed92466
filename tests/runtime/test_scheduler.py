import threading
import time
from datetime import datetime, timezone

import pytest

from localrt.config import Config
from localrt.errors import Busy, Cancelled, InvalidRequest, ModelLoadError
from localrt.runtime.scheduler import MemoryNeed, Request, Scheduler

from _sched_fakes import GiB, FakeClock, Reader, Zoo, make, names, req, sched, wait_until  # noqa: F401 - sched: a fixture


def test_request_is_served_and_model_reused(sched):
    s, zoo, _ = sched()
    assert list(s.submit(req(id=1))) == [("a", 1, 0), ("a", 1, 1)]
    assert list(s.submit(req(id=2, steps=1))) == [("a", 2, 0)]
    assert zoo.loads == [("a", 4096, 512)]
    info = s.ps()[0]
    assert (info.name, info.context_length, info.busy, info.queued) == ("a", 4096, False, 0)


def test_keep_alive_default_expires_after_idle_time(sched):
    s, zoo, clock = sched()
    list(s.submit(req(id=1)))
    assert s.ps()[0].expires_at == datetime.fromtimestamp(300, tz=timezone.utc)
    clock.advance(299)
    s.reap()
    assert names(s) == ["a"]
    clock.advance(2)
    s.reap()
    wait_until(lambda: zoo.closed == [("a", 4096)])
    assert names(s) == []


def test_each_request_resets_the_expiry(sched):
    s, zoo, clock = sched()
    list(s.submit(req(id=1)))
    clock.advance(200)
    list(s.submit(req(id=2)))
    clock.advance(200)
    s.reap()
    assert names(s) == ["a"]
    clock.advance(101)
    s.reap()
    wait_until(lambda: zoo.closed)


def test_keep_alive_zero_unloads_right_after_the_request(sched):
    s, zoo, _ = sched()
    assert len(list(s.submit(req(id=1, keep_alive=0)))) == 2
    wait_until(lambda: zoo.closed == [("a", 4096)])
    assert names(s) == []


def test_on_unloaded_runs_once_the_model_is_closed_and_dropped():
    zoo, seen = Zoo(), []
    config = Config(keep_alive="5m", max_loaded_models=3, max_queue=16, num_parallel=1)
    s = Scheduler(
        zoo.load, config, clock=FakeClock(), wall_clock=lambda: 0.0, on_unloaded=lambda: seen.append(list(zoo.closed))
    )
    try:
        list(s.submit(req(id=1, keep_alive=0)))
        wait_until(lambda: seen)
        assert seen == [[("a", 4096)]]  # after close(), the service hands the model's memory back (runtime.service)
    finally:
        s.stop(timeout=2)


def test_negative_keep_alive_keeps_forever(sched):
    s, zoo, clock = sched()
    list(s.submit(req(id=1, keep_alive="-1m")))
    clock.advance(10**9)
    s.reap()
    assert names(s) == ["a"]
    assert s.ps()[0].expires_at is None


def test_request_without_keep_alive_keeps_the_models_duration(sched):
    s, zoo, clock = sched()
    list(s.submit(req(id=1, keep_alive="10m")))
    list(s.submit(req(id=2)))  # no keep_alive: still 10 minutes, not the 5-minute default
    clock.advance(400)
    s.reap()
    assert names(s) == ["a"]
    list(s.submit(req(id=3, keep_alive=30)))
    clock.advance(31)
    s.reap()
    wait_until(lambda: zoo.closed)


def test_bad_keep_alive_is_rejected_before_queueing(sched):
    s, zoo, _ = sched()
    with pytest.raises(InvalidRequest, match="keep_alive"):
        s.submit(req(keep_alive="300"))
    assert zoo.loads == []


def test_lru_eviction(sched):
    s, zoo, clock = sched(max_loaded_models=2)
    list(s.submit(req("a", 1)))
    clock.advance(1)
    list(s.submit(req("b", 2)))
    clock.advance(1)
    list(s.submit(req("a", 3)))  # a is now the most recently used
    clock.advance(1)
    list(s.submit(req("c", 4)))
    wait_until(lambda: zoo.closed == [("b", 4096)])
    assert sorted(names(s)) == ["a", "c"]


def test_a_busy_model_is_never_evicted(sched):
    s, zoo, _ = sched(max_loaded_models=1)
    gate = threading.Event()
    first = Reader(s.submit(req("a", 1, gate=gate, steps=1)))
    wait_until(lambda: zoo.active == 1)
    second = s.submit(req("b", 2, steps=1))
    time.sleep(0.05)
    assert [k for k, *_ in zoo.loads] == ["a"]  # b waits; a keeps running
    gate.set()
    assert list(first) == [("a", 1, 0)]
    assert list(second) == [("b", 2, 0)]
    assert zoo.closed == [("a", 4096)]


def test_queue_full_raises_busy(sched):
    s, zoo, _ = sched(max_queue=2)
    gate = threading.Event()
    running = Reader(s.submit(req(id=1, gate=gate)))
    wait_until(lambda: zoo.active == 1)
    w1 = s.submit(req(id=2))
    w2 = s.submit(req(id=3))
    with pytest.raises(Busy, match="maximum pending requests"):
        s.submit(req(id=4))
    w2.cancel()  # a waiting request that goes away frees its place
    w3 = s.submit(req(id=5, steps=1))
    gate.set()
    assert len(list(running)) == 2 and len(list(w1)) == 2 and list(w3) == [("a", 5, 0)]
    assert list(w2) == []
    assert [i for _, i in zoo.started] == [1, 2, 5]


def test_cancellation_stops_the_work_and_frees_the_worker(sched):
    s, zoo, _ = sched()
    stream = s.submit(req(id=1, forever=True))
    assert next(stream) == ("a", 1, 0)
    assert next(stream) == ("a", 1, 1)
    stream.close()
    after = s.submit(req(id=2, steps=1))
    assert list(after) == [("a", 2, 0)]
    wait_until(lambda: zoo.active == 0)


def test_a_cancelled_reader_gives_its_slot_back_at_once(sched):
    s, zoo, _ = sched()
    stream = s.submit(req(id=1, forever=True))
    assert next(stream) == ("a", 1, 0)
    assert s.ps()[0].busy
    stream.cancel()  # e.g. the HTTP side, whose client left: it reads no more
    assert not s.ps()[0].busy
    with pytest.raises(StopIteration):
        next(stream)  # the work stops at its next step


def test_cancel_from_another_thread_unblocks_a_waiting_consumer(sched):
    s, zoo, _ = sched()
    gate = threading.Event()
    running = Reader(s.submit(req(id=1, gate=gate)))
    wait_until(lambda: zoo.active == 1)
    waiting = s.submit(req(id=2))
    got = []
    t = threading.Thread(target=lambda: got.append(list(waiting)))
    t.start()
    waiting.cancel()
    t.join(2)
    assert got == [[]]
    gate.set()
    assert len(list(running)) == 2
    assert [i for _, i in zoo.started] == [1]


def test_a_dropped_stream_cancels_its_work(sched):
    s, zoo, _ = sched()
    s.submit(req(id=1, forever=True))  # the stream is garbage at once
    assert list(s.submit(req(id=2, steps=1))) == [("a", 2, 0)]


def test_a_load_is_not_aborted_when_its_client_leaves(sched):
    s, zoo, _ = sched()
    zoo.load_gate = threading.Event()
    stream = s.submit(req(id=1))
    stream.cancel()
    zoo.load_gate.set()
    wait_until(lambda: names(s) == ["a"])
    assert zoo.started == []


def test_concurrent_requests_none_lost_none_mixed_in_arrival_order(sched):
    s, zoo, _ = sched()
    order, results, errors = [], {}, []
    order_lock = threading.Lock()
    start = threading.Barrier(8)

    def client(i):
        try:
            start.wait()
            with order_lock:
                stream = s.submit(req(id=i, steps=20))
                order.append(i)
            results[i] = list(stream)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    for i in range(8):
        assert results[i] == [("a", i, step) for step in range(20)]
    assert [i for _, i in zoo.started] == order
    assert zoo.max_active == 1
    assert zoo.loads == [("a", 4096, 512)]


def test_errors_from_the_work_reach_the_consumer_and_the_worker_goes_on(sched):
    s, zoo, _ = sched()
    stream = s.submit(req(id=1, fail_at=1))
    assert next(stream) == ("a", 1, 0)
    with pytest.raises(ValueError, match="boom at 1"):
        next(stream)
    assert list(s.submit(req(id=2, steps=1))) == [("a", 2, 0)]


def test_load_errors_reach_every_waiting_consumer_and_a_later_request_retries(sched):
    zoo = Zoo(fail={"bad"})
    s, _, _ = sched(zoo=zoo)
    with pytest.raises(ModelLoadError, match="cannot load bad"):
        list(s.submit(req("bad", 1)))
    zoo.fail.clear()
    assert list(s.submit(req("bad", 2, steps=1))) == [("bad", 2, 0)]


def test_smaller_num_ctx_never_reloads_larger_does(sched):
    s, zoo, _ = sched()
    list(s.submit(req(id=1, options={"num_ctx": 4096})))
    list(s.submit(req(id=2, options={"num_ctx": 2048})))
    assert zoo.loads == [("a", 4096, 512)]
    list(s.submit(req(id=3, options={"num_ctx": 8192})))
    assert zoo.loads == [("a", 4096, 512), ("a", 8192, 512)]
    assert zoo.closed == [("a", 4096)]
    list(s.submit(req(id=4, options={"num_ctx": 4096})))
    list(s.submit(req(id=5, options={"num_ctx": 8192, "num_batch": 256})))  # another load-time option
    assert zoo.loads[-1] == ("a", 8192, 256) and len(zoo.loads) == 3
    assert s.ps()[0].context_length == 8192


def test_reload_waits_for_earlier_requests_and_keeps_arrival_order(sched):
    s, zoo, _ = sched()
    gate = threading.Event()
    first = Reader(s.submit(req(id=1, gate=gate, steps=1)))
    wait_until(lambda: zoo.active == 1)
    bigger = s.submit(req(id=2, steps=1, options={"num_ctx": 8192}))
    smaller = s.submit(req(id=3, steps=1, options={"num_ctx": 1024}))
    gate.set()
    assert [list(x) for x in (first, bigger, smaller)] == [[("a", 1, 0)], [("a", 2, 0)], [("a", 3, 0)]]
    assert [i for _, i in zoo.started] == [1, 2, 3]
    assert [n for _, n, _ in zoo.loads] == [4096, 8192]


def test_memory_check_counts_private_bytes_not_mmap(sched):
    zoo = Zoo(private={"a": 6 * GiB, "b": 6 * GiB, "huge": 20 * GiB})

    def estimate(key, opts):
        return MemoryNeed(private=zoo.private[key], mapped=40 * GiB)  # weights far larger than RAM: mmap

    def available():
        return 10 * GiB - sum(zoo.loaded.values())

    s, _, _ = make(zoo=zoo)
    s._estimate_fn, s._available_fn = estimate, available
    try:
        list(s.submit(req("a", 1)))
        info = s.ps()[0]
        assert (info.size_private, info.size_mapped, info.size) == (6 * GiB, 40 * GiB, 46 * GiB)
        list(s.submit(req("b", 2)))  # only 4 GiB free: the idle model a is evicted first
        assert zoo.closed == [("a", 4096)] and names(s) == ["b"]
        with pytest.raises(ModelLoadError, match="more system memory"):
            list(s.submit(req("huge", 3)))
    finally:
        s.stop(timeout=2)


def test_unload_idle_and_busy(sched):
    s, zoo, _ = sched()
    list(s.submit(req("a", 1)))
    assert s.unload("a", wait=2) is True
    assert zoo.closed == [("a", 4096)]
    assert s.unload("nope") is False
    gate = threading.Event()
    busy = Reader(s.submit(req("a", 2, gate=gate, steps=1)))
    wait_until(lambda: zoo.active == 1)
    s.unload("a")
    assert names(s) == ["a"]  # still working
    gate.set()
    assert list(busy) == [("a", 2, 0)]
    wait_until(lambda: len(zoo.closed) == 2)


def test_stop_fails_waiting_requests_and_releases_models():
    s, zoo, _ = make()
    gate = threading.Event()
    running = Reader(s.submit(req(id=1, gate=gate, steps=1)))
    wait_until(lambda: zoo.active == 1)
    waiting = s.submit(req(id=2))
    threading.Timer(0.05, gate.set).start()
    s.stop(timeout=2)
    assert list(running) == [("a", 1, 0)]
    with pytest.raises(Cancelled):
        list(waiting)
    assert zoo.closed == [("a", 4096)]
    with pytest.raises(Busy):
        s.submit(req(id=3))


def test_stop_ends_a_job_whose_reader_never_comes_back():
    s, zoo, _ = make()
    stream = s.submit(req(id=1, forever=True))
    assert next(stream) == ("a", 1, 0)  # granted and started; its reader reads no more
    s.stop(timeout=0.5)
    assert zoo.closed == [("a", 4096)] and stream._job.cancelled.is_set()
    with pytest.raises(StopIteration):
        next(stream)  # a reader that comes back after all finds the work stopped


def test_work_function_can_be_passed_with_the_request(sched):
    s, zoo, _ = sched()
    seen = []

    def work(loaded, request, cancelled):
        seen.append((loaded.key, request.payload))
        return iter(())  # a load-only request

    assert list(s.submit(Request(model="a", payload="load", work=work))) == []
    assert seen == [("a", "load")] and names(s) == ["a"]


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"num_parallel": -1}, "NUM_PARALLEL"),
        ({"num_parallel": 17}, "NUM_PARALLEL"),
        ({"max_queue": 0}, "MAX_QUEUE"),
        ({"keep_alive": "soon"}, "KEEP_ALIVE"),
        ({"max_loaded_models": -1}, "MAX_LOADED"),
    ],
)
def test_bad_configuration_is_refused(cfg, match):
    with pytest.raises(ValueError, match=match):
        make(**cfg)


def test_env_style_keep_alive_in_seconds(sched):
    s, zoo, clock = sched(keep_alive="60")
    list(s.submit(req(id=1)))
    clock.advance(61)
    s.reap()
    wait_until(lambda: zoo.closed)


def test_a_request_waiting_for_room_is_not_overtaken(sched):
    s, zoo, _ = sched(max_loaded_models=1)
    gate = threading.Event()
    a1 = Reader(s.submit(req("a", 1, gate=gate, steps=1)))
    wait_until(lambda: zoo.active == 1)
    b = s.submit(req("b", 2, steps=1))
    a2 = s.submit(req("a", 3, steps=1))  # would keep model a busy forever if it could jump ahead of b
    gate.set()
    assert [list(x) for x in (a1, b, a2)] == [[("a", 1, 0)], [("b", 2, 0)], [("a", 3, 0)]]
    assert zoo.started == [("a", 1), ("b", 2), ("a", 3)]


def test_estimate_errors_reach_the_consumer():
    def estimate(key, opts):
        raise FileNotFoundError(f"no blob for {key}")

    zoo = Zoo()
    s = Scheduler(zoo.load, Config(), clock=FakeClock(), estimate_fn=estimate, available_fn=lambda: GiB)
    try:
        with pytest.raises(FileNotFoundError, match="no blob for a"):
            list(s.submit(req("a", 1)))
        assert zoo.loads == []
    finally:
        s.stop(timeout=2)


def test_the_reaper_thread_unloads_on_time_with_the_real_clock():
    zoo = Zoo()
    s = Scheduler(zoo.load, Config(keep_alive="5m"), reap_interval=30.0)
    try:
        t0 = time.monotonic()
        list(s.submit(req(id=1, keep_alive="150ms")))
        wait_until(lambda: zoo.closed, timeout=5)
        assert 0.1 <= time.monotonic() - t0 < 5.0  # woken by the expiry, not by the 30 s polling
    finally:
        s.stop(timeout=2)


def test_num_parallel_requests_run_together_and_the_rest_wait():
    s, zoo, _ = make(num_parallel=2)
    gate = threading.Event()
    streams = [Reader(s.submit(req(id=i, gate=gate))) for i in range(3)]
    wait_until(lambda: zoo.active == 2)
    time.sleep(0.05)
    info = s.ps()[0]
    assert zoo.active == 2 and info.slots_in_use == 2 and info.busy and info.queued == 1
    gate.set()
    got = [list(st) for st in streams]
    assert got == [[("a", i, 0), ("a", i, 1)] for i in range(3)]
    assert zoo.max_active == 2
    wait_until(lambda: not s.ps()[0].busy)
    assert s.unload("a", wait=5) and zoo.closed == [("a", 4096)]
    s.stop()
