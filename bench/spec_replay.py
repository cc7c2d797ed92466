"""The draft planner replayed on recorded greedy replies at fixed forward costs: modelled speedups, JSON out.

    python3 bench/spec_replay.py [--models smollm2 gemma3] [--costs bench/results/spec.jsonl] [--out FILE.jsonl]

Appends one record per run to bench/results/spec_replay.jsonl (bench/results_log.py; --out: another JSONL file).

Greedy decoding does not depend on drafting, so a reply recorded once (speculation off, bench/spec.py's tasks
and prompts, 96 tokens) tells what every draft would have had accepted: the planner (localrt.engine.speculative,
as the engine runs it: its n-gram index, match classes, evidence and draft-length cap) is replayed step by step
against it, each forward priced at the cost of its row count that bench/spec.py calibrated on this machine
(`calibrated_forward_ms_by_rows` of the latest record in --costs that has them for every model, or of a .json
file holding one run as bench/spec.py builds it; beyond its largest count, linear). Figures, per model and task:
`modelled_speedup` (one-row forwards of the plain decode / the replayed forwards' cost), its forwards and drafted
/ accepted tokens, and `oracle_speedup`: drafting from the same index exactly the tokens that will be accepted
where that step pays on its own (a reference for planners on this index; step by step, so not a strict bound).
`fixed_prior`: a fresh sequence on the fixed priors; `shared_second`: the second of two runs of the task on one
model-wide `Evidence` (a daemon's case). Machine-free: the same costs and code give the same figures anywhere, so
planner changes compare exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from localrt.api.options import DRAFT_DEFAULT  # noqa: E402
from localrt.engine import speculative as S  # noqa: E402
from results_log import append_record, latest_record, merged  # noqa: E402

N_TOKENS = 96


class Fixed(S.CostModel):
    """Forward seconds by row count from a calibrated table (linear beyond its largest count); never updated."""

    def __init__(self, ms_by_rows: dict[int, float]) -> None:
        super().__init__()
        self.table = ms_by_rows

    def record(self, rows: int, seconds: float) -> None:
        pass

    def cost(self, rows: int) -> float:
        t = self.table
        if rows in t:
            return t[rows]
        top = max(t)
        return t[top] + (rows - top) * (t[top] - t[1]) / (top - 1)


class Seq:
    """What Speculator.plan and draft_limit read of a sequence."""

    def __init__(self, history: list[int], n_gen: int, limit: int, state: S.DraftState) -> None:
        self.history, self.n_gen, self.limit, self.draft, self.n_ctx = history, n_gen, limit, state, 1 << 20


def accepted(draft: list[int], reply: list[int], i: int) -> int:
    a = 0
    while a < len(draft) and i + a < len(reply) and reply[i + a] == draft[a]:
        a += 1
    return a


def replay(prompt: list[int], reply: list[int], costs: Fixed, shared: S.Evidence | None) -> dict:
    spec = S.Speculator(max_rows=64, max_run=63, costs=costs)
    state = S.DraftState(DRAFT_DEFAULT, shared)
    seq = Seq(prompt + reply[:1], 1, len(reply), state)  # the first token comes from the prompt's forward
    i, cost, rows = 1, 0.0, []
    while i < len(reply):
        seq.n_gen = i
        [[(_, n, draft, _)]] = spec.plan([seq], [S.draft_limit(seq)])
        state.ran(len(draft))  # the step runs (Batcher.execute)
        a = accepted(list(draft), reply, i)
        if draft:
            state.observe(n, len(draft), a)
        take = min(a + 1, len(reply) - i)
        seq.history += reply[i : i + take]
        i += take
        cost += costs.cost(1 + len(draft))
        rows.append(1 + len(draft))
    return {
        "modelled_speedup": round((len(reply) - 1) * costs.cost(1) / max(cost, 1e-12), 2),
        "forwards": len(rows),
        "drafted": state.drafted_count,
        "accepted": state.accepted_count,
        "rows": rows,
    }


def oracle(prompt: list[int], reply: list[int], costs: Fixed, k: int = 16) -> float:
    index, history, i, cost = S.NgramIndex(), prompt + reply[:1], 1, 0.0
    while i < len(reply):
        _, draft = index.draft(history, k)
        a = accepted(draft, reply, i)
        use = a if a and costs.cost(1 + a) / (a + 1) < costs.cost(1) else 0
        take = min(use + 1, len(reply) - i)
        history += reply[i : i + take]
        i, cost = i + take, cost + costs.cost(1 + use)
    return round((len(reply) - 1) * costs.cost(1) / max(cost, 1e-12), 2)


def replies(name: str) -> dict[str, tuple[list[int], list[int]]]:
    """task -> (prompt ids, greedy reply ids), speculation off."""
    import spec as spec_bench

    from localrt import load_model

    model = load_model(spec_bench.model_path(name), num_ctx=1024, num_batch=256)
    out = {}
    for task, text in spec_bench.TASKS.items():
        ids = model.tokenize(spec_bench.chat(name, text))
        model.cache.forget_prefixes()
        events = list(model.generate(ids, {"temperature": 0, "num_predict": N_TOKENS, "draft_num_predict": 0}))
        out[task] = (ids, events[-1].context[len(ids) :])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["smollm2", "gemma3"])
    ap.add_argument("--costs", default=str(ROOT / "bench/results/spec.jsonl"))
    ap.add_argument(
        "--out", default=None, help="append the record to this JSONL file, not bench/results/spec_replay.jsonl"
    )
    args = ap.parse_args()
    calibrated, costs_from = load_costs(args.costs, args.models)
    result = {
        "setup": {
            "costs_from": costs_from,
            "tokens": N_TOKENS,
            "long_agree": S.LONG_AGREE,
            "prior_by_class": [round(float(p / (p + S.PRIOR_REJECT)), 3) for p in S.PRIOR],
        },
        "models": {},
    }
    for name in args.models:
        costs = Fixed({int(r): ms for r, ms in calibrated[name]["calibrated_forward_ms_by_rows"].items()})
        per = {}
        for task, (prompt, reply) in replies(name).items():
            shared = S.Evidence()
            replay(prompt, reply, costs, shared)
            got = per[task] = {
                "reply_tokens": len(reply),
                "fixed_prior": replay(prompt, reply, costs, None),
                "shared_second": replay(prompt, reply, costs, shared),
                "oracle_speedup": oracle(prompt, reply, costs),
            }
            print(
                name,
                task,
                got["fixed_prior"]["modelled_speedup"],
                got["shared_second"]["modelled_speedup"],
                got["oracle_speedup"],
                flush=True,
            )
        result["models"][name] = per
    append_record("spec_replay", result, out=args.out)


def load_costs(path: str, models: list[str]) -> tuple[dict, str]:
    """model -> its bench/spec.py figures, from the latest spec record that calibrated all of `models` (a .jsonl
    file of records) or from a .json file holding one run; and where they came from."""

    def has_costs(run: dict) -> bool:
        return all("calibrated_forward_ms_by_rows" in run.get("models", {}).get(m, {}) for m in models)

    where = os.path.relpath(path, ROOT)
    if not path.endswith(".jsonl"):
        return json.loads(Path(path).read_text())["models"], where
    record = latest_record(path=path, where=lambda r: has_costs(merged(r)))
    if record is None:
        raise SystemExit(f"{where}: no record with calibrated_forward_ms_by_rows for {', '.join(models)}")
    return merged(record)["models"], f"{where}: the record of {record['date']} at {record['commit']}"


if __name__ == "__main__":
    main()
