"""Device discovery: is CuPy importable, does it see a GPU, how much memory is free.

CuPy is the optional extra `localrt[cuda]`. Without it, or without a visible GPU, `probe` returns a
report with `gpu=None` and the reason; `log_cpu_fallback` logs that reason once per process, so a CPU-only
machine says plainly why it runs on the CPU without repeating it on every load.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from types import ModuleType

log = logging.getLogger("localrt.devices")

_logged = threading.Event()


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str
    free_bytes: int
    total_bytes: int
    compute_capability: str  # "90" for an H100/H200, as CUDA reports major*10+minor


@dataclass(frozen=True)
class DeviceReport:
    gpu: GPUInfo | None
    reason: str  # why there is no GPU ("" when there is one)


def import_cupy() -> tuple[ModuleType | None, str]:
    """(cupy, "") or (None, why not)."""
    try:
        return importlib.import_module("cupy"), ""
    except ImportError as e:
        return None, f"CuPy is not installed (install the extra: pip install 'localrt[cuda]'): {e}"
    except Exception as e:  # a broken CUDA install raises all sorts at import time
        return None, f"CuPy failed to import: {type(e).__name__}: {e}"


def probe(index: int = 0, *, cupy: ModuleType | None = None) -> DeviceReport:
    """Report GPU `index` (main_gpu) with its free/total memory, or why none is usable."""
    cp = cupy
    if cp is None:
        cp, why = import_cupy()
        if cp is None:
            return DeviceReport(None, why)
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver, no device node, CUDA_VISIBLE_DEVICES="" ...
        return DeviceReport(None, f"CUDA sees no device: {type(e).__name__}: {e}")
    if count <= 0:
        return DeviceReport(None, "CUDA sees no device")
    if not 0 <= index < count:
        return DeviceReport(None, f"main_gpu {index} does not exist (CUDA sees {count} device(s))")
    try:
        with cp.cuda.Device(index):
            free, total = (int(v) for v in cp.cuda.runtime.memGetInfo())
        props = cp.cuda.runtime.getDeviceProperties(index)
    except Exception as e:
        return DeviceReport(None, f"GPU {index} is not usable: {type(e).__name__}: {e}")
    name = props.get("name", b"GPU")
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    cc = f"{props.get('major', 0)}{props.get('minor', 0)}"
    return DeviceReport(GPUInfo(index, name, free, total, cc), "")


def log_cpu_fallback(report: DeviceReport) -> None:
    """One log line per process saying why layers run on the CPU (nothing when a GPU is there)."""
    if report.gpu is None and not _logged.is_set():
        _logged.set()
        log.info("no usable GPU, running on the CPU: %s", report.reason)
