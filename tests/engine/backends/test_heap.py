"""localrt.engine.backends.heap: freed activation buffers are reused from the heap, not faulted in again."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import pytest
from _testpaths import REPO

ROOT = REPO

_SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    if sys.argv[1] == "retain":
        from localrt.engine.backends.heap import retain_freed_memory
        assert retain_freed_memory()
    for _ in range(3):  # warm: the blocks exist once
        a = np.empty((128, 8192), np.float32); a.fill(1); b = np.empty((128, 8192), np.float32); b.fill(2); del a, b
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):  # as a forward's ops: 4 MiB outputs made, written, dropped
        a = np.empty((128, 8192), np.float32); a.fill(1); b = np.empty((128, 8192), np.float32); b.fill(2); del a, b
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(mode: str) -> int:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


def _glibc() -> bool:
    return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt only")
def test_freed_buffers_come_back_without_page_faults():
    kept, default = _faults("retain"), _faults("default")
    # 20 x 8 MiB written: ~41k pages. Kept, they are the same pages every time.
    assert kept < 1_000, (kept, default)
    print(f"minor faults over 20 rounds: {kept} kept, {default} with glibc's defaults")


_RELEASE = textwrap.dedent("""
    import numpy as np
    from localrt.engine.backends import heap
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20  # MiB resident
    assert heap.retain_freed_memory()
    arrays = []
    for _ in range(24):  # a model's KV blocks and buffers: under the mmap threshold, so in the heap
        a = np.empty((256, 8192), np.float32); a.fill(1); arrays.append(a)
        b = np.empty((64,), np.float32); arrays.append(b)  # a small block after each, as a heap fills
    held = rss()
    del arrays[::2]  # the model is dropped; small blocks of other objects stay between the big ones
    kept = rss()
    heap.release_freed_memory()
    print(held, kept, rss())
""")


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc_trim only")
def test_an_unloaded_models_heap_memory_is_handed_back():
    proc = subprocess.run([sys.executable, "-c", _RELEASE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    held, kept, released = map(int, proc.stdout.split())
    assert kept > held - 50  # retained: glibc keeps the 192 MiB freed between live blocks
    assert released < held - 150, (held, kept, released)
