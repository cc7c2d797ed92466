"""Fair shares of a model's slots across clients (issue 48: one client's flood starved a newcomer for 118 s).

The fair queue (scheduler.py) orders the requests that wait, but a running request held its slot to its end, so a
client that sent more long requests than there are slots kept every slot while another client's request waited.
Now a client's share of a model's n slots is its `cap`, n over the clients with work running or waiting there,
rounded up; while a waiting client holds fewer slots than the cap and another client holds more, that client's
newest running request is paused (`victim`): the model's BatchDriver takes it out of its slot, preempted exactly as
when the KV pool runs dry (localrt.engine.preempt), and gives the slot to the waiting request. A free slot goes to
the waiting request of the client holding the fewest (`first`), and a paused request is first among its client's:
it resumes from its cached prefix and gives the tokens it would have given unpaused.

Rounded up, a cap never makes two clients trade one slot back and forth: a pause takes a slot from a client over
its cap to one under it, so neither is over afterwards (with 1 slot and 2 clients each may hold it: no pause, the
newcomer goes next). The scheduler lets a job past num_parallel on the same rule (`next_job`), so that the driver
sees the newcomer at all; such a job never takes its client past its cap, so the overflow is bounded.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")


def cap(slots: int, clients: int) -> int:
    """The most slots one client holds while others wait: slots over clients, rounded up."""
    return -(-slots // max(clients, 1))


def victim(
    holders: list[tuple[str, int, T]],
    waiting: Iterable[str],
    slots: int,
    may_pause: Callable[[T], bool] = lambda item: True,
) -> T | None:
    """The running request to pause so that a waiting client gets a slot, or None.

    `holders`: (client, arrival, request) per request holding a slot; `waiting`: the client of each request waiting
    for one. Pause only while some waiting client holds fewer than its cap and another holds more: of the clients
    holding the most, the newest request that `may_pause` (the older ones came first: they keep going)."""
    held = collections.Counter(client for client, _, _ in holders)
    waiting = set(waiting)
    limit = cap(slots, len(set(held) | waiting))
    if not any(held[c] < limit for c in waiting):
        return None
    over = [(held[c], arrival, item) for c, arrival, item in holders if held[c] > limit and may_pause(item)]
    return max(over, key=lambda o: o[:2])[2] if over else None


def first(
    waiting: list[T],
    holders: Iterable[str],
    client: Callable[[T], str],
    arrival: Callable[[T], int],
    last_served: Callable[[str], int] = lambda c: -1,
) -> T:
    """The waiting request a free slot goes to: of the clients holding the fewest slots, the one that got a slot least
    recently (round robin, as the fair queue), its oldest request (a paused request is older than its client's
    requests that never ran, so it resumes before they start)."""
    held = collections.Counter(holders)
    return min(waiting, key=lambda w: (held[client(w)], last_served(client(w)), arrival(w)))


def pausable(loaded: Any) -> bool:
    """Whether a loaded model can pause a running request for another client's (a BatchDriver: `pauses`)."""
    return bool(getattr(getattr(loaded, "driver", None), "pauses", False))


def next_job(runner: Any, slots: int, last_served: Callable[[str], int]) -> Any:
    """The job a model's runner starts next (still on its queue), or None to wait.

    While fewer than `slots` run: the waiting job whose client was served least recently, then the oldest (round
    robin). With every slot taken, on a model that can pause (`pausable`): the first such job whose client runs fewer
    jobs than its cap while another client runs more, so the model's driver can pause one of that client's."""
    if not runner.queue:
        return None
    order = sorted(runner.queue, key=lambda j: (last_served(j.client), j.seq))
    if len(runner.active) < slots:
        return order[0]
    if not pausable(runner.loaded):
        return None
    held = collections.Counter(j.client for j in runner.active)
    limit = cap(slots, len(set(held) | {j.client for j in order}))
    if not any(n > limit for n in held.values()):
        return None
    return next((j for j in order if held[j.client] < limit), None)
