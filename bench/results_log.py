"""Benchmark results as data: one JSON line per run in bench/results/<benchmark>.jsonl.

Each bench script ends with `append_record(benchmark, results, native=..., threads=...)`. A record is

    {"benchmark": "decode", "date": "2026-12-04T01:58:31Z", "commit": "fdee05e",
     "cpu_model": "AMD EPYC 9B14", "cpu_flags": {"avx2": true, "avx512": true, "vnni": true},
     "threads": 2, "cpus": 2, "load": {"1m_at_start": 1.14, "1m_at_end": 1.64},
     "results": {...}, "native": {...} | null, "source": {...}}

`results` is what the script measured, under the script's own field names; `native` holds the native llama.cpp
peer's figures of the same run at the same paths they have in the run (split off with `split_native`), so that
`merged(record)` gives the run back as the script built it. Fields the machine could not tell are null. Records
converted from the old per-session JSON files say where each field came from in `source`.

`python3 bench/latest.py [BENCHMARK]` prints the latest record of each benchmark as a table.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"


def results_path(benchmark: str) -> Path:
    return RESULTS_DIR / f"{benchmark}.jsonl"


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def cpu_info() -> tuple[str | None, dict | None]:
    """(model name, {"avx2", "avx512", "vnni"} flags) from /proc/cpuinfo; platform.processor() and no flags elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine() or None, None
    model, flags = None, None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
    if flags is None:  # e.g. an ARM kernel: "Features", no x86 flags to report
        return model or platform.processor() or platform.machine() or None, None
    return model, {
        "avx2": "avx2" in flags,
        "avx512": "avx512f" in flags,
        "vnni": "avx512_vnni" in flags or "avx_vnni" in flags,
    }


def _threads() -> int | None:
    env = os.environ.get("NUMBA_NUM_THREADS")
    if env and env.isdigit():
        return int(env)
    numba = sys.modules.get("numba")
    return numba.get_num_threads() if numba is not None else None


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def make_record(
    benchmark: str, results: dict, *, native: dict | None = None, threads=None, load_at_start: float | None = None
) -> dict:
    model, flags = cpu_info()
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "cpu_model": model,
        "cpu_flags": flags,
        "threads": threads if threads is not None else _threads(),
        "cpus": os.cpu_count(),
        "load": {"1m_at_start": None if load_at_start is None else round(load_at_start, 2), "1m_at_end": _loadavg()},
        "results": results,
        "native": native,
        "source": {
            "script": os.path.relpath(os.path.abspath(sys.argv[0]), ROOT) if sys.argv and sys.argv[0] else None,
            "argv": sys.argv[1:],
            "tree_dirty": None if dirty is None else bool(dirty),
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
    }


def append_record(
    benchmark: str,
    results: dict,
    *,
    native: dict | None = None,
    threads=None,
    load_at_start: float | None = None,
    out: str | os.PathLike | None = None,
) -> Path:
    """Append one run to bench/results/<benchmark>.jsonl (or `out`); returns the path written."""
    record = make_record(benchmark, results, native=native, threads=threads, load_at_start=load_at_start)
    path = Path(out) if out else results_path(benchmark)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
    shown = os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else path
    print(f"appended a {benchmark} record to {shown}", file=sys.stderr)
    return path


def read_records(benchmark: str | None = None, path: str | os.PathLike | None = None) -> list[dict]:
    path = Path(path) if path else results_path(benchmark)
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def latest_record(benchmark: str | None = None, path=None, where=None) -> dict | None:
    """The last record of the file (appended last), or the last one for which where(record) is true."""
    for record in reversed(read_records(benchmark, path)):
        if where is None or where(record):
            return record
    return None


def split_native(results: dict, *patterns: tuple[str, ...]) -> dict | None:
    """Move the peer's figures out of results: each pattern is a key path (fnmatch patterns, e.g.
    ("files", "*", "native")); what it matches leaves results and lands at the same path in the returned dict."""
    native: dict = {}

    def walk(node, dest_path, pattern):
        if not isinstance(node, dict):
            return
        head, rest = pattern[0], pattern[1:]
        for key in [k for k in node if fnmatch.fnmatchcase(str(k), head)]:
            if rest:
                walk(node[key], dest_path + [key], rest)
            else:
                dest = native
                for part in dest_path:
                    dest = dest.setdefault(part, {})
                dest[key] = node.pop(key)

    for pattern in patterns:
        walk(results, [], tuple(pattern))
    return native or None


def deep_merge(base, extra):
    if not isinstance(base, dict) or not isinstance(extra, dict):
        return copy.deepcopy(extra)
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if key in out else copy.deepcopy(value)
    return out


def merged(record: dict) -> dict:
    """The run as its script built it: `results` with `native` put back at its paths."""
    return deep_merge(record.get("results") or {}, record.get("native") or {})
