"""Decode matvec of the IQ4 kernels against Q4_K and Q4_0 on random 2048x2048 blocks, timed in alternation.

    python3 bench/iq4_matvec.py [--budget SECONDS]   (appends a record to bench/results/iq4_matvec.jsonl, prints it)

Per format: best and median microseconds per call, weight bytes read per second, and the time relative to
Q4_K; with one thread and with all of Numba's threads. The formats are timed in alternation (kernels.py's
timed_together), so load from other processes falls on all of them alike; on a shared machine compare the
ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simd_kernels as sk  # noqa: E402
from simd_kernels import threads  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import timed_together  # noqa: E402
from results_log import append_record  # noqa: E402

FORMATS = {"Q4_K": 12, "Q4_0": 2, "IQ4_NL": 20, "IQ4_XS": 23}
SCALE_OFFSETS = {12: [0, 2], 2: [0], 20: [0], 23: [0]}  # f16 fields set to small finite values
N = 2048


def random_blocks(rng, t: int) -> np.ndarray:
    per, size = sk.BLOCKS[t]
    w = rng.integers(0, 256, (N, N // per, size), dtype=np.uint8)
    for o in SCALE_OFFSETS[t]:
        w[:, :, o : o + 2] = (
            (rng.standard_normal((N, N // per)) * 0.01).astype(np.float16).view(np.uint8).reshape(N, N // per, 2)
        )
    w = w.reshape(N, -1)
    w.flags.writeable = False  # as a model's mmap: the kernel variant the engine runs
    return w


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=4.0, help="seconds of timing per thread count")
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N).astype(np.float32)
    weights = {name: random_blocks(rng, t) for name, t in FORMATS.items()}
    out = {name: np.empty(N, np.float32) for name in FORMATS}
    results = {}
    thread_counts = sorted({1, numba.config.NUMBA_NUM_THREADS})
    for n_threads in thread_counts:

        def call(name):
            def run():
                threads.force(n_threads)
                sk.MUL[FORMATS[name]](weights[name], x.reshape(1, N), out[name].reshape(1, N))

            return run

        timed = timed_together({name: call(name) for name in FORMATS}, args.budget)
        base = timed["Q4_K"]["best_s"]
        results[f"threads_{n_threads}"] = {
            name: {
                "bytes": weights[name].nbytes,
                "us_best": t["best_s"] * 1e6,
                "us_median": t["median_s"] * 1e6,
                "GBps_best": weights[name].nbytes / t["best_s"] / 1e9,
                "time_vs_q4_k": t["best_s"] / base,
                "reps": t["reps"],
            }
            for name, t in timed.items()
        }
    doc = {
        "machine": {
            "cpu": platform.machine(),
            "cores": os.cpu_count(),
            "numba": numba.__version__,
            "loadavg_at_start": list(os.getloadavg()),
        },
        "note": "random 2048x2048 blocks, one token (decode matvec); 2 shared cores: compare the ratios",
        "matrix": [N, N],
        "results": results,
    }
    print(json.dumps(doc, indent=1))
    append_record("iq4_matvec", doc, threads=thread_counts, load_at_start=load_at_start)


if __name__ == "__main__":
    main()
