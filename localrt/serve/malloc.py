"""The daemon's C heap: fewer glibc malloc arenas, so memory freed by one request's thread is reused by the next.

glibc gives each thread that allocates concurrently an arena of its own (up to 8 per core) and keeps what is freed
in it. A daemon runs a thread per request; each request's logits rows (n_vocab float32: 1 MiB for Gemma 3) and
sampler copies land in whichever arena its thread holds, so peak RSS grew with the number of clients well beyond the
KV cache (measured: 8 streaming Gemma 3 clients, 790 MiB peak with the default arenas, 651 MiB with 2). Python's
own small objects do not use these arenas, and the kernels' threads do not allocate, so 2 arenas cost nothing
measurable. MALLOC_ARENA_MAX in the environment, when set, is glibc's and is left alone.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os

M_ARENA_MAX = -8  # glibc's mallopt parameter number
ARENAS = 2
BIG_BODY = 1 << 20  # a request body at least this large has its freed memory handed back after the reply

log = logging.getLogger(__name__)


def limit_arenas(n: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at n for the threads started from now on; False where that is not possible
    (not glibc, or MALLOC_ARENA_MAX already set)."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"; none elsewhere (musl, macOS, Windows)
    except (AttributeError, ValueError, OSError):
        glibc = None
    if os.environ.get("MALLOC_ARENA_MAX") or not glibc:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_ARENA_MAX, n) == 1
    if not ok:
        log.debug("mallopt(M_ARENA_MAX, %d) was refused", n)
    return ok


def release_after_big_body() -> None:
    """Hand free heap pages back to the kernel (glibc's malloc_trim) after a request with a big body is answered.

    A body and its parsed copies (an 8 MB prompt is refused in a second) are freed into the heap, which keeps up to
    localrt.engine.backends.heap's trim threshold per arena for reuse: 48 MB of refused prompts left RSS 12% up
    for good. A refused request's copies are not yet free when its reply is sent: the error's traceback and the
    frames it holds form reference cycles (about 150 objects a request) that only the cyclic collector frees, at
    a time of its choosing, so RSS after a run of refusals wandered 4-15% above the start. One collection first
    (3 ms measured on this daemon), then the trim. Only big-body requests pay it; elsewhere than glibc the trim
    does nothing."""
    gc.collect()
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        glibc = None
    if not glibc:
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
