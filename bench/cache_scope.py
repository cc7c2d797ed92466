"""What scoping the prefix cache per client costs: N clients from N addresses, one shared system prompt.

    python3 bench/cache_scope.py [--model smollm2] [--clients 4 8] [--requests 2] [--tokens 32] [--system-words 300]

Issue 48 class 1: by default (`LOCALRT_PREFIX_CACHE=client`) a request reuses cached prompt prefixes of its own
client only (the peer address, or the API key); `shared` lets every client reuse every other's, as before. Both
daemons run here one after the other, on the same machine, the same model and the same workload: client c binds
127.0.0.(c + 2), so each is its own client, and every request starts with the same system prompt of
`--system-words` words (what an office's clients share: a house prompt) before a question of its own. Per run:
TTFT p50/p95, aggregate output tok/s, and the prompt tokens served from the cache (usage's cached_tokens). JSON to
stdout, one record appended to bench/results/cache_scope.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from results_log import append_record  # noqa: E402
from serve_load import MODELS, _free_port, _wait  # noqa: E402

WARM_CLIENT = 200  # binds 127.0.0.202
KV_PER_CLIENT = 2048  # positions of the paged pool per client: the house prompt, a question and the reply fit
QUESTION = "Client {c}, question {r}: tell me a short story about a lighthouse keeper and a lost ship."


def _one(base: str, model: str, system: str, prompt: str, tokens: int, client: int) -> dict:
    body = {
        "model": model,
        "stream": True,
        "temperature": 0,
        "max_tokens": tokens,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
        "stream_options": {"include_usage": True},
    }
    transport = httpx.HTTPTransport(local_address=f"127.0.0.{client + 2}")  # its own peer address
    t0 = time.perf_counter()
    first = None
    usage = {}
    with (
        httpx.Client(transport=transport, timeout=600) as http,
        http.stream("POST", base + "/v1/chat/completions", json=body) as r,
    ):
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            usage = obj.get("usage") or usage
            if first is None and any((ch.get("delta") or {}).get("content") for ch in obj.get("choices") or []):
                first = time.perf_counter()
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return {
        "ttft": (first or time.perf_counter()) - t0,
        "tokens": usage.get("completion_tokens", 0),
        "prompt": usage.get("prompt_tokens", 0),
        "cached": cached,
    }


def _run(base: str, model: str, clients: int, requests: int, tokens: int, system: str) -> dict:
    results: list[dict] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for r in range(requests):
            got = _one(base, model, system, QUESTION.format(c=c, r=r), tokens, c)
            with lock:
                results.append(got)

    # The office's earlier traffic, from an address of its own: the model loaded, its prompt kernels in, and the
    # house prompt cached (which only a shared cache lets the measured clients reuse).
    _one(base, model, system, "Warm up.", 4, WARM_CLIENT)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = sorted(r["ttft"] for r in results)
    return {
        "requests": len(results),
        "wall_s": round(wall, 2),
        "aggregate_tok_s": round(sum(r["tokens"] for r in results) / wall, 1),
        "ttft_s": {"p50": round(ttft[len(ttft) // 2], 3), "p95": round(ttft[int(0.95 * (len(ttft) - 1))], 3)},
        "prompt_tokens": sum(r["prompt"] for r in results),
        "cached_tokens": sum(r["cached"] for r in results),
    }


def _daemon(clients: int, store: Path, name: str, scope: str):
    port = _free_port()
    env = {
        **os.environ,
        "LOCALRT_HOST": f"127.0.0.1:{port}",
        "LOCALRT_MODELS": str(store / "models"),
        "LOCALRT_DATA": str(store / f"data-{scope}-{clients}"),
        "LOCALRT_NUM_PARALLEL": str(clients),
        "LOCALRT_NUM_THREADS": "2",
        "LOCALRT_KV_BUDGET": str(KV_PER_CLIENT * clients),
        "LOCALRT_PREFIX_CACHE": scope,
    }
    log = open(store / f"serve-{scope}-{clients}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "localrt", "serve"], cwd=REPO, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    _wait(base + "/", proc)
    httpx.post(base + "/api/pull", json={"model": name, "stream": False}, timeout=600).raise_for_status()
    return proc, base


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    ap.add_argument("--clients", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--system-words", type=int, default=300)
    args = ap.parse_args()
    name, label = MODELS[args.model]
    system = "You are the office assistant. " + " ".join(f"rule{i}" for i in range(args.system_words))
    out: dict = {
        "setup": {
            "model": label,
            "threads": 2,
            "requests_per_client": args.requests,
            "max_tokens": args.tokens,
            "system_words": args.system_words,
            "loadavg_1m_at_start": os.getloadavg()[0],
        },
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = os.environ.get("CACHE_SCOPE_TMP") or tmp  # keep the daemons' logs where asked
        for n in args.clients:
            row = {}
            for scope in ("shared", "client"):
                proc, base = _daemon(n, Path(tmp), name, scope)
                try:
                    row[scope] = _run(base, name, n, args.requests, args.tokens, system)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
            row["ttft_p50_client_over_shared"] = round(
                row["client"]["ttft_s"]["p50"] / row["shared"]["ttft_s"]["p50"], 2
            )
            row["tok_s_client_over_shared"] = round(
                row["client"]["aggregate_tok_s"] / row["shared"]["aggregate_tok_s"], 2
            )
            out["runs"][str(n)] = row
            print(json.dumps({n: row}), flush=True)
    out["setup"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    append_record("cache_scope", out, threads=2, load_at_start=out["setup"]["loadavg_1m_at_start"])


if __name__ == "__main__":
    main()
