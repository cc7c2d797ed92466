"""What the daemon tells a waiting client while it compiles kernels (issue 46: on a fresh machine the first answer
waited about two minutes behind a bare spinner and looked hung).

The kernels are compiled once per CPU and then loaded from Numba's on-disk cache; on a cache miss the first request
that calls a kernel compiles it. Numba announces each such compile as a "numba:compile" event (fired on a cache miss
only, from whichever thread compiles; its global compiler lock makes them one at a time). A listener counts them, so
`GET /api/kernels` can say "compiling, N done, now this one". How many are still to come is not known in advance (a
model calls only some kernels, and a kernel may already be cached), so none is claimed."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_state = {"depth": 0, "compiled": 0, "kernel": None}  # depth: compiles in progress (its helpers' nest in a kernel's)
_installed: list = []


def _name(event) -> str:
    dispatcher = (event.data or {}).get("dispatcher")
    func = getattr(dispatcher, "py_func", None)
    return getattr(func, "__name__", None) or "kernel"


def install() -> None:
    """Start counting this process's kernel compiles (idempotent)."""
    with _lock:
        if _installed:
            return
        from numba.core import event as ev

        class Compiles(ev.Listener):
            def on_start(self, event) -> None:
                with _lock:
                    if _state["depth"] == 0:  # a kernel the engine called, not a helper compiled inside its compile
                        _state["kernel"] = _name(event)
                    _state["depth"] += 1

            def on_end(self, event) -> None:
                with _lock:
                    _state["depth"] = max(0, _state["depth"] - 1)
                    if _state["depth"] == 0:
                        _state["compiled"] += 1
                        _state["kernel"] = None

        listener = Compiles()
        ev.register("numba:compile", listener)
        _installed.append(listener)


def install_in_background() -> None:
    """install() on a thread: importing Numba takes a few tenths of a second, which the daemon's first replies need
    not wait for (a compile starts only with a model's first forward, well after)."""
    if not _installed:
        threading.Thread(target=install, name="localrt-kernel-prep", daemon=True).start()


def status() -> dict:
    """{"compiling": bool, "compiled": kernels this process has compiled so far (a kernel with the helpers compiled
    inside its compile), "kernel": the one compiling now (only while compiling)}."""
    with _lock:
        out = {"compiling": _state["depth"] > 0, "compiled": _state["compiled"]}
        if out["compiling"]:
            out["kernel"] = _state["kernel"]
        return out
