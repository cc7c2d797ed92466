"""The per-row attention kernel (simd_kernels.attend: decode and draft rows) by head shape, keys and rows, JSON out.

    python3 bench/attention.py [--against REV] [--threads 1 2] [--out FILE.jsonl]

Appends one record per run to bench/results/attention.jsonl (bench/results_log.py; --out: another JSONL file).

Shapes: the real models' heads (SmolLM2: 9 query heads on 3 KV heads of 64 dims; Gemma 3 270M: 4 on 1 of 256) over
an F16 cache: a paged pool of 256-position blocks (SmolLM2, Gemma 3's global layers) and Gemma 3's 512-position
sliding-window ring. Per case, microseconds per call (the kernel without the Python checks: `attend._parallel` on 2
threads, `_serial` on 1), best of 5 rounds of 100 calls. With --against, simd_kernels/attend.py as it was at git
revision REV is loaded beside the current one (its imports of the package's other modules are today's) and timed
in the same rounds, interleaved: `against_us` and `speedup` beside `us`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numba  # noqa: E402
import numpy as np  # noqa: E402

from simd_kernels import attend  # noqa: E402
from results_log import append_record  # noqa: E402

# name -> (n_head, n_kv, head_dim, block rows, window): the pool's blocks, or (window > 0) one ring of that many rows
SHAPES = {
    "smollm2_paged": (9, 3, 64, 256, 0),
    "gemma3_paged": (4, 1, 256, 256, 0),
    "gemma3_ring": (4, 1, 256, 512, 512),
}
KEYS, ROWS, ROUNDS, CALLS = (110, 250, 500, 1000), (1, 2, 4), 5, 100


def load_at(rev: str):
    """simd_kernels/attend.py at git revision rev, as a module of its own (relative imports made absolute)."""
    src = subprocess.run(
        ["git", "show", f"{rev}:simd_kernels/attend.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    src = re.sub(r"^from \. import", "from simd_kernels import", src, flags=re.M)
    src = re.sub(r"^from \.(\w+) import", r"from simd_kernels.\1 import", src, flags=re.M)
    path = Path(tempfile.mkdtemp()) / f"attend_{rev[:12]}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case(n_head: int, n_kv: int, hd: int, size: int, window: int, keys: int, rows: int, seed: int = 0):
    """(q, k, v, table, paged, positions, slots, window) for `rows` rows of one slot whose last key is keys - 1."""
    rng = np.random.default_rng(seed)
    paged = window == 0
    n_blocks = (keys + rows + size - 1) // size if paged else 1
    k = (rng.standard_normal((n_blocks, n_kv, size, hd)) * 0.5).astype(np.float16).view(np.uint16)
    v = (rng.standard_normal((n_blocks, n_kv, size, hd)) * 0.5).astype(np.float16).view(np.uint16)
    table = np.arange(n_blocks, dtype=np.int32)[None, :] if paged else attend.NO_TABLE
    q = rng.standard_normal((rows, n_head, hd)).astype(np.float32)
    positions = np.arange(keys - 1, keys - 1 + rows, dtype=np.int64)
    return q, k, v, table, paged, positions, np.zeros(rows, np.int64), window


def timed(module, threads: int, args, scale: float) -> float:
    q, k, v, table, paged, positions, slots, window = args
    out = np.empty(q.shape, np.float32)
    fn = module._parallel if threads > 1 else module._serial
    sinks = (module.NO_SINKS,) if hasattr(module, "NO_SINKS") else ()  # revisions before attention sinks take none
    fn(q, k, v, table, paged, positions, slots, window, scale, np.float32(0), out, *sinks)
    best = float("inf")
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn(q, k, v, table, paged, positions, slots, window, scale, np.float32(0), out, *sinks)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default=None, metavar="REV", help="also time attend.py as it was at this revision")
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument(
        "--out", default=None, help="append the record to this JSONL file, not bench/results/attention.jsonl"
    )
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    other = load_at(args.against) if args.against else None
    result = {
        "setup": {
            "commit": commit.strip(),
            "against": args.against,
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "rounds": ROUNDS,
            "calls": CALLS,
            "note": "best call of rounds x calls; a shared machine's speed drifts, so compare within a run",
        },
        "cases": [],
    }
    for name, (n_head, n_kv, hd, size, window) in SHAPES.items():
        for threads in args.threads:
            numba.set_num_threads(threads)
            for keys in KEYS:
                for rows in ROWS:
                    a = case(n_head, n_kv, hd, size, window, keys, rows)
                    scale = float(hd) ** -0.5
                    ours, theirs = float("inf"), float("inf")
                    for _ in range(ROUNDS):
                        ours = min(ours, timed(attend, threads, a, scale))
                        if other is not None:
                            theirs = min(theirs, timed(other, threads, a, scale))
                    row = {"shape": name, "threads": threads, "keys": keys, "rows": rows, "us": round(ours * 1e6, 1)}
                    if other is not None:
                        row |= {"against_us": round(theirs * 1e6, 1), "speedup": round(theirs / ours, 2)}
                    result["cases"].append(row)
                    print(json.dumps(row), flush=True)
    append_record("attention", result, threads=sorted(set(args.threads)), load_at_start=load_at_start, out=args.out)


if __name__ == "__main__":
    main()
