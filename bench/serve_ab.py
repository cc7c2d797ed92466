"""Two localrt source trees side by side through the daemon: time to first token and aggregate output tok/s at 1
and 8 streaming clients (bench/serve_load.py's client and figures), rounds interleaved so that machine noise falls
on both alike. For a change to the request path (issue 43 part 4: the HTTP side reads the scheduler's channel
from its event loop), `--before` is a worktree of the commit before it:

    git worktree add /tmp/before <commit>
    python3 bench/serve_ab.py --before /tmp/before [--clients 1 8] [--rounds 3] [--requests 2] [--tokens 64]

Each daemon runs SmolLM2 with 2 threads, one slot per client and the same KV budget as serve_load.py. JSON to
stdout, one record appended to bench/results/serve_ab.jsonl (no native peer: both sides are localrt)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from results_log import append_record  # noqa: E402
from serve_load import CTX_PER_SLOT, _free_port, _peak_rss_mib, _run, _wait  # noqa: E402

MODEL = "smollm2:135m"


def _daemon(tree: Path, clients: int, home: Path):
    port = _free_port()
    env = {
        **os.environ,
        "LOCALRT_HOST": f"127.0.0.1:{port}",
        "LOCALRT_MODELS": str(home / "models"),
        "LOCALRT_DATA": str(home / "data"),
        "LOCALRT_NUM_PARALLEL": str(clients),
        "LOCALRT_NUM_THREADS": "2",
        "LOCALRT_KV_BUDGET": str(CTX_PER_SLOT * clients),
        "PYTHONPATH": str(tree),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "localrt", "serve"],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    _wait(base + "/", proc, timeout=600)
    httpx.post(base + "/api/pull", json={"model": MODEL, "stream": False}, timeout=600).raise_for_status()
    return proc, base


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, type=Path, help="the source tree to compare with (a git worktree)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": REPO}
    commits = {
        k: subprocess.run(
            ["git", "-C", str(t), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        for k, t in trees.items()
    }
    out: dict = {
        "setup": {
            "model": MODEL,
            "threads": 2,
            "rounds": args.rounds,
            "requests_per_client": args.requests,
            "max_tokens": args.tokens,
            "commits": commits,
            "loadavg_1m_at_start": os.getloadavg()[0],
        },
        "clients": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.clients:
            runs: dict[str, list] = {"before": [], "after": []}
            for r in range(args.rounds):
                for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                    proc, base = _daemon(trees[side], n, Path(tmp))
                    try:
                        got = _run(base, MODEL, n, args.requests, args.tokens)
                        got["peak_rss_mib"] = _peak_rss_mib(proc.pid)
                    finally:
                        proc.terminate()
                        proc.wait(timeout=30)
                    runs[side].append(got)
                    print(json.dumps({"clients": n, "round": r, side: got}), flush=True)
            row = {
                side: {
                    "ttft_p50_s": statistics.median(x["ttft_s"]["p50"] for x in rs),
                    "ttft_p95_s": statistics.median(x["ttft_s"]["p95"] for x in rs),
                    "tpot_p50_s": statistics.median(x["tpot_s"]["p50"] for x in rs),
                    "aggregate_tok_s": statistics.median(x["aggregate_tok_s"] for x in rs),
                    "runs": rs,
                }
                for side, rs in runs.items()
            }
            row["ratio_aggregate_tok_s"] = round(row["after"]["aggregate_tok_s"] / row["before"]["aggregate_tok_s"], 3)
            row["ratio_ttft_p50"] = round(row["after"]["ttft_p50_s"] / row["before"]["ttft_p50_s"], 3)
            out["clients"][str(n)] = row
    out["setup"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    append_record("serve_ab", out, threads=2, load_at_start=out["setup"]["loadavg_1m_at_start"])


if __name__ == "__main__":
    main()
