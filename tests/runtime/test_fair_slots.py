"""Fair shares of a model's slots (issue 48, class 5; localrt.runtime.fairness): the rules as a table, the
scheduler letting a newcomer past num_parallel, the Batcher parking a sequence out of its slot and resuming it
unchanged (greedy and seeded, logprobs bit for bit, slot-bound rings too), and the BatchDriver pausing a flooding
client's newest request for another client's. tests/e2e/test_daemon_fair_slots.py runs it all in a real daemon."""

from __future__ import annotations

import logging
import threading
import time
import types

import pytest

from localrt import load_model
from localrt.engine.batch import Batcher
from localrt.runtime import fairness
from localrt.runtime.batch_driver import BatchDriver
from localrt.runtime.jobs import CLIENT

from fixtures.decoders import small, write_model
from _sched_fakes import Reader, Zoo, make, req, wait_until

# -- the rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("slots, clients, want", [(2, 1, 2), (2, 2, 1), (2, 3, 1), (4, 3, 2), (1, 2, 1), (4, 0, 4)])
def test_a_clients_cap_is_its_share_rounded_up(slots, clients, want):
    assert fairness.cap(slots, clients) == want


@pytest.mark.parametrize(
    "holders, waiting, slots, want",
    [
        ([("a", 0, "a0"), ("a", 1, "a1")], ["b"], 2, "a1"),  # a holds both: its newest gives way
        ([("a", 0, "a0"), ("a", 1, "a1")], ["a"], 2, None),  # only a's own work waits
        ([("a", 0, "a0"), ("b", 1, "b0")], ["a", "c"], 2, None),  # nobody over the cap of 1: c goes next, no pause
        ([("a", 0, "a0")], ["b"], 1, None),  # one slot: each client may hold it, no trading it back and forth
        ([("a", 0, "a0"), ("a", 3, "a1"), ("a", 4, "a2"), ("b", 2, "b0")], ["b", "c"], 4, "a2"),  # cap 2: a has 3
        ([("a", 5, "a0"), ("a", 1, "a1"), ("b", 2, "b0"), ("b", 3, "b1")], ["c"], 4, None),  # cap 2: nobody over it
        ([("a", 5, "a0"), ("a", 1, "a1"), ("a", 2, "a2"), ("b", 3, "b0")], ["b"], 4, "a0"),  # the newest by arrival
    ],
)
def test_the_victim_is_the_newest_request_of_the_client_holding_the_most(holders, waiting, slots, want):
    assert fairness.victim(holders, waiting, slots) == want


def test_an_unpausable_request_is_never_the_victim():
    holders = [("a", 0, "a0"), ("a", 1, "a1")]
    assert fairness.victim(holders, ["b"], 2, may_pause=lambda r: r != "a1") == "a0"
    assert fairness.victim(holders, ["b"], 2, may_pause=lambda r: False) is None


def test_a_free_slot_goes_to_the_client_holding_the_fewest_then_served_least_recently_then_the_oldest():
    waiting = [("a", 1), ("a", 0), ("b", 5), ("c", 4)]
    served = {"a": 7, "c": 3}

    def pick(holders, last=lambda c: served.get(c, -1)):
        return fairness.first(waiting, holders, lambda w: w[0], lambda w: w[1], last)

    assert pick(["a", "c"]) == ("b", 5)
    assert pick(["c", "b"]) == ("a", 0)  # a's paused request (older) before its new one
    assert pick([]) == ("b", 5)  # never served
    assert pick([], lambda c: -1) == ("a", 0)


# -- the scheduler: past num_parallel for a client below its share -----------------------------------


def _client_req(client, id, **payload):
    r = req(id=id, **payload)
    r.client = client
    return r


