"""The paged KV pool (localrt.engine.kv_cache / kv_pool): decode step time, and the attention kernel over blocks.

    python3 bench/kv_pool.py [--out FILE.jsonl] [--label paged] [--repeats N]

Appends one record per run to bench/results/kv_pool.jsonl (bench/results_log.py; --out: another JSONL file);
--label names the run (e.g. the tree it measured), `python3 bench/latest.py kv_pool` shows the latest.

On SmolLM2 (num_ctx 1024, 8 slots, 2 threads): the best and median time of one Batcher step with 1 and with 8
sequences decoding (200-token prompts, prompt-lookup drafting off), best of REPEATS rounds of STEPS steps. Run
the same file from a checkout before the pool (copy it and bench/results_log.py in, `--label contiguous --out
<this checkout>/bench/results/kv_pool.jsonl`: the record carries that checkout's commit) for the comparison. Where
simd_kernels.paged exists, also the per-row attention kernel alone over the same keys, contiguous per slot vs in
shuffled 64-position blocks (SmolLM2's 9 query / 3 KV heads of 64, 600 keys, f16, one thread, best of 7 x 200).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from results_log import append_record  # noqa: E402

STEPS, REPEATS = 30, 3
TEXT = "The history of the printing press begins in the fifteenth century, when movable metal type made books cheaper. "


def decode_steps(model, n: int, repeats: int) -> dict:
    from localrt.engine.batch import Batcher

    best, medians = float("inf"), []
    for _ in range(repeats):
        model.cache.forget_prefixes()
        b = Batcher(model)
        seqs = [
            b.add(
                model.tokenize(f"{i}: " + TEXT * 6)[:200],
                {"temperature": 0, "num_predict": 400, "draft_num_predict": 0},
            )
            for i in range(n)
        ]
        while any(s.state != "decode" for s in seqs):
            b.step()
        for _ in range(3):
            b.step()
        times = []
        for _ in range(STEPS):
            t0 = time.perf_counter()
            b.step()
            times.append(time.perf_counter() - t0)
        b.close()
        times.sort()
        best, medians = min(best, times[0]), medians + [times[len(times) // 2]]
    return {"best_ms": round(best * 1e3, 2), "median_ms": round(float(np.median(medians)) * 1e3, 2)}


def kernel_ab() -> dict | None:
    try:
        from simd_kernels import ops, paged
    except ImportError:
        return None
    import numba

    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    n_head, n_kv, hd, cap, size = 9, 3, 64, 1024, 64
    out = {}
    for rows in (1, 8):
        kc = rng.standard_normal((8, n_kv, cap, hd)).astype(np.float16).view(np.uint16)  # (n_slots, n_kv, cap, hd)
        per = cap // size
        table = rng.permutation(8 * per).reshape(8, per).astype(np.int32)  # (n_slots, max_blocks)
        kp = np.empty((8 * per, n_kv, size, hd), np.uint16)  # (n_blocks, n_kv, B, hd)
        for s in range(8):
            for i in range(per):
                kp[table[s, i]] = kc[s, :, i * size : (i + 1) * size]
        q = rng.standard_normal((rows, n_head, hd)).astype(np.float32)
        pos, sl = np.full(rows, 600, np.int64), np.arange(rows, dtype=np.int64)
        o1, o2 = np.empty((rows, n_head, hd), np.float32), np.empty((rows, n_head, hd), np.float32)

        def best(f) -> float:
            t = float("inf")
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(200):
                    f()
                t = min(t, (time.perf_counter() - t0) / 200)
            return round(t * 1e6, 1)

        a = best(lambda: ops.attention(q, kc, kc, pos, sl, 0, 0.125, o1))
        b = best(lambda: paged.attention_paged(q, kp, kp, table, pos, sl, 0, 0.125, o2))
        out[f"{rows}_rows_us"] = {"contiguous": a, "paged": b, "bit_equal": bool(np.array_equal(o1, o2))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="append the record to this JSONL file, not bench/results/kv_pool.jsonl")
    ap.add_argument("--label", default="paged")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    from localrt import load_model
    from localrt.models.builtin_models import smollm2_path

    model = load_model(smollm2_path(), num_ctx=1024, n_slots=8)
    result = {
        "label": args.label,
        "machine": platform.processor() or platform.machine(),
        "decode_step": {f"{n}_seq": decode_steps(model, n, args.repeats) for n in (1, 8)},
        "attention_kernel": kernel_ab(),
    }
    print(json.dumps(result, indent=2))
    append_record(
        "kv_pool", result, threads=int(os.environ["NUMBA_NUM_THREADS"]), load_at_start=load_at_start, out=args.out
    )


if __name__ == "__main__":
    main()
