"""The latest record of each benchmark (bench/results/<benchmark>.jsonl) as a small table.

    python3 bench/latest.py [BENCHMARK ...] [--all-rows]

Per benchmark: when, at which commit, on what CPU, then our figure, the peer's figure from the same run (native
llama.cpp where the benchmark has it, else what the run compares against, named in the header) and ours / peer.
A ratio above 1 is better for rates (tok/s, GB/s, speedups) and worse for times, memory and latencies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import RESULTS_DIR, merged, read_records  # noqa: E402

MAX_ROWS = 24


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def decode(run):
    notes = (
        [f"read bandwidth {run['bandwidth'].get('read_GB_s')} GB/s"] if isinstance(run.get("bandwidth"), dict) else []
    )
    rows = []
    for f, e in run.get("files", {}).items():
        if "ours" in e:
            ours, nat = e.get("ours") or {}, e.get("native") or {}
            keys = [k for k in [*ours, *nat] if k.endswith("_tok_s") and "_avg_" not in k]
            for k in dict.fromkeys(keys):
                rows.append((f"{f} {k.removesuffix('_tok_s')} tok/s", ours.get(k), nat.get(k)))
            if "error" in ours or "error" in nat:
                rows.append((f"{f} error", ours.get("error"), nat.get("error")))
        else:  # a compact run: ours_tg64 / native_tg64
            for k in e:
                if k.startswith("ours_"):
                    rows.append((f"{f} {k[5:]} tok/s", e[k], e.get("native_" + k[5:])))
    if "native_llama_bench_tg64_tok_s" in run:
        pairs = zip(run["localrt_engine_generate_64_tok_s_best_of_4"], run["native_llama_bench_tg64_tok_s"])
        rows += [(f"SmolLM2 tg64 tok/s, pair {i + 1}", o, n) for i, (o, n) in enumerate(pairs)]
    for k, v in run.items():  # a by-hand run keyed by file name (decode_archs' single_thread_decode)
        if isinstance(v, dict) and "ours_tok_s" in v:
            rows.append((f"{k} decode tok/s", v["ours_tok_s"], v.get("native_tok_s")))
    return "llama.cpp", rows, notes


def generate(run):
    rows = []
    for m, e in run.get("models", {}).items():
        ours, ref = e.get("ours") or {}, e.get("llamacpp") or {}
        for k in ("load_to_first_token_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mb"):
            rows.append((f"{m} {k}", ours.get(k), ref.get(k)))
    return "llama.cpp", rows, []


def batch(run):
    rows = []
    for m, e in run.get("models", {}).items():
        peer = e.get("llamacpp_decode_tok_s") or {}
        rows += [(f"{m} decode tok/s, {w} seq", v, peer.get(w)) for w, v in e.get("decode_tok_s", {}).items()]
    return "llama.cpp", rows, []


def serve_load(run):
    rows = []
    for m, by_n in run.get("models", {}).items():
        for n, e in by_n.items():
            ours, peer = e.get("localrt") or {}, e.get("llama_server") or {}
            rows.append(
                (f"{m}, {n} clients: aggregate tok/s", ours.get("aggregate_tok_s"), peer.get("aggregate_tok_s"))
            )
            rows.append(
                (
                    f"{m}, {n} clients: TTFT p95 s",
                    (ours.get("ttft_s") or {}).get("p95"),
                    (peer.get("ttft_s") or {}).get("p95"),
                )
            )
    return "llama-server", rows, []


def spec(run):
    rows, server = [], run.get("llama_server") or {}
    for m, tasks in (run.get("models") or {}).items():
        best = ((server.get(m) or {}).get("summary") or {}).get("best_copy_speedup") or {}
        for t, r in tasks.items():
            if isinstance(r, dict) and "speedup" in r:
                rows.append((f"{m} {t} speedup", r["speedup"], (best.get(t) or [None])[0]))
    if not rows:  # a run kept as its summary only
        for m, s in (run.get("summary") or {}).items():
            rows += [(f"{m} {k}", v, None) for k, v in s.items() if k.endswith("speedup")]
    return "llama-server (its best spec type)" if server else "-", rows, []


def spec_draft(run):
    rows = []
    for m, s in (run.get("summary") or {}).items():
        rows += [(f"{m} {k}", v, None) for k, v in s.items() if k.endswith("speedup")]
    for m, e in (run.get("llama_server") or {}).items():
        rows += [
            (f"{m} llama-server {k}", None, v) for k, v in (e.get("summary") or {}).items() if k.endswith("speedup")
        ]
    return "llama-server", rows, []


def kernels(run):
    bw = (run.get("read_bandwidth") or {}).get("GBps_best")
    rows = [(f"matvec {m['type']} {m['tensor']} GB/s", m.get("GBps_best"), bw) for m in run.get("matvec", [])]
    rows += [
        (f"matmul {m['type']} {m['tensor']} x{m['n_tok']} GFLOP/s", m.get("GFLOPs_ours"), m.get("GFLOPs_numpy_f32"))
        for m in run.get("matmul", [])
    ]
    return "NumPy (read bandwidth; f32 matmul)", rows, []


def attention(run):
    cases = run.get("cases", [])
    top = {}
    for c in cases:  # the largest key count of each shape / threads / rows
        k = (c["shape"], c["threads"], c["rows"])
        if k not in top or c["keys"] > top[k]["keys"]:
            top[k] = c
    rows = [
        (f"{c['shape']} t{c['threads']} rows={c['rows']} keys={c['keys']} us", c["us"], c.get("against_us"))
        for c in top.values()
    ]
    against = (run.get("setup") or {}).get("against")
    notes = [f"{len(rows)} of {len(cases)} cases (the largest key count of each); all are in the record"]
    return f"attend.py at {against}" if against else "-", rows, notes


def iq4_matvec(run):
    rows = []
    for t, by_fmt in (run.get("results") or {}).items():
        base = (by_fmt.get("Q4_K") or {}).get("us_best")
        rows += [(f"{fmt} {t} us", v.get("us_best"), base) for fmt, v in by_fmt.items()]
    return "Q4_K", rows, []


def kv_pool(run):
    rows = [(f"decode step, {n} best ms", v.get("best_ms"), None) for n, v in (run.get("decode_step") or {}).items()]
    rows += [
        (f"attention kernel {k}", v.get("paged"), v.get("contiguous"))
        for k, v in (run.get("attention_kernel") or {}).items()
    ]
    return "contiguous cache", rows, [f"label: {run.get('label')}"]


def pull(run):
    return (
        "file copy",
        [
            ("MB/s", run.get("pull_MBps"), run.get("copy_MBps")),
            ("MB/s vs copy + sha256", run.get("pull_MBps"), run.get("copy_then_sha256_MBps")),
        ],
        [],
    )


def serve(run):
    api, direct = run.get("http_api") or {}, run.get("direct_engine") or {}
    rows = [(f"{k}", api.get(k), direct.get(k)) for k in ("ttft_s_median", "decode_tok_s_median")]
    conc = run.get("concurrent_generate_16") or {}
    rows.append((f"{conc.get('clients')} clients: requests/s", conc.get("requests_per_s"), None))
    return "engine called directly", rows, []


def structured(run):
    rows = []
    for m, e in (run.get("models") or {}).items():
        free = (e.get("unconstrained") or {}).get("tok_s")
        rows += [(f"{m} {mode} tok/s", (e.get(mode) or {}).get("tok_s"), free) for mode in ("schema", "json")]
    return "unconstrained", rows, []


def spec_replay(run):
    rows = []
    for m, tasks in (run.get("models") or {}).items():
        for t, e in tasks.items():
            for how in ("fixed_prior", "shared_second"):
                rows.append((f"{m} {t} {how}", (e.get(how) or {}).get("modelled_speedup"), e.get("oracle_speedup")))
    return "prompt-lookup oracle", rows, [f"costs from {(run.get('setup') or {}).get('costs_from')}"]


def gpu(run):
    rows, notes = [], [run["skipped"]] if run.get("skipped") else []
    for m, e in (run.get("models") or {}).items():
        cpu = e.get("llamacpp_cpu") or {}
        for k, v in e.items():
            if k.startswith("ours_num_gpu_"):
                for fig in ("prefill_tok_s", "decode_tok_s"):
                    rows.append((f"{m} num_gpu={k[13:]} {fig}", (v or {}).get(fig), cpu.get(fig)))
    return "llama.cpp on the CPU", rows, notes


def generic(run):
    rows = []

    def walk(o, path):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif _num(o):
            rows.append((path, o, None))

    walk(run, "")
    return "-", rows, []


def embed(run):
    rows = []
    for f, ours in (run.get("localrt") or {}).items():
        peer = (run.get("llama_server") or {}).get(f) or {}
        rows.append((f"{f} docs/s ({ours.get('docs')} docs)", ours.get("docs_per_s"), peer.get("docs_per_s")))
    return "llama-server", rows, []


def cache_scope(run):
    """The prefix cache scoped per client (ours) beside shared across clients (the peer column)."""
    rows = []
    for n, e in run.get("runs", {}).items():
        ours, shared = e.get("client") or {}, e.get("shared") or {}
        rows.append(
            (f"{n} clients: TTFT p50 s", (ours.get("ttft_s") or {}).get("p50"), (shared.get("ttft_s") or {}).get("p50"))
        )
        rows.append((f"{n} clients: aggregate tok/s", ours.get("aggregate_tok_s"), shared.get("aggregate_tok_s")))
        rows.append((f"{n} clients: cached prompt tokens", ours.get("cached_tokens"), shared.get("cached_tokens")))
    return "shared cache", rows, []


def serve_ab(run):
    """Two source trees through the daemon (ours: the newer, the peer column: the one before), medians of rounds."""
    rows = []
    for n, e in run.get("clients", {}).items():
        after, before = e.get("after") or {}, e.get("before") or {}
        for key, label in (
            ("ttft_p50_s", "TTFT p50 s"),
            ("ttft_p95_s", "TTFT p95 s"),
            ("aggregate_tok_s", "aggregate tok/s"),
        ):
            rows.append((f"{n} clients: {label}", after.get(key), before.get(key)))
    commits = (run.get("setup") or {}).get("commits") or {}
    return f"before ({commits.get('before', '?')})", rows, []


VIEWS = {
    "decode": decode,
    "embed": embed,
    "cache_scope": cache_scope,
    "generate": generate,
    "batch": batch,
    "serve_load": serve_load,
    "serve_ab": serve_ab,
    "spec": spec,
    "spec_draft": spec_draft,
    "kernels": kernels,
    "attention": attention,
    "iq4_matvec": iq4_matvec,
    "kv_pool": kv_pool,
    "pull": pull,
    "serve": serve,
    "structured": structured,
    "spec_replay": spec_replay,
    "gpu": gpu,
}


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return " / ".join(fmt(x) for x in v)
    return str(v)


def header(bench: str, record: dict, count: int) -> list[str]:
    flags = record.get("cpu_flags")
    flag_text = " ".join(k for k, on in flags.items() if on) or "none of avx2/avx512/vnni" if flags else "flags ?"
    load = record.get("load") or {}
    src = record.get("source") or {}
    where = (
        f"by {src['script']}"
        if src.get("script")
        else "converted from " + " ".join(filter(None, [src.get("file"), src.get("key")]))
    )
    first = f"== {bench}: latest of {count} records, {record.get('date') or 'date ?'} at {record.get('commit') or '?'}"
    second = (
        f"   cpu {record.get('cpu_model') or '?'} ({flag_text}), threads {fmt(record.get('threads'))}, "
        f"load {fmt(load.get('1m_at_start'))} -> {fmt(load.get('1m_at_end'))}; {where}"
    )
    return [first, second]


def table(peer: str, rows: list, limit: int | None) -> list[str]:
    if not rows:
        return ["   (no figures this view knows; see the record's results)"]
    shown = rows if limit is None else rows[:limit]
    cells = [("", "ours", peer, "ours/peer")]
    for item, ours, other in shown:
        ratio = fmt(round(ours / other, 3)) if _num(ours) and _num(other) and other else ""
        cells.append((item[:64], fmt(ours), fmt(other), ratio))
    n_cols = 4 if any(other is not None for _, _, other in shown) else 2  # no peer in this run: ours only
    widths = [max(len(c[i]) for c in cells) for i in range(n_cols)]
    lines = [
        "   " + "  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i]) for i in range(n_cols)).rstrip()
        for c in cells
    ]
    if len(shown) < len(rows):
        lines.append(f"   ... {len(rows) - len(shown)} more rows (--all-rows)")
    return lines


def show(bench: str, limit: int | None) -> list[str]:
    records = read_records(bench)
    if not records:
        return [f"== {bench}: no records in {RESULTS_DIR / (bench + '.jsonl')}"]
    record = records[-1]
    run = merged(record)
    try:
        peer, rows, notes = VIEWS.get(bench, generic)(run)
    except (KeyError, TypeError, AttributeError, IndexError) as e:  # a record of an older shape
        peer, rows, notes = generic(run)
        notes = [f"(shown flat: {type(e).__name__} {e})"]
    if not rows and bench in VIEWS:
        peer, rows, _ = generic(run)
    return header(bench, record, len(records)) + [f"   {n}" for n in notes] + table(peer, rows, limit)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("benchmarks", nargs="*", help="default: every bench/results/*.jsonl")
    ap.add_argument("--all-rows", action="store_true", help=f"every row, not the first {MAX_ROWS}")
    args = ap.parse_args(argv)
    names = args.benchmarks or sorted(p.stem for p in RESULTS_DIR.glob("*.jsonl"))
    for i, bench in enumerate(names):
        print(("\n" if i else "") + "\n".join(show(bench, None if args.all_rows else MAX_ROWS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
