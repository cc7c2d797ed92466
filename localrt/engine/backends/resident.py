"""Weights in private memory: Ollama's `use_mmap` option, off by our default where the weights fit easily.

A decode step streams every weight once, and the linears read private memory faster than the file's mmap, and
faster still on transparent huge pages (figures in docs/measurements.md).

The copy is made once at load, tensor by tensor, onto 4 KiB pages, by up to 4 threads (the page faults run in
parallel); each tensor's file pages are dropped from this process's mapping as soon as it is copied (MADV_DONTNEED:
the page cache keeps them, the process stops counting them), so the peak RSS stays the weights plus one tensor.
After the model's first forward (`Model.after_first_forward`), a thread at the lowest CPU priority moves the copy
onto huge pages (`to_huge_pages`): allocating them during the copy held the load several times longer than the
copy itself. That thread works while the CPU is idle (between requests); under continuous load the weights stay on
4 KiB pages (still faster than the mmap). The copy is private memory: the scheduler counts it as such
(`localrt.runtime.loading.estimate_memory`), where mmap'd weights are reclaimable page cache.

`use_mmap`: True keeps the weights in the mmap; False copies them; None (the default) copies them when they take
from 256 MiB to a quarter of physical memory and the machine has no usable GPU. Smaller models' decode steps are
bound by their fixed per-token cost, not by reading the weights, and the copy would only add to their load time;
larger ones stay in the mmap, where a model that does not fit in memory can still run (pain_points P3.5); layers
placed on a GPU need no host copy, so there the default keeps the mmap, whatever num_gpu says. The rule reads only
the file and the machine, so the scheduler's estimate and the load agree.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from simd_kernels.madvise import libc_madvise

ALIGN = 4096  # each tensor's copy starts on a page: its kernels read 64-byte blocks, never across two tensors
_PAGE = mmap.PAGESIZE
_MADV_COLLAPSE = 25  # Linux 6.1+
# bytes a madvise call collapses: one huge page, at its alignment. A 64 MiB call held the process's memory map long
# enough that a fresh process's first token (kernels loading from the cache, mapping code) waited on it
# (docs/measurements.md)
_COLLAPSE_CHUNK = 2 << 20
MIN_PRIVATE = 256 << 20  # bytes of weights from which use_mmap=None copies them
COPY_WORKERS = min(4, os.cpu_count() or 1)  # threads that copy: page faults in parallel


def physical_memory() -> int:
    """Bytes of RAM (the machine's, not what is free now; engine.backends.sysmem)."""
    from .sysmem import physical_memory as total

    return total()


def private_weights(use_mmap: bool | None, weight_bytes: int, ram: int | None = None, gpu: bool | None = None) -> bool:
    """Whether a load copies its weights into private memory (see the module docstring). gpu: whether this
    process has a usable GPU (None: probe it once)."""
    if use_mmap is not None:
        return not use_mmap
    if gpu_usable() if gpu is None else gpu:
        return False
    return MIN_PRIVATE <= weight_bytes <= (physical_memory() if ram is None else ram) // 4


@functools.cache
def gpu_usable() -> bool:
    """Whether GPU 0 is usable (backends.devices.probe), asked once a process."""
    from .devices import probe

    return probe(0).gpu is not None


class PrivateWeights:
    """One anonymous mapping holding copies of arrays (`copy_all`: read-only views of their bytes in it). The views
    keep the mapping alive; it is unmapped with the last of them."""

    def __init__(self, nbytes: int) -> None:
        self._map = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._buf = np.frombuffer(self._map, np.uint8)  # (nbytes,)
        self._at = 0

    def copy_all(self, arrays: list[np.ndarray], drop: list[bool], workers: int = COPY_WORKERS) -> list[np.ndarray]:
        """arrays (contiguous) -> their bytes in this mapping as read-only views of their shapes and dtypes, copied
        by up to `workers` threads (the copy is page faults and memcpy, both outside the GIL). drop[i]: arrays[i]
        views a read-only file mapping, whose whole pages inside it are then unmapped (never for memory a process
        owns: unmapping anonymous pages zeroes them)."""
        spots = []
        for a in arrays:
            if self._at + a.nbytes > len(self._buf):
                raise ValueError(f"{a.nbytes} more bytes do not fit the {len(self._buf)}-byte private weights")
            spots.append(self._buf[self._at : self._at + a.nbytes])
            self._at += _aligned(a.nbytes)

        def copy(i: int) -> None:
            spots[i][:] = arrays[i].reshape(-1).view(np.uint8)
            if drop[i]:
                _drop_pages(arrays[i])

        if workers > 1 and len(arrays) > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix="localrt-copy") as pool:
                list(pool.map(copy, range(len(arrays))))
        else:
            for i in range(len(arrays)):
                copy(i)
        views = []
        for a, spot in zip(arrays, spots):
            view = spot.view(a.dtype).reshape(a.shape)
            view.flags.writeable = False  # the kernels are compiled for read-only weights, as the mmap's are
            views.append(view)
        return views

    def to_huge_pages(self) -> threading.Thread | None:
        """Move the copies onto transparent huge pages on a background thread at the lowest CPU priority (madvise
        HUGEPAGE, then COLLAPSE a huge page at a time): the load returns first, a forward keeps the CPU while it runs,
        and decode speeds up once it is done. Where the kernel has no MADV_COLLAPSE (before Linux 6.1), khugepaged
        does the same in its own time."""
        if not hasattr(mmap, "MADV_HUGEPAGE") or libc_madvise() is None:
            return None
        self._map.madvise(mmap.MADV_HUGEPAGE)

        start, end = self._buf.ctypes.data, self._buf.ctypes.data + len(self._buf)
        first = -(-start // _COLLAPSE_CHUNK) * _COLLAPSE_CHUNK  # huge pages whole inside the mapping

        def collapse(ref: weakref.ref) -> None:
            with contextlib.suppress(OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: this thread's nice
            for lo in range(first, end - _COLLAPSE_CHUNK + 1, _COLLAPSE_CHUNK):
                buf = ref()  # held through the call: the mapping stays; once the model is gone, so is the work
                if buf is None:
                    return
                if (
                    libc_madvise()(ctypes.c_void_p(lo), ctypes.c_size_t(_COLLAPSE_CHUNK), _MADV_COLLAPSE) != 0
                    and ctypes.get_errno() == errno.EINVAL
                ):
                    return  # no MADV_COLLAPSE here: khugepaged collapses the advised range
                del buf

        thread = threading.Thread(
            target=collapse, args=(weakref.ref(self._buf),), name="localrt-huge-pages", daemon=True
        )
        thread.start()
        return thread


def private_size(arrays) -> int:
    """Bytes a PrivateWeights needs for these arrays."""
    return sum(_aligned(a.nbytes) for a in arrays)


def _aligned(nbytes: int) -> int:
    """nbytes rounded up to ALIGN: the room one copy takes."""
    return -(-nbytes // ALIGN) * ALIGN


def _drop_pages(a: np.ndarray) -> None:
    """Unmap the whole pages inside a's bytes from this process (madvise DONTNEED); a read-only file mapping reads
    them back from the page cache if anything touches them again. A no-op where libc has no madvise."""
    start = a.ctypes.data
    lo = -(-start // _PAGE) * _PAGE
    hi = (start + a.nbytes) // _PAGE * _PAGE
    if hi <= lo:
        return
    madvise = libc_madvise()
    if madvise is not None:
        madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), mmap.MADV_DONTNEED)
