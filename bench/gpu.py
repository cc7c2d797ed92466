"""GPU layer offload speed: prefill/decode tok/s with 0, half and all layers on the GPU, llama.cpp's CPU beside.

    python3 bench/gpu.py [--models smollm2 gemma3] [--out FILE.jsonl] [--threads N]

Appends one record per run to bench/results/gpu.jsonl (bench/results_log.py; --out: another JSONL file).

Each (model, placement) runs in a fresh process: a 512-token prompt (logits of the last token only) then
128 greedy single-token decode steps, as bench/generate.py measures. "all" is n_layer + 1 (the output layer
too, llama.cpp's numbering). llama.cpp runs on the CPU through llama-cpp-python (n_gpu_layers=0) when it
is importable, else its entry says why not. Without a usable GPU the script writes the reason and exits 0.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_log import append_record, split_native  # noqa: E402

N_PROMPT, N_DECODE, N_CTX = 512, 128, 2048


def run_ours(model_path: str, ids: list[int], num_gpu: int) -> dict:
    import numpy as np

    from localrt import load_model

    t0 = time.perf_counter()
    model = load_model(model_path, num_ctx=N_CTX, num_gpu=num_gpu)
    plan = model.placement
    load_s = time.perf_counter() - t0
    warm = model.forward(model.batch(ids[:16], 0), model.cache, output_rows=np.array([15]))  # compiles kernels
    assert warm.shape[0] == 1
    model.cache.clear(0)
    t0 = time.perf_counter()
    logits = model.forward(model.batch(ids, 0), model.cache, output_rows=np.array([len(ids) - 1]))[0]
    prefill_s = time.perf_counter() - t0
    token = int(np.argmax(logits))
    t0 = time.perf_counter()
    for pos in range(len(ids), len(ids) + N_DECODE):
        token = int(np.argmax(model.forward(model.batch([token], pos), model.cache)[0]))
    decode_s = time.perf_counter() - t0
    return {
        "num_gpu": plan.n_gpu,
        "gpu_layers": len(plan.gpu_layers),
        "output_on_gpu": plan.output,
        "vram_mb": round(plan.vram_bytes / 2**20, 1),
        "load_s": round(load_s, 3),
        "prefill_tok_s": round(len(ids) / prefill_s, 1),
        "decode_tok_s": round(N_DECODE / decode_s, 1),
    }


def run_llamacpp(model_path: str, ids: list[int], threads: int) -> dict:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(
        model_path,
        n_ctx=N_CTX,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        n_gpu_layers=0,
        logits_all=False,
        verbose=False,
    )
    n_vocab = llm.n_vocab()

    def last_logits():
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))

    t0 = time.perf_counter()
    llm.eval(ids)
    token = int(np.argmax(last_logits()))
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(N_DECODE):
        llm.eval([token])
        token = int(np.argmax(last_logits()))
    decode_s = time.perf_counter() - t0
    return {
        "num_gpu": 0,
        "threads": threads,
        "prefill_tok_s": round(len(ids) / prefill_s, 1),
        "decode_tok_s": round(N_DECODE / decode_s, 1),
    }


def worker(engine: str, model: str, num_gpu: int, threads: int) -> None:
    from generate import prompt_ids

    from localrt.models import builtin_models

    path = str(builtin_models.BUILTIN[model]())
    ids = prompt_ids(path)[:N_PROMPT]
    out = run_ours(path, ids, num_gpu) if engine == "ours" else run_llamacpp(path, ids, threads)
    print(json.dumps(out))


def spawn(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def n_layer_of(model: str) -> int:
    import gguf_io

    from localrt.models import builtin_models

    with gguf_io.open(builtin_models.BUILTIN[model]()) as f:
        md = f.metadata
        return int(md[f"{md['general.architecture']}.block_count"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    ap.add_argument("--out", default=None, help="append the record to this JSONL file, not bench/results/gpu.jsonl")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--worker", nargs=3, metavar=("ENGINE", "MODEL", "NUM_GPU"))
    args = ap.parse_args()
    if args.worker:
        engine, model, num_gpu = args.worker
        return worker(engine, model, int(num_gpu), args.threads)
    load_at_start = os.getloadavg()[0]

    from localrt.engine.backends import devices

    report = devices.probe(0)
    results: dict = {
        "setup": {
            "n_prompt": N_PROMPT,
            "n_decode": N_DECODE,
            "n_ctx": N_CTX,
            "threads": args.threads,
            "machine": platform.machine(),
            "python": platform.python_version(),
            "gpu": None if report.gpu is None else vars(report.gpu),
        },
        "models": {},
    }
    if report.gpu is None:
        results["skipped"] = f"no usable GPU: {report.reason}"
        print(results["skipped"])
    else:
        try:
            import llama_cpp

            llama_version = llama_cpp.__version__
        except ImportError:
            llama_version = None
        results["setup"]["llama_cpp_python"] = llama_version
        for model in args.models:
            n = n_layer_of(model)
            entry = {
                f"ours_num_gpu_{k}": spawn("ours", model, str(k), "--threads", str(args.threads))
                for k in (0, n // 2, n + 1)
            }
            entry["llamacpp_cpu"] = (
                spawn("llamacpp", model, "0", "--threads", str(args.threads))
                if llama_version
                else {"error": "llama-cpp-python is not importable"}
            )
            results["models"][model] = entry
            print(model, json.dumps(entry), flush=True)
    native = split_native(results, ("models", "*", "llamacpp_cpu"))
    append_record("gpu", results, native=native, threads=args.threads, load_at_start=load_at_start, out=args.out)


if __name__ == "__main__":
    main()