@pytest.mark.parametrize("pauses", [True, False])
def test_a_newcomer_starts_beside_a_flood_only_where_the_model_can_pause(pauses):
    zoo = Zoo()
    load = zoo.load

    def load_with_driver(key, opts):
        m = load(key, opts)
        m.driver = types.SimpleNamespace(pauses=pauses)  # what fairness.pausable looks for (a BatchDriver)
        return m

    zoo.load = load_with_driver
    s, _, _ = make(zoo, num_parallel=2)
    try:
        gate = threading.Event()
        flood = [Reader(s.submit(_client_req("a", f"a{i}", gate=gate))) for i in range(3)]
        wait_until(lambda: zoo.active == 2)
        newcomer = Reader(s.submit(_client_req("b", "b0", gate=gate)))
        later = Reader(s.submit(_client_req("b", "b1", gate=gate)))
        want = ["a0", "a1", "b0"] if pauses else ["a0", "a1"]  # b1: b is at its cap of 1, a2: a is over
        wait_until(lambda: len(zoo.started) >= len(want))
        time.sleep(0.1)  # and no more start
        assert sorted(i for _, i in zoo.started) == want  # which started: granted together, readers race to begin
        gate.set()
        for st in flood + [newcomer, later]:
            list(st)
        assert zoo.max_active == (3 if pauses else 2)
    finally:
        s.stop(timeout=2)


def test_the_work_runs_under_its_clients_name():
    s, _, _ = make()
    try:
        r = _client_req("198.51.100.7", "x")
        r.work = lambda loaded, request, cancelled: iter([CLIENT.get()])
        assert list(s.submit(r)) == ["198.51.100.7"]  # what the model's BatchDriver reads
    finally:
        s.stop(timeout=2)


# -- the engine: a parked sequence resumes unchanged ---------------------------------------------------

SAMPLED = {"temperature": 1.5, "top_k": 3, "seed": 7}


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("fair") / f"{request.param}.gguf"
    spec = (
        small(seed=5, wtype=8)
        if request.param == "llama"
        else small(arch="gemma3", n_layer=6, window=8, seed=2, wtype=8)
    )
    write_model(path, spec)  # gemma3: sliding-window rings per slot, so a parked sequence replays from scratch
    return load_model(path, num_ctx=256, num_batch=64, n_slots=2)


def _alone(model, ids, opts):
    model.cache.forget_prefixes()
    out = list(model.generate(ids, opts, logprobs=2))
    model.cache.forget_prefixes()
    return out


def _same(have, want):
    assert have[:-1] == want[:-1]  # tokens and logprobs, bit for bit
    assert (have[-1].eval_count, have[-1].done_reason, have[-1].context) == (
        want[-1].eval_count,
        want[-1].done_reason,
        want[-1].context,
    )


@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_a_parked_sequence_resumes_with_unchanged_tokens(tiny, when):
    model = tiny
    a_ids, b_ids, c_ids = [60, 70, 71, 72] * 20, [61, 70, 71] * 30, [62, 75] * 9  # 80 and 90: a BLAS piece each
    a_opts, b_opts, c_opts = (
        {"temperature": 0, "num_predict": 60},
        {**SAMPLED, "num_predict": 50},
        {"temperature": 0, "num_predict": 12},
    )
    alone = [_alone(model, ids, o) for ids, o in ((a_ids, a_opts), (b_ids, b_opts), (c_ids, c_opts))]
    batcher = Batcher(model)
    events: dict[int, list] = {}

    def step():
        for seq, evs in batcher.step():
            events.setdefault(id(seq), []).extend(evs)

    a = batcher.add(a_ids, a_opts, logprobs=2)
    b = batcher.add(b_ids, b_opts, logprobs=2)
    while when == "decode" and b.n_gen < 10:
        step()
    old_slot = b.slot
    batcher.park(b)
    assert b.slot == -1 and batcher.free_slots == 1 and b not in batcher.sequences
    c = batcher.add(c_ids, c_opts, logprobs=2)
    assert c.slot == old_slot  # the parked one's slot (and, in gemma3, its rings) go to another sequence
    while not c.finished:
        step()
    batcher.unpark(b)
    while batcher.sequences:
        step()
    for seq, want in zip((a, b, c), alone):
        _same(events[id(seq)], want)
    assert b.preemptions == 1 and a.preemptions == c.preemptions == 0
    assert model.cache.pool.n_in_use == 0


def test_only_a_running_sequence_can_be_parked_and_unparked_into_a_free_slot(tiny):
    batcher = Batcher(tiny)
    a = batcher.add([60, 70] * 10, {"temperature": 0, "num_predict": 4})
    batcher.park(a)
    with pytest.raises(RuntimeError):
        batcher.park(a)  # not in a slot any more
    batcher.add([61] * 10, {"num_predict": 2})
    batcher.add([62] * 10, {"num_predict": 2})
    with pytest.raises(RuntimeError, match="busy"):
        batcher.unpark(a)
    batcher.close()


