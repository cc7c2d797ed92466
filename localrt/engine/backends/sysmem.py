"""The machine's memory, total and available, on Linux, macOS and Windows (issue 46: the offline kit installs on
Windows, where os.sysconf and /proc do not exist). Linux reads /proc/meminfo's MemAvailable (it counts reclaimable
page cache); macOS and other POSIX systems have sysconf; Windows has GlobalMemoryStatusEx. Where none answers, a
conservative 4 GiB, so a load estimate still runs (and is logged as a guess)."""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)
GUESS = 4 << 30


def physical_memory() -> int:
    """Bytes of RAM (the machine's, not what is free now)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    status = _windows_status()
    if status is not None:
        return int(status.ullTotalPhys)
    log.warning("cannot read the machine's memory here: assuming %d GiB", GUESS >> 30)
    return GUESS


def available_memory(meminfo: str = "/proc/meminfo") -> int:
    """Bytes a new allocation can have without swapping: MemAvailable, else free physical memory, else the total."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    status = _windows_status()
    if status is not None:
        return int(status.ullAvailPhys)
    return physical_memory()


class _MemoryStatus(ctypes.Structure):
    _fields_ = [
        ("dwLength", ctypes.c_ulong),
        ("dwMemoryLoad", ctypes.c_ulong),
        ("ullTotalPhys", ctypes.c_ulonglong),
        ("ullAvailPhys", ctypes.c_ulonglong),
        ("ullTotalPageFile", ctypes.c_ulonglong),
        ("ullAvailPageFile", ctypes.c_ulonglong),
        ("ullTotalVirtual", ctypes.c_ulonglong),
        ("ullAvailVirtual", ctypes.c_ulonglong),
        ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
    ]


def _windows_status() -> _MemoryStatus | None:
    if sys.platform != "win32":
        return None
    try:
        status = _MemoryStatus()
        status.dwLength = ctypes.sizeof(_MemoryStatus)
        if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
            return status
    except (AttributeError, OSError):
        pass
    return None
