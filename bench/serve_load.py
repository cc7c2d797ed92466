"""Many users at once: N streaming clients against localrt and native llama-server (-np N) on the same GGUF.

    python3 bench/serve_load.py --llama-server PATH/llama-server [--models smollm2 gemma3] [--clients 1 4 8 16]
                                [--requests 2] [--tokens 64]

Each client sends `--requests` streaming /v1/chat/completions requests one after another (greedy, max_tokens
`--tokens`, a prompt of its own). Per request: TTFT (first content chunk) and TPOT ((last - first chunk) / (tokens
- 1)). Per run: p50/p95/p99 of both, aggregate output tok/s (all tokens / wall time) and goodput (requests/s that
met the SLO: TTFT <= 2 s and TPOT <= 100 ms). Both servers run with 2 threads and one slot per client, one after
the other on the same machine, with the same KV budget: llama-server `-c 1024N` (1024 positions per slot),
localrt `LOCALRT_KV_BUDGET=1024N` positions of its paged pool, shared by its N slots of the default num_ctx.
Peak RSS (VmHWM) of each server beside its KV allocation and the weights. JSON to stdout, and one record per run
appended to bench/results/serve_load.jsonl (bench/results_log.py), llama-server's figures as the record's
`native`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from results_log import append_record, split_native  # noqa: E402

SLO_TTFT_S, SLO_TPOT_S = 2.0, 0.100
CTX_PER_SLOT = 1024  # llama-server -c CTX_PER_SLOT * N; localrt's KV budget, the same positions
PROMPT = "Client {c}, question {r}: tell me a short story about a lighthouse keeper and a lost ship."


def _free_port() -> int:
    from localrt.serve.daemon import free_port

    return free_port()


def _wait(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer")


def _one(base: str, model: str, prompt: str, tokens: int) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "temperature": 0,
        "max_tokens": tokens,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = last = None
    chunks = 0
    usage = None
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            usage = obj.get("usage") or usage
            for ch in obj.get("choices") or []:
                if (ch.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
    n = int((usage or {}).get("completion_tokens") or chunks)
    ttft = (first or time.perf_counter()) - t0
    tpot = (last - first) / (n - 1) if first and last and n > 1 else 0.0
    return {"ttft": ttft, "tpot": tpot, "tokens": n}


def _peak_rss_mib(pid: int) -> float:
    """The server process's peak resident set (VmHWM), MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _run(base: str, model: str, clients: int, requests: int, tokens: int) -> dict:
    results: list[dict] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for r in range(requests):
            got = _one(base, model, PROMPT.format(c=c, r=r), tokens)
            with lock:
                results.append(got)

    # Warm up as many streams as will be measured (every batch size's kernels loaded, every slot touched once).
    warm = [threading.Thread(target=_one, args=(base, model, f"Warm up {c}.", 8)) for c in range(clients)]
    for t in warm:
        t.start()
    for t in warm:
        t.join()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    def pct(key: str, q: float) -> float:
        xs = sorted(r[key] for r in results)
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)

    good = sum(1 for r in results if r["ttft"] <= SLO_TTFT_S and r["tpot"] <= SLO_TPOT_S)
    return {
        "requests": len(results),
        "wall_s": round(wall, 2),
        "aggregate_tok_s": round(sum(r["tokens"] for r in results) / wall, 1),
        "ttft_s": {"p50": pct("ttft", 0.5), "p95": pct("ttft", 0.95), "p99": pct("ttft", 0.99)},
        "tpot_s": {"p50": pct("tpot", 0.5), "p95": pct("tpot", 0.95), "p99": pct("tpot", 0.99)},
        "goodput_req_s": round(good / wall, 3),
        "met_slo": f"{good}/{len(results)}",
        "mean_tokens": round(statistics.mean(r["tokens"] for r in results), 1),
    }


MODELS = {"smollm2": ("smollm2:135m", "SmolLM2-135M-Instruct Q4_1"), "gemma3": ("gemma3:270m", "Gemma 3 270M Q4_K_M")}


def _localrt(clients: int, store: Path, name: str):
    port = _free_port()
    env = {
        **os.environ,
        "LOCALRT_HOST": f"127.0.0.1:{port}",
        "LOCALRT_MODELS": str(store / "models"),
        "LOCALRT_DATA": str(store / "data"),
        "LOCALRT_NUM_PARALLEL": str(clients),
        "LOCALRT_NUM_THREADS": "2",
        "LOCALRT_KV_BUDGET": str(CTX_PER_SLOT * clients),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "localrt", "serve"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    _wait(base + "/", proc)
    httpx.post(base + "/api/pull", json={"model": name, "stream": False}, timeout=600).raise_for_status()
    return proc, base, name


def _llama_server(clients: int, path: str, gguf: Path, ctx: int):
    port = _free_port()
    proc = subprocess.Popen(
        [
            path,
            "-m",
            str(gguf),
            "-np",
            str(clients),
            "-c",
            str(ctx * clients),
            "-t",
            "2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-cb",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    _wait(base + "/health", proc)
    return proc, base, "model"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=sorted(MODELS))
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    from localrt.models import builtin_models

    out: dict = {
        "setup": {
            "threads": 2,
            "requests_per_client": args.requests,
            "max_tokens": args.tokens,
            "kv_positions_per_client": CTX_PER_SLOT,
            "slo": {"ttft_s": SLO_TTFT_S, "tpot_s": SLO_TPOT_S},
            "loadavg_1m_at_start": os.getloadavg()[0],
        },
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models:
            name, label = MODELS[key]
            gguf = getattr(builtin_models, f"{key}_path")()
            runs: dict = {}
            out["models"][label] = runs
            for n in args.clients:
                row = {}
                for server, start in (
                    ("localrt", lambda: _localrt(n, Path(tmp), name)),
                    ("llama_server", lambda: _llama_server(n, args.llama_server, gguf, CTX_PER_SLOT)),
                ):
                    proc, base, model = start()
                    try:
                        row[server] = _run(base, model, n, args.requests, args.tokens)
                        row[server]["peak_rss_mib"] = _peak_rss_mib(proc.pid)
                        if server == "localrt":
                            ps = httpx.get(base + "/api/ps", timeout=10).json()["models"][0]
                            row[server]["kv_cache_mib"] = round(ps["kv_cache_bytes"] / (1 << 20), 1)
                            row[server]["kv_blocks_after"] = {
                                k: ps.get(k)
                                for k in ("kv_blocks", "kv_blocks_in_use", "kv_blocks_cached", "kv_block_size")
                            }
                            row[server]["weights_mib"] = round(gguf.stat().st_size / (1 << 20), 1)
                    finally:
                        proc.terminate()
                        proc.wait(timeout=30)
                ls, lr = row["llama_server"], row["localrt"]
                row["ratio_aggregate_tok_s"] = round(lr["aggregate_tok_s"] / ls["aggregate_tok_s"], 2)
                row["ttft_p95_localrt_le_llama_server"] = lr["ttft_s"]["p95"] <= ls["ttft_s"]["p95"]
                runs[str(n)] = row
                print(json.dumps({label: {n: row}}), flush=True)
    out["setup"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    native = split_native(out, ("models", "*", "*", "llama_server"))
    append_record(
        "serve_load",
        out,
        native=native,
        threads=out["setup"]["threads"],
        load_at_start=out["setup"]["loadavg_1m_at_start"],
    )


if __name__ == "__main__":
    main()
