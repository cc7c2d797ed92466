"""localrt.serve.malloc: the daemon caps glibc's malloc arenas (threads then share them: glibc's own malloc_info
counts the heaps), and leaves an explicit MALLOC_ARENA_MAX alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from localrt.serve import malloc
from _testpaths import REPO

ROOT = REPO
_SCRIPT = """
import ctypes, sys, tempfile, threading
import numpy as np
from localrt.serve.malloc import limit_arenas
if sys.argv[1] == "cap":
    assert limit_arenas(2)
held, barrier = [], threading.Barrier(8)
def work():
    barrier.wait()
    held.append(np.ones(8192))  # 64 KiB: below the mmap threshold, from the thread's arena
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as f:
    fp = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(open(f.name).read().count("<heap nr="))
"""


def _heaps(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_threads_share_the_capped_arenas():
    assert _heaps("cap") <= 2 < _heaps("default")


def test_an_explicit_malloc_arena_max_is_left_to_glibc(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert malloc.limit_arenas() is False
