"""Generation speed and memory on the real models, ours and llama.cpp's side by side, JSON out.

    python3 bench/generate.py [--models smollm2 gemma3] [--out bench/results/generate.json]

Per model and engine, each in a fresh process (so peak RSS is its own): load time to the first token of a
short prompt, prefill tok/s on a 512-token prompt (logits of the last token only), decode tok/s over 128
greedy single-token steps (best of 3 runs each), and peak RSS with a 2048-token context. llama.cpp runs through
llama-cpp-python (n_threads=2, logits_all off) when it is importable, else its entry says why not.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
N_PROMPT, N_DECODE, N_CTX, THREADS = 512, 128, 2048, 2
REPEATS = 3
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


def run_ours(model_path: str, ids: list[int]) -> dict:
    import numpy as np

    from localrt import load_model

    t0 = time.perf_counter()
    model = load_model(model_path, num_ctx=N_CTX)
    first = next(iter(model.generate(model.tokenize("Hello"), {"temperature": 0, "num_predict": 1})))
    load_s = time.perf_counter() - t0
    assert first.token >= 0
    prefill_s = decode_s = float("inf")
    for _ in range(REPEATS):  # best of REPEATS: the machine is shared, the minimum is the signal
        model.cache.clear(0)
        model._slot_tokens.clear()
        t0 = time.perf_counter()
        logits = model.forward(model.batch(ids, 0), model.cache, output_rows=np.array([len(ids) - 1]))[0]
        prefill_s = min(prefill_s, time.perf_counter() - t0)
        token = int(np.argmax(logits))
        t0 = time.perf_counter()
        for pos in range(len(ids), len(ids) + N_DECODE):
            token = int(np.argmax(model.forward(model.batch([token], pos), model.cache)[0]))
        decode_s = min(decode_s, time.perf_counter() - t0)
    return _figures(load_s, prefill_s, decode_s, len(ids))


def run_llamacpp(model_path: str, ids: list[int]) -> dict:
    import numpy as np
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path, n_ctx=N_CTX, n_threads=THREADS, n_threads_batch=THREADS, n_batch=512, logits_all=False, verbose=False)
    llm.eval(llm.tokenize(b"Hello"))
    load_s = time.perf_counter() - t0
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
    return _figures(load_s, prefill_s, decode_s, len(ids))


def _figures(load_s: float, prefill_s: float, decode_s: float, n_prompt: int) -> dict:
    return {
        "load_to_first_token_s": round(load_s, 3),
        "prefill_tok_s": round(n_prompt / prefill_s, 1),
        "decode_tok_s": round(N_DECODE / decode_s, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def worker(engine: str, model: str) -> None:
    sys.path.insert(0, str(ROOT))
    from localrt.models import builtin_models

    path = str(builtin_models.BUILTIN[model]())
    ids = prompt_ids(path)
    out = run_ours(path, ids) if engine == "ours" else run_llamacpp(path, ids)
    print(json.dumps(out))


def spawn(engine: str, model: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", engine, "--models", model], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "generate.json"))
    ap.add_argument("--worker", choices=["ours", "llamacpp"])
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.models[0])
    try:
        import llama_cpp

        llama_version = llama_cpp.__version__
    except ImportError:
        llama_version = None
    results = {
        "setup": {"n_prompt": N_PROMPT, "n_decode": N_DECODE, "n_ctx": N_CTX, "threads": THREADS, "best_of": REPEATS,
                  "machine": platform.machine(), "python": platform.python_version(),
                  "llama_cpp_python": llama_version,
                  # Both engines spin worker threads: on a shared machine the figures move a lot.
                  "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
        "models": {},
    }
    for model in args.models:
        ours = spawn("ours", model)
        entry = {"ours": ours}
        if llama_version is None:
            entry["llamacpp"] = {"error": "llama-cpp-python is not importable"}
        else:
            ref = spawn("llamacpp", model)
            entry["llamacpp"] = ref
            if "error" not in ours and "error" not in ref:
                entry["ratio"] = {k: round(ours[k] / ref[k], 2) for k in ("prefill_tok_s", "decode_tok_s")}
                entry["ratio"]["load_time"] = round(ours["load_to_first_token_s"] / ref["load_to_first_token_s"], 2)
                entry["ratio"]["peak_rss"] = round(ours["peak_rss_mb"] / ref["peak_rss_mb"], 2)
        results["models"][model] = entry
        print(model, json.dumps(entry), flush=True)
    results["setup"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
