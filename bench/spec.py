"""Speculative decoding (localrt.engine.speculative, draft_model) on the real models, JSON out.

    python3 bench/spec.py [--models smollm2 gemma3] [--tokens 96] [--repeats 2] [--out FILE.jsonl]
    python3 bench/spec.py --models --pairs gemma3 smollm2 [--tokens 64] [--out FILE.jsonl]
    ... [--llama-server PATH/llama-server]  (llama.cpp's own speculative decoding beside ours, same run)

Appends one record per run to bench/results/spec.jsonl, or spec_draft.jsonl for a run of --pairs only
(bench/results_log.py; --out: another JSONL file).

Per model and task, greedy (temperature 0), 2 threads: decode tok/s (eval_count / eval_duration) with
speculation on (the default planner, its costs measured as it runs) and off (draft_num_predict 0), best of
REPEATS with the two alternating; the acceptance rate (draft_accepted_count / draft_count); whether the
texts are identical; decode forwards and rows per generated token, which do not depend on the load of the
machine (the tok/s figures do: they were measured on a shared 2-core machine); and a modelled speedup: the
same forwards priced at the fastest of 5 timings of each row count (a calibration run before the tasks).

Tasks: three copy-heavy ones (edit a given paragraph, rename a variable through a code block, answer by
quoting a context) and free writing. Whether a model does copy is its own: `copied_fraction` (the share of the
reply's tokens inside a 4-gram of the prompt) and `lookup_ceiling_tokens_per_forward` (tokens per forward if
every step drafted 16 from prompt lookup and verification were free) say how much a task leaves to gain.

`--pairs`: draft-model pairs made from one real model by our own quantizer. The original Q4 file (SmolLM2's
Q4_1, Gemma 3's Q4_K_M) is dequantized to F16 (`quantize_model(..., "f16", allow_requantize=True)`: `create`
refuses to requantize a quantized model, as Ollama does), and the F16 file quantized to Q8_0, what
`create --quantize q8_0` does with it: the target is that Q8_0 model, the draft the original Q4. Per task,
greedy: decode tok/s with speculation off, with prompt lookup (the default), with the draft model (the planner
deciding, as a request runs), and with the draft model forced on at its adaptive length (a flat cost model:
what drafting on every step costs, and the acceptance rate a draft of these weights reaches).

`--llama-server PATH`: llama.cpp's own speculative decoding on the same files, prompt ids and max tokens, after
ours in the same run (bench/spec_llama.py: its n-gram types, and its draft model for --pairs), under
"llama_server" in the same JSON (the record's `native`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from results_log import append_record, split_native  # noqa: E402

PARAGRAPH = (
    "The committee met on Tuesday to review the annual budget. After a long discussion, the members agreed "
    "to increase funding for the public library by ten percent, to repair the roof of the community "
    "centre before the winter, and to postpone the decision on the new parking lot until the spring. "
    "The chair thanked everyone for their patience and closed the meeting at nine o'clock."
)
CODE = """def summarize(values):
    total = 0
    count = 0
    for v in values:
        if v is None:
            continue
        total += v
        count += 1
    mean = total / count if count else 0.0
    return {"total": total, "count": count, "mean": mean}"""
CONTEXT = (
    "The Old Town Bridge was designed by the engineer Maria Keller in 1871. Construction began in 1874 and "
    "took six years, because two floods destroyed the wooden scaffolding. The bridge was opened to traffic "
    "on the first of May 1880, and for forty years it was the only crossing of the river within twenty "
    "miles. In 1921 the city added a second lane, and in 1987 the bridge was closed to cars and became a "
    "footpath."
)
TASKS = {
    "edit_paragraph": f"Rewrite the following paragraph, changing Tuesday to Friday and keeping everything else "
    f"exactly the same:\n\n{PARAGRAPH}",
    "rename_variable": f"Rename the variable `total` to `running_sum` in this Python function. Reply with the "
    f"complete code only.\n\n```python\n{CODE}\n```",
    "quote_context": f"Context: {CONTEXT}\n\nQuestion: What happened to the bridge between 1874 and 1921? Answer by "
    f"quoting the sentences of the context word for word.",
    "free_writing": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
COPY_TASKS = ("edit_paragraph", "rename_variable", "quote_context")


def model_path(name: str) -> str:
    from localrt.models import builtin_models

    return str(builtin_models.smollm2_path() if name == "smollm2" else builtin_models.gemma3_path())


def chat(name: str, text: str) -> str:
    if name == "smollm2":
        return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"


class Counting:
    """Counts the decode forwards (all rows' logits) and their rows of a model."""

    def __init__(self, model) -> None:
        self.sizes: list[int] = []  # rows of each decode forward
        self._forward = model.forward
        model.forward = self

    def __call__(self, batch, cache, output_rows=None):
        if output_rows is None:
            self.sizes.append(len(batch))
        return self._forward(batch, cache, output_rows)


def calibrate(model, counter: Counting, ids: list[int], reps: int = 7) -> dict[int, float]:
    """Seconds of a decode forward of 1..17 rows of one sequence (a pending token and up to draft_num_predict's
    default 16 drafted): the fastest of reps (the least disturbed), the row counts in turn in each rep, so that a
    busy spell of the machine does not fall on one count's every try."""
    cache = model.cache
    cache.clear(0)
    counter._forward(model.batch(ids, 0), cache, np.array([len(ids) - 1]))
    out = {rows: float("inf") for rows in range(1, 18)}
    for _ in range(reps):
        for rows in out:
            cache.trim(0, len(ids))
            t0 = time.perf_counter()
            counter._forward(model.batch(ids[:rows], len(ids)), cache, None)
            out[rows] = min(out[rows], time.perf_counter() - t0)
    model.cache.forget_prefixes()
    return out


def run_once(model, counter: Counting, ids: list[int], tokens: int, spec: bool) -> dict:
    model.cache.forget_prefixes()
    counter.sizes = []
    opts = {"temperature": 0, "num_predict": tokens, **({} if spec else {"draft_num_predict": 0})}
    events = list(model.generate(ids, opts))
    done = events[-1]
    return {
        "text": "".join(e.text for e in events[:-1]) + done.text,
        "eval_count": done.eval_count,
        "decode_tok_s": round(done.eval_count / (done.eval_duration / 1e9), 1),
        "decode_forwards": len(counter.sizes),
        "decode_rows": sum(counter.sizes),
        "sizes": counter.sizes,
        "draft_count": done.draft_count,
        "draft_accepted_count": done.draft_accepted_count,
        "generated": done.context[len(ids) :],
    }


def copied_fraction(prompt: list[int], gen: list[int], n: int = 4) -> float:
    """The share of generated tokens inside an n-gram that occurs in the prompt: how much of the reply is a copy."""
    grams = {tuple(prompt[j : j + n]) for j in range(len(prompt) - n + 1)}
    inside = [False] * len(gen)
    for j in range(len(gen) - n + 1):
        if tuple(gen[j : j + n]) in grams:
            inside[j : j + n] = [True] * n
    return round(sum(inside) / max(1, len(gen)), 2)


def lookup_ceiling(prompt: list[int], gen: list[int], k: int = 16) -> float:
    """Generated tokens per decode forward if every step drafted k tokens from prompt lookup and verification
    were free: what the index can give this reply at best (1.0: nothing)."""
    from localrt.engine.speculative import NgramIndex

    index, i, forwards = NgramIndex(), 1, 0  # the first token comes from the prompt's forward
    while i < len(gen):
        _, draft = index.draft(prompt + gen[:i], k)
        a = next((j for j, t in enumerate(draft) if i + j >= len(gen) or gen[i + j] != t), len(draft))
        i, forwards = i + a + 1, forwards + 1
    return round((len(gen) - 1) / max(1, forwards), 2)


def bench_model(name: str, tokens: int, repeats: int, seen: dict | None = None) -> dict:
    """Our figures per task; `seen` gets task -> (user message, rendered prompt, token ids, greedy text on)."""
    from localrt import load_model
    from localrt.engine.speculative import priors

    model = load_model(model_path(name), num_ctx=1024, num_batch=256)
    counter = Counting(model)
    warm = model.tokenize(chat(name, TASKS["edit_paragraph"]))
    run_once(model, counter, warm, 16, True)  # compile/load kernels and measure a few forwards
    quiet = calibrate(model, counter, warm)
    out = {}
    for task, text in TASKS.items():
        ids = model.tokenize(chat(name, text))
        best: dict[str, dict] = {}
        for r in range(repeats):
            for spec in (True, False) if r % 2 == 0 else (False, True):
                got = run_once(model, counter, ids, tokens, spec)
                key = "on" if spec else "off"
                if key not in best or got["decode_tok_s"] > best[key]["decode_tok_s"]:
                    best[key] = got
        on, off = best["on"], best["off"]
        if seen is not None:
            seen[task] = (text, chat(name, text), ids, on["text"])
        n_gen = max(1, on["eval_count"] - 1)  # the first token comes from the prompt's forward
        out[task] = {
            "prompt_tokens": len(ids),
            "eval_count": on["eval_count"],
            "identical_text": on["text"] == off["text"],
            "decode_tok_s_on": on["decode_tok_s"],
            "decode_tok_s_off": off["decode_tok_s"],
            "speedup": round(on["decode_tok_s"] / off["decode_tok_s"], 2),
            "draft_count": on["draft_count"],
            "draft_accepted_count": on["draft_accepted_count"],
            "acceptance": round(on["draft_accepted_count"] / on["draft_count"], 3) if on["draft_count"] else None,
            "decode_forwards_per_token_on": round(on["decode_forwards"] / n_gen, 3),
            "decode_rows_per_token_on": round(on["decode_rows"] / n_gen, 3),
            "decode_forwards_per_token_off": round(off["decode_forwards"] / max(1, off["eval_count"] - 1), 3),
            # Decode time from the forwards' row counts and the calibrated (least disturbed) cost of each count:
            # the speedup a quiet machine would show for these same forwards.
            "modelled_speedup": round(sum(quiet[1] for _ in off["sizes"]) / sum(quiet[r] for r in on["sizes"]), 2),
            "rows_histogram_on": {r: on["sizes"].count(r) for r in sorted(set(on["sizes"]))},
            # How much the reply copies the prompt (4-grams), and the tokens per forward prompt lookup could reach
            "copied_fraction": copied_fraction(ids, off["generated"]),
            "lookup_ceiling_tokens_per_forward": lookup_ceiling(ids, off["generated"]),
            "text_head": on["text"][:120],
        }
        shown = {k: v for k, v in out[task].items() if k not in ("text_head", "rows_histogram_on")}
        print(name, task, shown, flush=True)
    costs = priors(model).costs
    out["calibrated_forward_ms_by_rows"] = {r: round(t * 1e3, 2) for r, t in quiet.items()}
    out["planner_measured_forward_ms_by_rows"] = {r: round(t * 1e3, 1) for r, t in sorted(costs.measured().items())}
    model.close()
    return out


def pair_files(name: str, workdir: Path) -> tuple[Path, Path]:
    """(target Q8_0, draft: the original Q4 file) for a model; the Q8_0 is made once through an F16 file."""
    from localrt.models.quantize import quantize_model

    src, f16, q8 = Path(model_path(name)), workdir / f"{name}-f16.gguf", workdir / f"{name}-q8_0.gguf"
    if not q8.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        for _ in quantize_model(src, f16, "f16", allow_requantize=True):
            pass
        for _ in quantize_model(f16, q8, "q8_0"):
            pass
        f16.unlink()
    return q8, src


def bench_pair(name: str, tokens: int, repeats: int, workdir: Path, seen: dict | None = None) -> dict:
    from localrt import load_model
    from localrt.engine.draft_model import ModelDrafter
    from localrt.engine.speculative import CostModel, priors

    class Flat(CostModel):  # every forward the same: drafting always pays (the "forced" mode)
        def cost(self, rows: int) -> float:
            return 1.0

    target_path, draft_path = pair_files(name, workdir)
    target = load_model(target_path, num_ctx=1024, num_batch=256)
    drafter = ModelDrafter(target, load_model(draft_path, num_ctx=1024, num_batch=256), "draft")
    planner_costs, planner_step = priors(target).costs, drafter.draft_costs
    modes = {
        "off": {"draft_num_predict": 0},
        "lookup": {},
        "draft": {"draft_model": "draft"},
        "draft_forced": {"draft_model": "draft"},
    }

    def run(ids: list[int], mode: str) -> dict:
        forced = mode == "draft_forced"
        priors(target).costs = Flat() if forced else planner_costs
        drafter.draft_costs = (lambda seq, costs: (0.0, 0.0)) if forced else planner_step
        target.cache.forget_prefixes()
        drafter.cached.clear()
        events = list(target.generate(ids, {"temperature": 0, "num_predict": tokens, **modes[mode]}, draft=drafter))
        done = events[-1]
        return {
            "text": "".join(e.text for e in events[:-1]) + done.text,
            "eval_count": done.eval_count,
            "generated": done.context[len(ids) :],
            "decode_tok_s": round(done.eval_count / (done.eval_duration / 1e9), 1),
            "draft_count": done.draft_count,
            "draft_accepted_count": done.draft_accepted_count,
        }

    run(target.tokenize(chat(name, TASKS["edit_paragraph"])), "draft_forced")  # compile kernels, measure forwards
    run(target.tokenize(chat(name, TASKS["edit_paragraph"])), "draft")
    out: dict = {"target": target_path.name + " (Q8_0 via F16, our quantizer)", "draft": draft_path.name}
    for task, text in TASKS.items():
        ids = target.tokenize(chat(name, text))
        best: dict[str, dict] = {}
        for r in range(repeats):
            for mode in modes if r % 2 == 0 else list(modes)[::-1]:
                got = run(ids, mode)
                if mode not in best or got["decode_tok_s"] > best[mode]["decode_tok_s"]:
                    best[mode] = got
        if seen is not None:
            seen[task] = (text, chat(name, text), ids, best["off"]["text"])
        row = {
            "prompt_tokens": len(ids),
            "eval_count": best["off"]["eval_count"],
            "identical_text": all(b["text"] == best["off"]["text"] for b in best.values()),
        }
        for mode, b in best.items():
            row[f"decode_tok_s_{mode}"] = b["decode_tok_s"]
            if mode != "off":
                row[f"speedup_{mode}"] = round(b["decode_tok_s"] / best["off"]["decode_tok_s"], 2)
                dc, da = b["draft_count"], b["draft_accepted_count"]
                row[f"acceptance_{mode}"] = round(da / dc, 3) if dc else None
                row[f"draft_count_{mode}"] = dc
        out[task] = row
        print(name, "pair", task, row, flush=True)
    out["planner_target_forward_ms_by_rows"] = {
        r: round(t * 1e3, 1) for r, t in sorted(planner_costs.measured().items())
    }
    draft_costs = priors(drafter.model).costs.measured()
    out["draft_forward_ms_by_rows"] = {r: round(t * 1e3, 1) for r, t in sorted(draft_costs.items()) if r <= 16}
    drafter.close()
    target.close()
    return out


def run_llama(args, seen: dict[str, dict]) -> dict:
    """llama-server (bench/spec_llama.py) per model and pair, on the prompts and texts our runs saw."""
    from spec_llama import CONFIGS, PAIR_CONFIGS, run_configs, summary

    out: dict = {}
    for key, tasks in seen.items():
        pair = key.endswith("_pair")
        name = key.removesuffix("_pair")
        gguf, configs = Path(model_path(name)), CONFIGS
        if pair:
            gguf, draft = pair_files(name, Path(args.pair_dir))
            configs = {c: [str(draft) if a == "{draft}" else a for a in extra] for c, extra in PAIR_CONFIGS.items()}
        prompts = {t: (user, rendered, ids) for t, (user, rendered, ids, _) in tasks.items()}
        rows = run_configs(
            args.llama_server,
            gguf,
            configs,
            prompts,
            {t: v[3] for t, v in tasks.items()},
            args.tokens,
            args.repeats,
            prompts["edit_paragraph"][2],
        )
        out[key] = {"summary": summary(rows, COPY_TASKS, configs), **rows}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["smollm2", "gemma3"])
    ap.add_argument("--pairs", nargs="*", default=[], help="draft-model pairs (Q8_0 target, Q4 draft) of these models")
    ap.add_argument(
        "--pair-dir",
        default=str(Path(tempfile.gettempdir()) / "localrt-spec-pairs"),
        help="where the Q8_0 targets are written (kept for the next run)",
    )
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="also run llama.cpp's llama-server (bench/spec_llama.py) on the same files and prompts",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="append the record to this JSONL file, not bench/results/spec.jsonl (spec_draft.jsonl with only --pairs)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so that llama-servers started are stopped
    benchmark = "spec_draft" if args.pairs and not args.models else "spec"
    setup = {
        "threads": 2,
        "num_predict": args.tokens,
        "best_of": args.repeats,
        "temperature": 0,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "note": "shared 2-core machine (other jobs running): tok/s are noisy, forwards/rows per token are not",
    }
    t0 = time.time()
    seen: dict[str, dict] = {name: {} for name in [*args.models, *(f"{p}_pair" for p in args.pairs)]}
    results = {name: bench_model(name, args.tokens, args.repeats, seen[name]) for name in args.models}
    pairs = {
        name: bench_pair(name, args.tokens, args.repeats, Path(args.pair_dir), seen[f"{name}_pair"])
        for name in args.pairs
    }
    llama = run_llama(args, seen) if args.llama_server else {}
    setup["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    setup["wall_s"] = round(time.time() - t0, 1)
    summary = {}
    for name, tasks in pairs.items():
        summary[f"{name}_pair"] = {
            f"{m}_speedup": [tasks[t][f"speedup_{m}"] for t in TASKS] for m in ("lookup", "draft", "draft_forced")
        }
        summary[f"{name}_pair"]["draft_forced_acceptance"] = [tasks[t]["acceptance_draft_forced"] for t in TASKS]
        summary[f"{name}_pair"]["all_identical"] = all(tasks[t]["identical_text"] for t in TASKS)
    for name, tasks in results.items():
        copy = [tasks[t]["speedup"] for t in COPY_TASKS if t in tasks]
        summary[name] = {
            "copy_tasks_speedup": copy,
            "free_writing_speedup": tasks["free_writing"]["speedup"],
            "copy_tasks_modelled_speedup": [tasks[t]["modelled_speedup"] for t in COPY_TASKS if t in tasks],
            "free_writing_modelled_speedup": tasks["free_writing"]["modelled_speedup"],
            "copy_tasks_copied_fraction": [tasks[t]["copied_fraction"] for t in COPY_TASKS if t in tasks],
            "copy_tasks_lookup_ceiling": [
                tasks[t]["lookup_ceiling_tokens_per_forward"] for t in COPY_TASKS if t in tasks
            ],
            "all_identical": all(tasks[t]["identical_text"] for t in TASKS),
        }
    body = {
        "setup": setup,
        "summary": summary,
        "models": results,
        **({"pairs": pairs} if pairs else {}),
        **({"llama_server": llama} if llama else {}),
    }
    print(json.dumps(summary, indent=2))
    native = split_native(body, ("llama_server",))
    append_record(
        benchmark,
        body,
        native=native,
        threads=setup["threads"],
        load_at_start=setup["loadavg_1m_at_start"],
        out=args.out,
    )


if __name__ == "__main__":
    main()
