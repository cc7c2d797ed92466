"""A pytest plugin that records every top-level Numba compile and the test that paid for it: where a cold run's
minutes go. Not loaded by default; on a fresh clone (an empty kernel cache):

    LOCALRT_COMPILE_LOG=/tmp/compiles.jsonl python3 -m pytest -p _compile_log

Each worker appends one JSON line per compile: {"test", "kernel", "seconds"} (a kernel compiled inside another one's
compile counts toward the outer one). `python3 tests/_compile_log.py /tmp/compiles.jsonl` prints the totals.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict

_state = threading.local()
_test = {"id": "(collection)"}


def _listener():
    from numba.core import event

    class TopLevelCompiles(event.Listener):
        def on_start(self, ev) -> None:
            depth = getattr(_state, "depth", 0)
            _state.depth = depth + 1
            if depth == 0:
                _state.t0 = time.perf_counter()

        def on_end(self, ev) -> None:
            _state.depth -= 1
            if _state.depth == 0:
                disp = ev.data.get("dispatcher")
                name = getattr(getattr(disp, "py_func", None), "__qualname__", repr(disp))
                module = getattr(getattr(disp, "py_func", None), "__module__", "?")
                line = {"test": _test["id"], "kernel": f"{module}.{name}", "seconds": time.perf_counter() - _state.t0}
                with open(os.environ["LOCALRT_COMPILE_LOG"], "a") as f:
                    f.write(json.dumps(line) + "\n")

    return event, TopLevelCompiles()


def pytest_configure(config) -> None:
    if os.environ.get("LOCALRT_COMPILE_LOG"):
        event, listener = _listener()
        event.register("numba:compile", listener)


def pytest_runtest_protocol(item, nextitem):
    _test["id"] = item.nodeid


def _report(path: str) -> None:
    by_kernel, by_test = defaultdict(float), defaultdict(float)
    for line in open(path):
        r = json.loads(line)
        by_kernel[r["kernel"]] += r["seconds"]
        by_test[r["test"]] += r["seconds"]
    print(f"{sum(by_kernel.values()):.0f} s of compiles in all")
    for title, table in (("kernels", by_kernel), ("tests", by_test)):
        print(f"-- {title}, most first")
        for name, s in sorted(table.items(), key=lambda kv: -kv[1])[:25]:
            print(f"{s:8.1f} s  {name}")


if __name__ == "__main__":
    _report(sys.argv[1])
