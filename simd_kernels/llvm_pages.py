"""Give back LLVM's code pages once kernels are loaded.

libllvmlite.so is LLVM itself (170 MB on disk). Importing it runs its static constructors, spread across all of its
code, and making the target context runs more of it; after that and SmolLM2's kernel loads, 35 MB of its code and
16 MB of its read-only data were resident in this process here: a sixth of the model's peak RSS, for code that
decode and prefill never run. Only a kernel load or a compile calls LLVM, and briefly.

`release()` unmaps those pages from this process (madvise MADV_DONTNEED). They stay in the page cache, shared and
evictable like any file's; whatever touches them again (the next kernel load, a compile) maps them back with a minor
fault. Only mappings that cannot hold private data are touched: not writable, and without a single private
(copy-on-write) page. The dynamic loader's relocated read-only data (RELRO) has private pages, and dropping those
would undo its relocations; such a mapping is left as it is.
"""

from __future__ import annotations

import ctypes
import mmap
import os

from llvmlite.binding import ffi

from .madvise import libc_madvise

_ranges: list[tuple[int, int]] | None = None  # [(start, end)] of libllvmlite's clean mappings, found once


def clean_mappings(smaps: str = "/proc/self/smaps") -> list[tuple[int, int]]:
    """[(start, end)] of this process's mappings of libllvmlite that are not writable and hold no private page."""
    name = ffi.get_library_name() if hasattr(ffi, "get_library_name") else "libllvmlite.so"
    found, current = [], None
    with open(smaps) as lines:
        for line in lines:
            head = line.split(maxsplit=5)
            if not head[0].endswith(":"):  # a mapping's first line: start-end perms offset dev inode [path]
                path = head[5].strip() if len(head) > 5 else ""
                current = None
                if os.path.basename(path) == name and "w" not in head[1]:
                    start, end = (int(x, 16) for x in head[0].split("-"))
                    current = (start, end)
            elif head[0] == "Anonymous:" and current is not None:  # private pages of the mapping, in kB
                if int(head[1]) == 0:
                    found.append(current)
                current = None
    return found


def release() -> None:
    """Unmap libllvmlite's clean pages from this process (a no-op without /proc or madvise). Safe at any moment: a
    page dropped while another thread runs LLVM's code is faulted back in from the file."""
    global _ranges
    if _ranges is None:
        try:
            _ranges = clean_mappings()
        except (OSError, ValueError, IndexError):  # no /proc here, or a smaps it cannot read: nothing is dropped
            _ranges = []
    madvise = libc_madvise()
    if madvise is None:
        return
    for start, end in _ranges:
        madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)
