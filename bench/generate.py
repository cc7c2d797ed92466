"""Generation speed and memory on the real models, ours and llama.cpp's side by side, JSON out.

    python3 bench/generate.py [--models smollm2 gemma3] [--paths FILE.gguf ...] [--out FILE.jsonl]

Appends one record per run to bench/results/generate.jsonl (bench/results_log.py; --out: another JSONL file).

`--paths`: other GGUF files (e.g. bench/make_model.py's 1B shapes), benched the same way under their file names.

Per model and engine, each in a fresh process (so its memory is its own): load time to the first token of a
short prompt (the best of the --repeats fresh processes, the engines taking turns), prefill tok/s on a 512-token
prompt (logits of the last token only), decode tok/s over 128 greedy single-token steps (best of 3 runs each,
after a private copy of the weights has moved onto huge pages: localrt.engine.backends.resident), and memory with a
2048-token context. llama.cpp runs through llama-cpp-python (n_threads=2, logits_all off) when it is importable,
else its entry says why not.

Our load time is also given after Numba's one-time start-up (what `localrt serve` does on a background
thread when it starts), in a worker of its own.

Like with like: the 512 prompt ids are made here, in the parent, so neither worker carries our tokenizer
for the other. Load time is given two ways: from the engine's load call (library already imported) and
from the worker's process start (interpreter, imports and all). Memory is split as Linux counts it
(/proc/self/status): peak RSS (VmHWM), and the largest RssFile (file-backed pages: the mapped weights and
shared libraries, shared with the page cache and evictable) and RssAnon (private memory: KV cache,
buffers, interpreter, JIT code) seen after load, prefill and decode.

Our sources are byte-compiled first (`compileall`), as pip leaves an installed package: where the environment
sets PYTHONDONTWRITEBYTECODE, every module our load imports lazily would otherwise be compiled from source
inside the timed load (22 modules, 0.03 s here).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from results_log import append_record, split_native

ROOT = Path(__file__).resolve().parent.parent
N_PROMPT, N_DECODE, N_CTX, THREADS = 512, 128, 2048, 2
REPEATS = int(os.environ.get("LOCALRT_BENCH_REPEATS", 3))
TEXT = (
    "The history of the printing press begins in the fifteenth century, when movable metal type made books "
    "cheaper and faster to produce than ever before. Within decades, presses spread across Europe, and "
    "pamphlets, newspapers and scientific journals followed. Literacy rose, ideas travelled further, and the "
    "way people argued about religion, politics and nature changed for good. "
)


def prompt_ids(model_path: str) -> list[int]:
    """The same 512 ids for both engines: our tokenizer over repeated prose, cut to length."""
    import gguf_io
    from localrt.engine.tokenizer import Tokenizer

    with gguf_io.open(model_path) as f:
        tok = Tokenizer.from_gguf(f.metadata)
    ids = tok.encode(TEXT * 40)
    return ids[:N_PROMPT]


def _since_process_start() -> float:
    """Seconds since this process started (the kernel's start time, in clock ticks)."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start


class Memory:
    """The process's memory as Linux counts it, sampled at a few points (MiB)."""

    def __init__(self) -> None:
        self.peak = {"rss_anon_mb": 0.0, "rss_file_mb": 0.0}

    def sample(self) -> None:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        for key, name in (("rss_anon_mb", "RssAnon"), ("rss_file_mb", "RssFile")):
            self.peak[key] = max(self.peak[key], round(int(fields[name].split()[0]) / 1024, 1))
        self.hwm = round(int(fields["VmHWM"].split()[0]) / 1024, 1)


def run_ours(model_path: str, ids: list[int], load_only: bool = False) -> dict:
    import numpy as np

    from localrt import load_model

    mem = Memory()
    t0 = time.perf_counter()
    model = load_model(model_path, num_ctx=N_CTX)
    first = next(iter(model.generate(model.tokenize("Hello"), {"temperature": 0, "num_predict": 1})))
    load_s = time.perf_counter() - t0
    start_s = _since_process_start()
    if load_only:
        return _load_figures(load_s, start_s)
    mem.sample()
    assert first.token >= 0
    model.finish_loading()  # private weights (use_mmap unset, 1B-class files): speeds once they are on huge pages
    prefill_s = decode_s = float("inf")
    for _ in range(REPEATS):  # best of REPEATS: the machine is shared, the minimum is the signal
        model.cache.clear(0)
        model.cache.forget_prefixes()
        t0 = time.perf_counter()
        logits = model.forward(model.batch(ids, 0), model.cache, output_rows=np.array([len(ids) - 1]))[0]
        prefill_s = min(prefill_s, time.perf_counter() - t0)
        token = int(np.argmax(logits))
        t0 = time.perf_counter()
        for pos in range(len(ids), len(ids) + N_DECODE):
            token = int(np.argmax(model.forward(model.batch([token], pos), model.cache)[0]))
        decode_s = min(decode_s, time.perf_counter() - t0)
        mem.sample()
    return _figures(load_s, start_s, prefill_s, decode_s, len(ids), mem)


def run_ours_warm(model_path: str) -> dict:
    """Load to first token in a process that already did Numba's one-time start-up, as `localrt serve` does at
    start (engine.loader.warm_up): what the daemon's first request on a model waits for."""
    from localrt import load_model
    from localrt.engine.loader import warm_up

    warm_up().join()
    t0 = time.perf_counter()
    model = load_model(model_path, num_ctx=N_CTX)
    next(iter(model.generate(model.tokenize("Hello"), {"temperature": 0, "num_predict": 1})))
    return {"load_to_first_token_s": round(time.perf_counter() - t0, 3)}


def run_llamacpp(model_path: str, ids: list[int], load_only: bool = False) -> dict:
    import numpy as np
    from llama_cpp import Llama

    mem = Memory()
    t0 = time.perf_counter()
    llm = Llama(
        model_path,
        n_ctx=N_CTX,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        n_batch=512,
        logits_all=False,
        verbose=False,
    )
    llm.eval(llm.tokenize(b"Hello"))
    load_s = time.perf_counter() - t0
    start_s = _since_process_start()
    if load_only:
        return _load_figures(load_s, start_s)
    mem.sample()
    n_vocab = llm.n_vocab()

    def last_logits():
        # With logits_all off, Llama.scores is not filled; read the context's logits of the last token.
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))

    prefill_s = decode_s = float("inf")
    for _ in range(REPEATS):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        token = int(np.argmax(last_logits()))
        prefill_s = min(prefill_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(N_DECODE):
            llm.eval([token])
            token = int(np.argmax(last_logits()))
        decode_s = min(decode_s, time.perf_counter() - t0)
        mem.sample()
    return _figures(load_s, start_s, prefill_s, decode_s, len(ids), mem)


def _load_figures(load_s: float, start_s: float) -> dict:
    return {
        "load_to_first_token_s": round(load_s, 3),
        "process_start_to_first_token_s": round(start_s, 2),  # /proc clock ticks: 10 ms resolution
    }


def _figures(load_s: float, start_s: float, prefill_s: float, decode_s: float, n_prompt: int, mem: Memory) -> dict:
    return {
        **_load_figures(load_s, start_s),
        "prefill_tok_s": round(n_prompt / prefill_s, 1),
        "decode_tok_s": round(N_DECODE / decode_s, 1),
        "peak_rss_mb": mem.hwm,
        **mem.peak,
    }


def model_path(model: str) -> str:
    sys.path.insert(0, str(ROOT))
    from localrt.models import builtin_models

    return str(builtin_models.BUILTIN[model]())


def worker(engine: str) -> None:
    # path and ids come from the parent: neither worker imports localrt for the other, or holds our tokenizer
    job = json.loads(sys.stdin.read())
    path, ids, load_only = job["path"], job["ids"], job["load_only"]
    sys.path.insert(0, str(ROOT))
    if engine == "ours_warm":
        out = run_ours_warm(path)
    else:
        out = {"ours": run_ours, "llamacpp": run_llamacpp}[engine](path, ids, load_only)
    print(json.dumps(out))


def _read_through(path: str) -> None:
    """Read the file once, so that whichever engine runs first does not also pay for reading it from disk."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def spawn(engine: str, path: str, ids: list[int], load_only: bool = False) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", engine],
        capture_output=True,
        text=True,
        cwd=ROOT,
        input=json.dumps({"path": path, "ids": ids, "load_only": load_only}),
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _best_load(best: dict, run: dict) -> None:
    """Keep the lower load figures of two fresh processes of one engine in best (an error stays one)."""
    if "error" in best or "error" in run:
        best.setdefault("error", run.get("error"))
        return
    for key in ("load_to_first_token_s", "process_start_to_first_token_s"):
        if key in run:
            best[key] = min(best[key], run[key])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["smollm2", "gemma3"])
    ap.add_argument("--paths", nargs="*", default=[], help="other GGUF files, benched under their file names")
    ap.add_argument(
        "--out", default=None, help="append the record to this JSONL file, not bench/results/generate.jsonl"
    )
    ap.add_argument("--worker", choices=["ours", "ours_warm", "llamacpp"])
    ap.add_argument("--repeats", type=int, default=REPEATS, help="best of N prefill/decode runs (memory needs 1)")
    args = ap.parse_args()
    os.environ["LOCALRT_BENCH_REPEATS"] = str(args.repeats)  # the workers read it
    if args.worker:
        return worker(args.worker)
    try:
        import llama_cpp

        llama_version = llama_cpp.__version__
    except ImportError:
        llama_version = None
    results = {
        "setup": {
            "n_prompt": N_PROMPT,
            "n_decode": N_DECODE,
            "n_ctx": N_CTX,
            "threads": THREADS,
            "best_of": args.repeats,
            "machine": platform.machine(),
            "python": platform.python_version(),
            "llama_cpp_python": llama_version,
            # Both engines spin worker threads: on a shared machine the figures move a lot.
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "models": {},
    }
    for package in ("localrt", "gguf_io", "quant", "simd_kernels", "modelfile", "store"):
        compileall.compile_dir(ROOT / package, quiet=1)
    runs = [(model, model_path(model)) for model in args.models] + [
        (Path(p).name, str(Path(p).resolve())) for p in args.paths
    ]
    for model, path in runs:
        _read_through(path)  # both engines start with the file in the page cache, as after an earlier load
        ids = prompt_ids(path)
        ours = spawn("ours", path, ids)
        warm = spawn("ours_warm", path, ids)
        missing = {"error": "llama-cpp-python is not importable"}
        ref = spawn("llamacpp", path, ids) if llama_version is not None else missing
        for _ in range(args.repeats - 1):  # more fresh processes, the engines in turn: load time is the best of all
            _best_load(ours, spawn("ours", path, ids, load_only=True))
            _best_load(warm, spawn("ours_warm", path, ids))
            if llama_version is not None:
                _best_load(ref, spawn("llamacpp", path, ids, load_only=True))
        if "error" not in ours and "error" not in warm:
            ours["load_to_first_token_after_warm_up_s"] = warm["load_to_first_token_s"]
        entry = {"ours": ours, "llamacpp": ref}
        if "error" not in ours and "error" not in ref:
            entry["ratio"] = {k: round(ours[k] / ref[k], 2) for k in ("prefill_tok_s", "decode_tok_s")}
            entry["ratio"]["load_time"] = round(ours["load_to_first_token_s"] / ref["load_to_first_token_s"], 2)
            if "load_to_first_token_after_warm_up_s" in ours:
                entry["ratio"]["load_time_after_warm_up"] = round(
                    ours["load_to_first_token_after_warm_up_s"] / ref["load_to_first_token_s"], 2
                )
            entry["ratio"]["process_start_to_first_token"] = round(
                ours["process_start_to_first_token_s"] / ref["process_start_to_first_token_s"], 2
            )
            for k in ("peak_rss_mb", "rss_anon_mb", "rss_file_mb"):
                entry["ratio"][k.removesuffix("_mb")] = round(ours[k] / ref[k], 2)
        results["models"][model] = entry
        print(model, json.dumps(entry), flush=True)
    results["setup"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    native = split_native(results, ("models", "*", "llamacpp"))
    append_record(
        "generate",
        results,
        native=native,
        threads=THREADS,
        load_at_start=results["setup"]["loadavg_1m_at_start"],
        out=args.out,
    )


if __name__ == "__main__":
    main()
