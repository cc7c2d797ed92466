"""simd_kernels.jit.OneCompile: a process that wants a kernel another process is compiling waits for it, then loads
the other's result from the shared cache instead of compiling it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

KERNEL = textwrap.dedent("""
    from simd_kernels.jit import njit

    @njit(cache=True, nogil=True)
    def plus_one(x):
        return x + 1
""")

# Holds the kernel's lock file as a compiling process would, compiles and saves the kernel when told to, releases.
HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    from numba import types
    from numba.core.registry import CPUDispatcher
    import kernel
    lock = kernel.plus_one._cache._cache_file._index_path + ".lock"
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print(lock, flush=True)
    sys.stdin.readline()
    CPUDispatcher.compile(kernel.plus_one, (types.int64,))  # Numba's own compile: no second lock in this process
    os.close(fd)
""")

WAITER = textwrap.dedent("""
    import json
    import kernel
    value = kernel.plus_one(41)
    stats = kernel.plus_one.stats
    print(json.dumps({"value": value, "hits": sum(stats.cache_hits.values()),
                      "misses": sum(stats.cache_misses.values())}))
""")


def _blocked_on(lock: Path) -> bool:
    """Whether /proc/locks lists a process waiting for a lock on this file (its `->` lines)."""
    inode = os.stat(lock).st_ino
    return any(
        "->" in line and line.split()[6].endswith(f":{inode}")
        for line in Path("/proc/locks").read_text().splitlines()
        if len(line.split()) > 6
    )


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks to see the waiter")
def test_a_second_process_waits_for_the_compile_and_loads_it(tmp_path):
    (tmp_path / "kernel.py").write_text(KERNEL)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(tmp_path))
    run = dict(cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, **run)
    waiter = None
    try:
        lock = Path(holder.stdout.readline().strip())
        assert lock.exists(), holder.stderr.read()
        waiter = subprocess.Popen([sys.executable, "-c", WAITER], **run)
        deadline = time.monotonic() + 120
        while not _blocked_on(lock):  # the waiter reached the kernel's compile and waits for the holder
            assert waiter.poll() is None, waiter.communicate()
            assert time.monotonic() < deadline, "the second process never waited for the lock"
            time.sleep(0.05)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.wait(timeout=120) == 0, holder.stderr.read()
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, err
        assert json.loads(out) == {"value": 42, "hits": 1, "misses": 0}  # loaded the holder's compile
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
