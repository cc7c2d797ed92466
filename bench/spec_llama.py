"""llama.cpp's own speculative decoding (its llama-server) on bench/spec.py's tasks, beside ours in the same run.

`bench/spec.py --llama-server PATH` calls `bench_server` per model (and `bench_server_pair` per `--pairs` model)
after our own runs, with the same GGUF, the same prompt token ids, greedy, the same max tokens:

- One llama-server per configuration (`CONFIGS`: speculation off and each n-gram type the server offers, at its
  defaults and one set like our prompt lookup; `PAIR_CONFIGS`: the Q8_0 target off and with the Q4 file as
  `--spec-type draft-simple --spec-draft-model` at the default and our draft length), all started at once
  (-t 2, -np 1, -c 1024) so the repeats alternate between them as ours alternate on/off; each gets one warm-up request first (its first
  request is several times slower).
- The prompt is sent as our token ids (POST /completion, `cache_prompt` off), so both engines continue the same
  tokens; `tokenize_agrees` says whether the server's own /tokenize of our rendered prompt gives those ids, and
  `llama_template_prompt_tokens` how many tokens the file's chat template (the server's /apply-template) makes of
  the same user message (ours: `chat()` in spec.py, no system turn; SmolLM2's template adds a default system turn,
  Gemma 3's file has no template and the server falls back to ChatML).
- Figures from the reply's `timings` (tools/server/server-common.cpp, server_slot_stats::to_json):
  `predicted_per_second` is (predicted_n - 1) / (time from the end of the prompt to the last token): the first
  token comes from the prompt's logits. Ours is eval_count / eval_duration over the same interval, one more
  token; `decode_tok_s_ours_formula` applies ours to the server's numbers. `draft_n` / `draft_n_accepted` (only
  when it drafted) are its drafted and accepted token counts. `identical_to_ours`: its text equals our greedy
  text for the task (both engines quantize activations their own way, so a near-tie can split them; its own on
  and off texts are compared in `identical_on_off`).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

CTX = 1024  # as bench/spec.py loads our model (num_ctx)
# name -> extra llama-server arguments. Defaults (common/common.h): ngram-simple/map-k look up a 12-gram and
# draft up to 48; ngram-mod matches 24 and drafts 48-64; ngram-cache drafts up to 8 from a 3-level n-gram cache.
CONFIGS = {
    "off": [],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-simple-n3": [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "3",
        "--spec-ngram-simple-size-m",
        "16",
    ],  # like ours: a 3-gram, up to 16 drafted
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-cache": ["--spec-type", "ngram-cache"],
}
# A plain draft model needs --spec-type draft-simple: the server detects only MTP/DFlash drafts from the file
# (common/speculative.cpp), and with no type it loads the draft model and never drafts. Default n-max: 3.
DRAFT = ["--spec-type", "draft-simple", "--spec-draft-model", "{draft}", "-td", "2"]
PAIR_CONFIGS = {"off": [], "draft": DRAFT, "draft-n16": [*DRAFT, "--spec-draft-n-max", "16"]}


def free_port() -> int:
    from localrt.serve.daemon import free_port as port

    return port()


class Server:
    """One llama-server process on a GGUF with extra arguments; stopped by close()."""

    def __init__(self, exe: str, gguf: Path, extra: list[str]) -> None:
        self.port = free_port()
        self.args = [
            exe,
            "-m",
            str(gguf),
            "-t",
            "2",
            "-tb",
            "2",
            "-np",
            "1",
            "-c",
            str(CTX),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *extra,
        ]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {' '.join(self.args)}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"llama-server did not come up: {' '.join(self.args)}")

    def complete(self, ids: list[int], tokens: int) -> dict:
        body = {
            "prompt": ids,
            "n_predict": tokens,
            "temperature": 0,
            "cache_prompt": False,
            "stream": False,
            "return_tokens": True,
        }
        r = httpx.post(self.base + "/completion", json=body, timeout=600)
        r.raise_for_status()
        return r.json()

    def tokenize(self, text: str) -> list[int]:
        r = httpx.post(
            self.base + "/tokenize", json={"content": text, "add_special": True, "parse_special": True}, timeout=60
        )
        r.raise_for_status()
        return r.json()["tokens"]

    def template_tokens(self, user: str) -> int | None:
        r = httpx.post(
            self.base + "/apply-template", json={"messages": [{"role": "user", "content": user}]}, timeout=60
        )
        if r.status_code != 200:
            return None
        return len(self.tokenize(r.json()["prompt"]))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def figures(reply: dict) -> dict:
    t = reply["timings"]
    n, ms = t["predicted_n"], t["predicted_ms"]
    return {
        "text": reply["content"],
        "predicted_n": n,
        "decode_tok_s": round(t["predicted_per_second"], 1),
        "decode_tok_s_ours_formula": round(n / (ms / 1e3), 1) if ms else None,
        "prompt_n": t["prompt_n"],
        "draft_n": t.get("draft_n", 0),
        "draft_n_accepted": t.get("draft_n_accepted", 0),
    }


def common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_configs(
    exe: str,
    gguf: Path,
    configs: dict[str, list[str]],
    prompts: dict[str, tuple[str, str, list[int]]],
    ours: dict[str, str],
    tokens: int,
    repeats: int,
    warm_ids: list[int],
) -> dict:
    """prompts: task -> (user message, rendered prompt, our token ids); ours: task -> our greedy text."""
    servers = {name: Server(exe, gguf, extra) for name, extra in configs.items()}
    try:
        for s in servers.values():
            s.wait()
        for s in servers.values():
            s.complete(warm_ids, 16)  # the first request of a server is several times slower
        out: dict = {"llama_server_args": {name: s.args[3:] for name, s in servers.items()}}
        probe = servers["off"]
        for task, (user, rendered, ids) in prompts.items():
            best: dict[str, dict] = {}
            for r in range(repeats):
                for name in configs if r % 2 == 0 else list(configs)[::-1]:
                    got = figures(servers[name].complete(ids, tokens))
                    if name not in best or got["decode_tok_s"] > best[name]["decode_tok_s"]:
                        best[name] = got
            off = best["off"]
            row = {
                "prompt_tokens": len(ids),
                "server_prompt_n": off["prompt_n"],
                "tokenize_agrees": probe.tokenize(rendered) == ids,
                "llama_template_prompt_tokens": probe.template_tokens(user),
                "predicted_n": off["predicted_n"],
                "identical_to_ours": off["text"] == ours.get(task),
                "common_prefix_chars_with_ours": common_prefix(off["text"], ours.get(task, "")),
                "text_head": off["text"][:120],
            }
            for name, b in best.items():
                row[f"decode_tok_s_{name}"] = b["decode_tok_s"]
                row[f"decode_tok_s_ours_formula_{name}"] = b["decode_tok_s_ours_formula"]
                if name != "off":
                    row[f"speedup_{name}"] = round(b["decode_tok_s"] / off["decode_tok_s"], 2)
                    row[f"draft_n_{name}"], row[f"draft_n_accepted_{name}"] = b["draft_n"], b["draft_n_accepted"]
                    row[f"acceptance_{name}"] = round(b["draft_n_accepted"] / b["draft_n"], 3) if b["draft_n"] else None
                    row[f"identical_on_off_{name}"] = b["text"] == off["text"]
            out[task] = row
            shown = {k: v for k, v in row.items() if "ours_formula" not in k and k != "text_head"}
            print("llama-server", gguf.name, task, shown, flush=True)
        return out
    finally:
        for s in servers.values():
            s.close()


def summary(rows: dict, copy_tasks: tuple[str, ...], configs: dict) -> dict:
    tasks = [t for t in rows if isinstance(rows[t], dict) and "predicted_n" in rows[t]]
    out = {f"{name}_speedup": [rows[t][f"speedup_{name}"] for t in tasks] for name in configs if name != "off"}
    out["tasks"] = tasks
    out["best_copy_speedup"] = {
        t: max((rows[t][f"speedup_{n}"], n) for n in configs if n != "off") for t in tasks if t in copy_tasks
    }
    out["all_identical_to_ours"] = all(rows[t]["identical_to_ours"] for t in tasks)
    return out
