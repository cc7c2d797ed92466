"""Per-tokenizer index of token bytes, sorted so that the mask kernel walks the vocabulary as a trie.

Tokens are sorted by their bytes; `lcp[k]` is how many leading bytes token k shares with token k-1. The
kernel keeps the automaton state after every byte of the previous token and resumes from the shared
prefix, so each trie edge is stepped once, and a prefix that dies kills every token below it at once.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from simd_kernels.jit import njit

from .nfa import POP, PUSH, RET


@dataclass(frozen=True)
class TokenIndex:
    n_vocab: int
    ids: np.ndarray  # int32 (n_tok,): token id at each sorted position (tokens with no bytes left out)
    offsets: np.ndarray  # int64 (n_tok + 1,): bytes of sorted token k are data[offsets[k]:offsets[k+1]]
    data: np.ndarray  # uint8 (total_bytes,)
    lcp: np.ndarray  # int32 (n_tok,): shared prefix length with the previous sorted token
    pieces: tuple  # bytes per token id (b"" for control / empty tokens)
    eog: np.ndarray  # int64 (n_eog,): end-of-generation token ids
    max_len: int


_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def token_index(tokenizer) -> TokenIndex:
    """The index of a tokenizer, built once and kept as long as the tokenizer lives."""
    with _lock:
        idx = _cache.get(tokenizer)
        if idx is None:
            idx = _cache[tokenizer] = build_index(tokenizer)
        return idx


def build_index(tokenizer) -> TokenIndex:
    n = tokenizer.n_vocab
    pieces = tuple(b"" if tokenizer.is_control(i) else tokenizer.token_to_piece(i) for i in range(n))
    order = sorted((p, i) for i, p in enumerate(pieces) if p)
    ids = np.array([i for _, i in order], np.int32)  # (n_tok,)
    lens = np.array([len(p) for p, _ in order], np.int64)  # (n_tok,)
    offsets = np.zeros(len(order) + 1, np.int64)  # (n_tok + 1,)
    np.cumsum(lens, out=offsets[1:])
    data = np.frombuffer(b"".join(p for p, _ in order), np.uint8)  # (total_bytes,)
    lcp = np.zeros(len(order), np.int32)  # (n_tok,)
    for k in range(1, len(order)):
        a, b = order[k - 1][0], order[k][0]
        m = min(len(a), len(b))
        j = 0
        while j < m and a[j] == b[j]:
            j += 1
        lcp[k] = j
    eog = np.array(sorted(tokenizer.eog_ids), np.int64)  # (n_eog,)
    return TokenIndex(n, ids, offsets, data, lcp, pieces, eog, int(lens.max()) if len(lens) else 0)


@njit(cache=True, nogil=True)
def allowed_tokens(ids, offsets, data, lcp, max_len, trans, action, ret, state, stack, max_depth, out):
    """out[id] = True for every token whose bytes the automaton accepts from (state, stack).

    Pushes during a token go to a node pool (value, parent) so that resuming from a shared prefix
    restores the stack by restoring one pointer. `stack` is int32 (depth,), bottom first; a push past
    max_depth kills the token.
    """
    n_base = stack.shape[0]
    pool_val = np.empty(n_base + data.shape[0], np.int32)  # (n_base + total_bytes,)
    pool_parent = np.empty(n_base + data.shape[0], np.int32)  # (n_base + total_bytes,)
    for k in range(n_base):
        pool_val[k] = stack[k]
        pool_parent[k] = k - 1
    n_nodes = n_base
    path_state = np.empty(max_len + 1, np.int32)  # (max_len + 1,): state after each byte of the walked token
    path_top = np.empty(max_len + 1, np.int32)  # (max_len + 1,): stack top node after each byte
    path_depth = np.empty(max_len + 1, np.int32)  # (max_len + 1,): stack depth after each byte
    path_state[0] = state
    path_top[0] = n_base - 1
    path_depth[0] = n_base
    valid = 0  # positions of path_* that hold the previous token's walk
    died = False  # whether that walk died reading the byte at `valid`
    for k in range(ids.shape[0]):
        start = offsets[k]
        length = offsets[k + 1] - start
        shared = lcp[k]
        if died and shared > valid:  # same dead prefix as the previous token
            out[ids[k]] = False
            continue
        pos = min(shared, valid)
        s = path_state[pos]
        top = path_top[pos]
        depth = path_depth[pos]
        died = False
        while pos < length:
            b = data[start + pos]
            nxt = trans[s, b]
            if nxt < 0:
                died = True
                break
            a = action[s, b]
            if a == PUSH:
                if depth >= max_depth:
                    died = True
                    break
                depth += 1
                pool_val[n_nodes] = ret[s, b]
                pool_parent[n_nodes] = top
                top = n_nodes
                n_nodes += 1
                s = nxt
            elif a == POP or a == RET:
                if top < 0:
                    died = True
                    break
                s = pool_val[top]
                top = pool_parent[top]
                depth -= 1
                if a == RET:  # read the same byte again from the returned-to state
                    continue
            else:
                s = nxt
            pos += 1
            path_state[pos] = s
            path_top[pos] = top
            path_depth[pos] = depth
        valid = pos
        out[ids[k]] = not died
