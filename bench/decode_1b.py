"""Decode (tg64) and prefill (pp128) speed on 1B-class random-weight files, ours vs native llama-bench, with MBU.

    python3 bench/decode_1b.py FILE.gguf ... [--out FILE.jsonl] [--quiet]

Appends one record per run to bench/results/decode.jsonl (bench/results_log.py; --out: another JSONL file).

FILEs come from `bench/make_model.py` (every arch's 1b shape, qwen3moe's a3b MoE shape, and gpt-oss's 20b: 4 of its 24
layers, its 201088-row vocabulary, MXFP4 experts and the rest Q8_0, as gpt-oss's own files). Per file, ours then
native, each in its own process (2 threads: NUMBA_NUM_THREADS=2 / `llama-bench -t 2`): ours loads with
`localrt.engine.loader.load_model` (use_mmap unset: the 1B files' weights are copied into private memory, and timing starts once they are on huge pages), prefills a
16-token prompt, then times 64 greedy single-token steps (best of 3), and one 128-token prefill (logits of the
last token only, best of 3); native runs `llama-bench -m FILE -t 2 -p 128 -n 64 -r 3 -o json` (pp128 and tg64,
from an empty context as ours). With --depth D, both also time 32 greedy steps after a D-token context (ours: the
prompt repeated to D tokens, prefilled in 512-token chunks, then 32 steps, best of 3; native: `llama-bench -p 0
-n 32 -d D`): `tg32_dD_tok_s`, where attention over the cache is part of each step. MBU = weight bytes one decode step
reads x tok/s / the memory read bandwidth measured here first (a 2-thread Numba prange sum over a 2 GiB float32
array, best of 5). The bytes per token are every tensor of the file but the token embedding's unused rows; a tied
embedding is read in full as the output; of a MoE layer's stacked experts (`ffn_*_exps`) only expert_used_count /
expert_count are read per token.
With --quiet each timed process runs under /tmp/prof/quiet.sh (pauses the other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from results_log import append_record, latest_record, split_native

ROOT = Path(__file__).resolve().parent.parent
LLAMA_BENCH = Path(
    os.environ.get("LLAMA_BENCH", "/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench")
)
QUIET = Path("/tmp/prof/quiet.sh")
THREADS, N_GEN, N_PP, N_PROMPT, REPEATS = 2, 64, 128, 16, 3
N_DEPTH_GEN = 32  # steps timed after a --depth context
BW_BYTES = 2 << 30


def bandwidth() -> dict:
    """Memory read bandwidth: best of 5 sums over a 2 GiB float32 array, 2 Numba threads."""
    import numba
    import numpy as np

    @numba.njit(parallel=True, nogil=True, fastmath=True)
    def total(a):  # a: (n,) float32
        s = 0.0
        for i in numba.prange(a.shape[0]):
            s += a[i]
        return s

    a = np.ones(BW_BYTES // 4, np.float32)  # (n,) float32: 2 GiB, far beyond any cache
    total(a[:1024])  # compile outside the timing
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        s = total(a)
        best = min(best, time.perf_counter() - t0)
    assert s == a.size
    return {"bytes": BW_BYTES, "threads": numba.get_num_threads(), "read_GB_s": round(BW_BYTES / best / 1e9, 2)}


def weight_bytes(path: str) -> dict:
    """Bytes of weights one decode step reads: every tensor, but one row of an untied token embedding."""
    import gguf_io

    with gguf_io.open(path) as f:
        sizes = {name: int(t.data.nbytes) for name, t in f.tensors.items()}
        arch = f.metadata["general.architecture"]
        embd_rows = int(f.tensors["token_embd.weight"].shape[0])
        n_expert = int(f.metadata.get(f"{arch}.expert_count", 0) or 0)
        n_used = int(f.metadata.get(f"{arch}.expert_used_count", 0) or 0)
    total = sum(sizes.values())
    tied = "output.weight" not in sizes  # gemma2 never reads one; the others fall back to token_embd
    per_token = total if tied else total - sizes["token_embd.weight"] + sizes["token_embd.weight"] // embd_rows
    experts = sum(n for name, n in sizes.items() if "_exps." in name)  # (n_expert, rows, row bytes) each
    if n_expert:
        per_token -= experts - experts * n_used // n_expert  # one token reads its n_used experts' slices only
    out = {"arch": arch, "file_tensor_bytes": total, "tied_output": tied, "bytes_per_token": per_token}
    if n_expert:
        out.update(n_expert=n_expert, n_expert_used=n_used, expert_tensor_bytes=experts)
    return out


def run_ours(path: str, repeats: int = REPEATS, depth: int = 0) -> dict:
    import numpy as np

    from localrt.engine.loader import load_model

    t0 = time.perf_counter()
    model = load_model(path, num_ctx=max(512, depth + N_DEPTH_GEN))
    load_s = time.perf_counter() - t0
    prompt = model.tokenize("The history of the printing press begins in the fifteenth century, when")[:N_PROMPT]
    pp_ids = (prompt * (N_PP // len(prompt) + 1))[:N_PP]
    last = lambda n: np.array([n - 1])  # noqa: E731 - logits of the last prompt token only

    def reset():
        model.cache.clear(0)
        model.cache.forget_prefixes()

    reset()  # warm-up: compiles (or loads from cache) every kernel both paths use
    model.forward(model.batch(pp_ids, 0), model.cache, output_rows=last(N_PP))
    model.forward(model.batch([1], N_PP), model.cache)
    model.finish_loading()  # private weights (use_mmap unset): steady speeds are once they are on huge pages
    decode_s = prefill_s = float("inf")
    for _ in range(repeats):  # best of repeats: the minimum is the signal on a shared machine
        reset()
        token = int(np.argmax(model.forward(model.batch(prompt, 0), model.cache, output_rows=last(len(prompt)))[0]))
        t0 = time.perf_counter()
        for pos in range(len(prompt), len(prompt) + N_GEN):
            token = int(np.argmax(model.forward(model.batch([token], pos), model.cache)[0]))
        decode_s = min(decode_s, time.perf_counter() - t0)
    for _ in range(repeats):
        reset()
        t0 = time.perf_counter()
        model.forward(model.batch(pp_ids, 0), model.cache, output_rows=last(N_PP))
        prefill_s = min(prefill_s, time.perf_counter() - t0)
    out = {
        "load_s": round(load_s, 2),
        "tg64_tok_s": round(N_GEN / decode_s, 2),
        "pp128_tok_s": round(N_PP / prefill_s, 2),
        "numba_threads": int(os.environ.get("NUMBA_NUM_THREADS", 0)),
    }
    if depth:
        ctx = (prompt * (depth // len(prompt) + 1))[:depth]

        def context():
            reset()
            for lo in range(0, depth, 512):
                hi = min(depth, lo + 512)
                model.forward(model.batch(ctx[lo:hi], lo), model.cache, output_rows=last(hi - lo))

        context()
        deep_s = float("inf")
        for _ in range(repeats):
            if model.cache.can_trim(0, depth):  # back to the D-token context
                model.cache.trim(0, depth)
            else:  # a sliding-window ring has overwritten it
                context()
            token = 1
            t0 = time.perf_counter()
            for pos in range(depth, depth + N_DEPTH_GEN):
                token = int(np.argmax(model.forward(model.batch([token], pos), model.cache)[0]))
            deep_s = min(deep_s, time.perf_counter() - t0)
        out[f"tg{N_DEPTH_GEN}_d{depth}_tok_s"] = round(N_DEPTH_GEN / deep_s, 2)
    return out


def run_native(path: str, quiet: bool, repeats: int = REPEATS, depth: int = 0) -> dict:
    out = _native(path, quiet, repeats, ["-p", str(N_PP), "-n", str(N_GEN)])
    if depth and "error" not in out:
        out.update(_native(path, quiet, repeats, ["-p", "0", "-n", str(N_DEPTH_GEN), "-d", str(depth)]))
    return out


def _native(path: str, quiet: bool, repeats: int, tests: list[str]) -> dict:
    cmd = [str(LLAMA_BENCH), "-m", path, "-t", str(THREADS), *tests, "-r", str(repeats), "-o", "json"]
    proc = subprocess.run(_wrap(cmd, quiet), capture_output=True, text=True, cwd=ROOT, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    out = {}
    for test in json.loads(proc.stdout[proc.stdout.index("[") :]):
        key = f"pp{test['n_prompt']}" if test["n_prompt"] else f"tg{test['n_gen']}"
        if test.get("n_depth"):
            key += f"_d{test['n_depth']}"
        out[f"{key}_tok_s"] = round(max(test["samples_ts"]), 2)  # best of -r, as ours
        out[f"{key}_avg_tok_s"] = round(test["avg_ts"], 2)
        out["build_commit"] = test.get("build_commit")
    return out


def _wrap(cmd: list[str], quiet: bool) -> list[str]:
    return ["env", f"QUIET_KEEP={ROOT}", str(QUIET), *cmd] if quiet else cmd  # keep this checkout running


def spawn(mode: str, arg: str, quiet: bool, repeats: int = REPEATS, depth: int = 0) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(THREADS), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, __file__, "--worker", mode, arg, "--repeats", str(repeats), "--depth", str(depth)]
    proc = subprocess.run(_wrap(cmd, quiet), capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mbu(tok_s: float | None, per_token: int, bw: float) -> float | None:
    return round(tok_s * per_token / 1e9 / bw, 3) if tok_s else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--out", default=None, help="append the record to this JSONL file, not bench/results/decode.jsonl")
    ap.add_argument("--quiet", action="store_true", help="run each timed process under /tmp/prof/quiet.sh")
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "ARG"))
    ap.add_argument("--repeats", type=int, default=REPEATS, help="best of how many runs, both engines")
    ap.add_argument("--depth", type=int, default=0, help="also time 32 steps after a context of this many tokens")
    ap.add_argument(
        "--no-bandwidth", action="store_true", help="keep the bandwidth of the latest decode record (in --out if given)"
    )
    args = ap.parse_args()
    if args.worker:
        mode, arg = args.worker
        print(json.dumps(bandwidth() if mode == "bandwidth" else run_ours(arg, args.repeats, args.depth)))
        return
    load_at_start = os.getloadavg()[0]
    results = {
        "files": {},
        "setup": {
            "threads": THREADS,
            "n_gen": N_GEN,
            "n_pp": N_PP,
            "ours_prompt_tokens": N_PROMPT,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "quiet": args.quiet,
            "loadavg_1m_at_start": round(load_at_start, 2),
            "note": "random weights from bench/make_model.py, SmolLM2's tokenizer (49152 tokens; gpt-oss's 20b file pads "
            "it to 201088 rows); tok/s is the best "
            "of best_of (per file) for both engines (native's mean is *_avg_tok_s); shared 2-core machine, others paused "
            "when quiet",
        },
    }
    earlier = (
        latest_record("decode", args.out, where=lambda r: "bandwidth" in r["results"]) if args.no_bandwidth else None
    )
    if earlier is not None:
        results["bandwidth"] = bw = earlier["results"]["bandwidth"]
        results["setup"]["bandwidth_from"] = f"the decode record of {earlier['date']} at {earlier['commit']}"
    else:
        results["bandwidth"] = bw = spawn("bandwidth", "-", args.quiet)
    print("bandwidth", bw, flush=True)
    try:
        for path in args.files:
            sizes = weight_bytes(path)
            ours = spawn("ours", path, args.quiet, args.repeats, args.depth)
            native = run_native(path, args.quiet, args.repeats, args.depth)
            per, gbs = sizes["bytes_per_token"], bw.get("read_GB_s")
            entry = {**sizes, "best_of": args.repeats, "ours": ours, "native": native}
            if gbs:
                entry["mbu_ours"] = mbu(ours.get("tg64_tok_s"), per, gbs)
                entry["mbu_native"] = mbu(native.get("tg64_tok_s"), per, gbs)
            for key in ("tg64_tok_s", "pp128_tok_s", f"tg{N_DEPTH_GEN}_d{args.depth}_tok_s"):
                if ours.get(key) and native.get(key):
                    entry[f"ratio_{key.removesuffix('_tok_s')}"] = round(ours[key] / native[key], 3)
            results["files"][Path(path).name] = entry
            print(Path(path).name, json.dumps(entry), flush=True)
    finally:  # an interrupted run still records the files it finished
        if len(results["files"]) < len(args.files):
            results["setup"]["partial"] = True
        results["setup"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        if results["files"]:
            native = split_native(results, ("files", "*", "native"))
            append_record("decode", results, native=native, threads=THREADS, load_at_start=load_at_start, out=args.out)


if __name__ == "__main__":
    main()
