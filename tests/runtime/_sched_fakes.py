"""The scheduler's test doubles: a fake clock, a zoo of fake models that record what ran, a reader thread per
stream (as a client's connection), and a fixture that stops the schedulers a test made."""

import threading
import time

import pytest

from localrt.config import Config
from localrt.api.options import resolve
from localrt.errors import ModelLoadError
from localrt.runtime.scheduler import Request, Scheduler

GiB = 1 << 30


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def advance(self, dt):
        self.t += dt


class FakeModel:
    """Yields (model, request id, step) per step; payload: {"id", "steps", "gate", "fail_at", "forever"}."""

    def __init__(self, zoo, key, opts):
        self.zoo, self.key, self.opts = zoo, key, opts
        self.context_length = opts["num_ctx"]

    def run(self, request, cancelled):
        p = request.payload or {}
        with self.zoo.lock:
            self.zoo.started.append((self.key, p.get("id")))
            self.zoo.active += 1
            self.zoo.max_active = max(self.zoo.max_active, self.zoo.active)
        try:
            step = 0
            while p.get("forever") or step < p.get("steps", 2):
                if cancelled.is_set():
                    self.zoo.saw_cancel.append(p.get("id"))
                    return
                if p.get("gate") is not None:
                    p["gate"].wait(5)
                if p.get("fail_at") == step:
                    raise ValueError(f"boom at {step}")
                yield (self.key, p.get("id"), step)
                step += 1
                if p.get("forever"):
                    time.sleep(0.002)
        finally:
            with self.zoo.lock:
                self.zoo.active -= 1

    def close(self):
        with self.zoo.lock:
            self.zoo.closed.append((self.key, self.opts["num_ctx"]))
            self.zoo.loaded.pop(self.key, None)


class Zoo:
    """The fake loader and what happened to it."""

    def __init__(self, private=None, fail=()):
        self.lock = threading.Lock()
        self.loads, self.closed, self.started, self.saw_cancel = [], [], [], []
        self.loaded = {}
        self.active = self.max_active = 0
        self.private = private or {}
        self.fail = set(fail)
        self.load_gate = None

    def load(self, key, opts):
        if self.load_gate is not None:
            self.load_gate.wait(5)
        if key in self.fail:
            raise ModelLoadError(f"cannot load {key}")
        with self.lock:
            self.loads.append((key, opts["num_ctx"], opts["num_batch"]))
            self.loaded[key] = self.private.get(key, 0)
        return FakeModel(self, key, opts)


def wait_until(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


def make(zoo=None, clock=None, **cfg):
    zoo = zoo or Zoo()
    clock = clock or FakeClock()
    config = Config(**{"keep_alive": "5m", "max_loaded_models": 3, "max_queue": 16, "num_parallel": 1, **cfg})
    return Scheduler(zoo.load, config, clock=clock, wall_clock=lambda: 0.0), zoo, clock


def req(model="a", id=None, keep_alive=None, options=None, **payload):
    return Request(model=model, options=resolve(options or {}), keep_alive=keep_alive, payload={"id": id, **payload})


class Reader:
    """Reads a stream on its own thread from the start, as a client's connection does (the reader runs the work
    the scheduler grants it); iterating it waits for the end and gives what was read, or raises what ended it."""

    def __init__(self, stream):
        self.stream = stream
        self.items, self.error = [], None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        try:
            for item in self.stream:
                self.items.append(item)
        except BaseException as exc:  # noqa: BLE001 - raised to the test when it reads
            self.error = exc

    def __iter__(self):
        self._thread.join(10)
        assert not self._thread.is_alive(), "the stream never ended"
        if self.error is not None:
            raise self.error
        return iter(self.items)

    def cancel(self):
        self.stream.cancel()


def names(s):
    return [i.name for i in s.ps()]


@pytest.fixture
def sched():
    made = []

    def factory(**kw):
        s, zoo, clock = make(**kw)
        made.append(s)
        return s, zoo, clock

    yield factory
    for s in made:
        s.stop(timeout=2)
