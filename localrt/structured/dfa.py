"""Subset construction of the byte NFA into dense tables for the mask kernel.

Push/pop edges survive determinization as actions: a subset whose edges on a byte are all pushes
becomes PUSH (the return state is the closure of every push's return: all of them entered the same
free-form automaton, so their continuations are one subset). When a byte has both ordinary and push
edges (anyOf of a free-form object and a structured one) the ordinary edges win: a subset of the
language, so output still validates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .errors import SchemaTooComplex
from .nfa import NFA, NORMAL, POP, PUSH, RET

MAX_DFA_STATES = 40_000
MAX_SECONDS = 8.0  # determinization wall time bound


@dataclass(frozen=True)
class DFA:
    trans: np.ndarray  # int32 (n_states, 256): next state, -1 = dead (POP/RET: 0, the state comes off the stack)
    action: np.ndarray  # int8 (n_states, 256): NORMAL / PUSH / POP / RET
    ret: np.ndarray  # int32 (n_states, 256): state pushed by PUSH, else -1
    accept: np.ndarray  # bool (n_states,)
    start: int = 0

    @property
    def n_states(self) -> int:
        return len(self.accept)


def determinize(nfa: NFA) -> DFA:
    classes, reps = _byte_classes(nfa)
    by_class = [_edges_by_class(e, classes) for e in nfa.edges]

    def closure(states) -> frozenset:
        seen = set(states)
        todo = list(states)
        while todo:
            for t in nfa.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    ids: dict[frozenset, int] = {}
    order: list[frozenset] = []

    def state_id(subset: frozenset) -> int:
        sid = ids.get(subset)
        if sid is None:
            if len(order) >= MAX_DFA_STATES:
                raise SchemaTooComplex(f"the schema needs more than {MAX_DFA_STATES} automaton states")
            sid = ids[subset] = len(order)
            order.append(subset)
        return sid

    state_id(closure([0]))
    n_cls = len(reps)
    rows_t, rows_a, rows_r = [], [], []
    deadline = time.monotonic() + MAX_SECONDS
    i = 0
    while i < len(order):
        if time.monotonic() > deadline:
            raise SchemaTooComplex(f"compiling the schema took longer than {MAX_SECONDS:.0f} s")
        t_row = np.full(n_cls, -1, np.int32)  # (n_classes,)
        a_row = np.zeros(n_cls, np.int8)  # (n_classes,)
        r_row = np.full(n_cls, -1, np.int32)  # (n_classes,)
        moves: dict[int, list] = {}  # class -> [ordinary targets, (push target, return) pairs, pop kind]
        for q in order[i]:
            for c, targets in by_class[q].items():
                move = moves.setdefault(c, [set(), set(), False])
                for target, kind, ret in targets:
                    if kind == NORMAL:
                        move[0].add(target)
                    elif kind == PUSH:
                        move[1].add((target, ret))
                    else:
                        move[2] = kind
        for c, (normal, rets, pop) in moves.items():
            if normal:
                t_row[c] = state_id(closure(normal))
            elif rets:
                targets = {t for t, _ in rets}
                t_row[c] = state_id(closure(targets))
                a_row[c] = PUSH
                r_row[c] = state_id(closure({r for _, r in rets}))
            elif pop:
                t_row[c] = 0
                a_row[c] = pop
        rows_t.append(t_row)
        rows_a.append(a_row)
        rows_r.append(r_row)
        i += 1
    cls = np.asarray(classes, np.int64)  # (256,) byte -> class
    trans = np.stack(rows_t)[:, cls]
    action = np.stack(rows_a)[:, cls]
    ret = np.stack(rows_r)[:, cls]
    accept = np.array([nfa.final in sub for sub in order], bool)
    return DFA(np.ascontiguousarray(trans), np.ascontiguousarray(action), np.ascontiguousarray(ret), accept)


def _byte_classes(nfa: NFA) -> tuple[list[int], list[int]]:
    """Bytes that no edge tells apart share a class: (class per byte (256,), a representative per class)."""
    cuts = {0, 256}
    for edges in nfa.edges:
        for lo, hi, *_ in edges:
            cuts.add(lo)
            cuts.add(hi + 1)
    bounds = sorted(cuts)
    classes = [0] * 256
    reps = []
    for k in range(len(bounds) - 1):
        reps.append(bounds[k])
        for b in range(bounds[k], bounds[k + 1]):
            classes[b] = k
    return classes, reps


def _edges_by_class(edges, classes: list[int]) -> dict[int, list[tuple[int, int, int]]]:
    out: dict[int, list[tuple[int, int, int]]] = {}
    for lo, hi, target, kind, ret in edges:
        for c in range(classes[lo], classes[hi] + 1):
            out.setdefault(c, []).append((target, kind, ret))
    return out


def step(d: DFA, state: int, stack: list[int], b: int, max_depth: int) -> int:
    """The state after byte b (the stack updated in place), or -1 when b is not allowed."""
    while True:
        nxt = int(d.trans[state, b])
        if nxt < 0:
            return -1
        act = d.action[state, b]
        if act == NORMAL:
            return nxt
        if act == PUSH:
            if len(stack) >= max_depth:
                return -1
            stack.append(int(d.ret[state, b]))
            return nxt
        if not stack:
            return -1
        state = stack.pop()
        if act == POP:
            return state