# -- the driver: a flooding client's newest request gives way ------------------------------------------


def _submit(driver, client, ids, opts):
    token = CLIENT.set(client)  # as the scheduler's job thread has it
    try:
        return driver.submit(ids, opts, logprobs=2)
    finally:
        CLIENT.reset(token)


def test_the_driver_pauses_a_flooding_clients_newest_request_for_a_newcomer(tiny, caplog):
    model = tiny
    reqs = {
        "a1": ([60, 70, 71, 72] * 20, {"temperature": 0, "num_predict": 150}),
        "a2": ([61, 70, 71] * 30, {**SAMPLED, "num_predict": 150}),
        "b": ([62, 75] * 9, {"temperature": 0, "num_predict": 8}),
    }
    alone = {k: _alone(model, ids, o) for k, (ids, o) in reqs.items()}
    driver = BatchDriver(model, 2)
    got: dict[str, list] = {}
    done: dict[str, float] = {}

    def consume(name, it):
        got[name] = list(it)
        done[name] = time.monotonic()

    try:
        with caplog.at_level(logging.INFO, logger="localrt.service"):
            threads = []
            for name in ("a1", "a2"):
                it = _submit(driver, "a", *reqs[name])
                first = next(it)  # running: it holds a slot
                threads.append(threading.Thread(target=lambda n=name, i=it, f=first: consume(n, [f, *i])))
                threads[-1].start()
            consume("b", _submit(driver, "b", *reqs["b"]))
            for t in threads:
                t.join(60)
        assert done["b"] < min(done["a1"], done["a2"])  # it did not wait for a's to end
        paused = [r.getMessage() for r in caplog.records if "paused" in r.getMessage()]
        assert len(paused) == 1 and "'a'" in paused[0]
        for name, want in alone.items():
            _same(got[name], want)
        assert driver.slots_in_use == 0
    finally:
        driver.close()


def test_a_paused_request_cancelled_while_it_waits_ends_cleanly(tiny):
    driver = BatchDriver(tiny, 2)
    try:
        gone = threading.Event()
        token = CLIENT.set("a")
        try:
            a1 = driver.submit([60, 70] * 10, {"temperature": 0, "num_predict": 150})
            next(a1)
            a2 = driver.submit([61, 70] * 10, {"temperature": 0, "num_predict": 150}, cancelled=gone)
            first = next(a2)
        finally:
            CLIENT.reset(token)
        b = _submit(driver, "b", [62, 75] * 9, {"temperature": 0, "num_predict": 100})
        next(b)  # b holds a2's slot: a2 is parked, and stays so while a1 and b run (each client at its cap)
        assert [t.client for t in driver._pending if t.seq is not None] == ["a"]
        gone.set()
        rest = list(a2)  # it ends where it stopped, without a Done (a consumer that cancelled reads no more)
        assert all(isinstance(e, type(first)) for e in rest) and len(rest) < 149
        assert list(b)[-1].eval_count == 100 and list(a1)[-1].eval_count == 150
        assert driver.slots_in_use == 0 and not driver._pending and not driver._routes
    finally:
        driver.close()


def test_with_one_slot_nobody_is_paused_and_the_newcomer_goes_next(tiny):
    driver = BatchDriver(tiny, 1)  # 1 slot, 2 clients: a cap of 1 each, so no pause; the newcomer goes next
    admitted = []  # the first id of each prompt, in the order the driver admits them
    add = driver._batcher.add
    driver._batcher.add = lambda ids, *args, **kw: (admitted.append(ids[0]), add(ids, *args, **kw))[1]
    try:
        token = CLIENT.set("a")
        try:
            first = driver.submit([60, 70] * 10, {"temperature": 0, "num_predict": 100})
            queued = driver.submit([61, 70] * 10, {"temperature": 0, "num_predict": 3})
        finally:
            CLIENT.reset(token)
        next(first)
        newcomer = _submit(driver, "b", [62, 75] * 9, {"temperature": 0, "num_predict": 3})
        assert list(first)[-1].eval_count == 100  # never paused: nobody is over a cap of 1
        assert len(list(newcomer)) == len(list(queued)) == 4
        assert admitted == [60, 62, 61]  # the client that had no slot yet before a's next request
        assert driver.slots_in_use == 0
    finally:
        driver.close()
