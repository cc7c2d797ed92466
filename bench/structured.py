"""Decode speed with and without a `format` constraint on both real models.

Both runs use the same loop over the model's forward + KV cache (the engine has no logits hook yet), the
same prompt and sampler; only decode steps are timed (prefill excluded). A constrained run stops when the
document is complete; the unconstrained run decodes `--tokens` tokens, ignoring EOG. Runs are
interleaved and the best of `--reps` is kept (the machine is shared); `ratio_from_overhead` puts the
constrained token choice (mask + sampler, `pick_ms_per_token`) next to the unconstrained forward step. Also
times engine.generate unconstrained as a cross-check and the constraint's own cost per token.

    python3 bench/structured.py [--tokens 40] [--reps 3] [--out FILE.jsonl]

Appends one record per run to bench/results/structured.jsonl (bench/results_log.py; --out: another JSONL file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import localrt  # noqa: E402
from localrt.models import builtin_models  # noqa: E402
from localrt.api.options import resolve  # noqa: E402
from localrt.engine.sampler import make_sampler  # noqa: E402
from localrt.structured import ConstrainedSampler, compile_format, token_index  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import append_record  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "email": {"type": "string", "pattern": "^[a-z0-9.]{1,20}@[a-z]{2,12}\\.(com|org|net)$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "email", "tags", "address"],
    "additionalProperties": False,
}
PROMPTS = {
    "llama": "<|im_start|>user\nDescribe a fictional person as a JSON object.<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\nDescribe a fictional person as a JSON object.<end_of_turn>\n<start_of_turn>model\n",
}


def prefill(model, prompt):
    model.cache.clear(0)
    return model.forward(model.batch(prompt, 0, 0), model.cache, output_rows=np.array([len(prompt) - 1]))[0]


def decode_loop(model, prompt, n_tokens, constraint=None, seed=0):
    """(tokens, seconds, seconds spent choosing tokens (mask + sampler), text)."""
    sampler = make_sampler(resolve({"temperature": 0.7, "seed": seed}))
    if constraint is not None:
        sampler = ConstrainedSampler(sampler, constraint)
    logits = prefill(model, prompt)
    history = list(prompt)
    t_pick = 0.0
    n = 0
    t0 = time.perf_counter()
    while n < n_tokens:
        t = time.perf_counter()
        tok = int(sampler.sample(logits, history))
        t_pick += time.perf_counter() - t
        if constraint is not None and tok in model.tokenizer.eog_ids:
            break
        history.append(tok)
        n += 1
        logits = model.forward(model.batch([tok], len(history) - 1, 0), model.cache, output_rows=None)[0]
    elapsed = time.perf_counter() - t0
    return n, elapsed, t_pick, model.detokenize(history[len(prompt) :])


def engine_tok_s(model, prompt, n_tokens):
    done = None
    for ev in model.generate(prompt, {"temperature": 0.7, "seed": 0, "num_predict": n_tokens}):
        done = ev
    return done.eval_count / (done.eval_duration / 1e9) if done.eval_duration else None


def bench_model(name, path, n_tokens, reps):
    model = localrt.load_model(path, num_ctx=512)
    prompt = model.tokenize(PROMPTS[model.config.arch])
    t = time.perf_counter()
    token_index(model.tokenizer)
    index_s = time.perf_counter() - t
    out = {"n_vocab": model.tokenizer.n_vocab, "token_index_build_s": round(index_s, 3)}
    decode_loop(model, prompt, 4, compile_format("json", model.tokenizer))  # JIT / caches warm
    runs = {"unconstrained": [], "schema": [], "json": []}
    for rep in range(reps):  # interleaved, best of `reps`: the machine is shared, so take the least disturbed run
        for label, fmt in (("schema", SCHEMA), ("json", "json"), ("unconstrained", None)):
            t = time.perf_counter()
            c = compile_format(fmt, model.tokenizer) if fmt is not None else None
            compile_s = time.perf_counter() - t
            n, el, tm, text = decode_loop(model, prompt, n_tokens, c, seed=1)
            runs[label].append(
                {
                    "compile_s": round(compile_s, 3),
                    "tokens": n,
                    "tok_s": round(n / el, 2),
                    "pick_ms_per_token": round(1000 * tm / max(n, 1), 3),
                    "forward_ms_per_token": round(1000 * (el - tm) / max(n, 1), 2),
                    "complete": c.done() if c is not None else None,
                    "text": text,
                }
            )
    for label, rs in runs.items():
        best = max(rs, key=lambda r: r["tok_s"])
        best["tok_s_all_reps"] = [r["tok_s"] for r in rs]
        out[label] = best
    free = out["unconstrained"]["tok_s"]
    for label in ("schema", "json"):
        r = out[label]
        r["ratio_vs_unconstrained"] = round(r["tok_s"] / free, 3)
        # Token choice (mask + sampler) against the same forward: robust to the shared machine's noise.
        u = out["unconstrained"]
        step = u["forward_ms_per_token"] + u["pick_ms_per_token"]
        r["ratio_from_overhead"] = round(step / (u["forward_ms_per_token"] + r["pick_ms_per_token"]), 3)
    out["engine_generate_unconstrained_tok_s"] = round(engine_tok_s(model, prompt, n_tokens) or 0, 2)
    model.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--out", default=None, help="append the record to this JSONL file, not bench/results/structured.jsonl"
    )
    args = ap.parse_args()
    results = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_at_start": os.getloadavg()},
        "note": "decode-only tok/s, same loop for all runs; constrained run stops when the document is complete",
        "models": {},
    }
    for name, path in (("smollm2", builtin_models.smollm2_path()), ("gemma3", builtin_models.gemma3_path())):
        results["models"][name] = bench_model(name, path, args.tokens, args.reps)
        print(name, json.dumps({k: v for k, v in results["models"][name].items()}, default=str)[:600], flush=True)
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    append_record("structured", results, load_at_start=results["machine"]["loadavg_at_start"][0], out=args.out)


if __name__ == "__main__":
    main()
