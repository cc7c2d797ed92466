"""Embedding throughput: documents per second through /v1/embeddings, localrt's daemon against native llama.cpp's
llama-server --embedding, on the same files, inputs and batch settings, in the same run.

    python3 bench/embed.py --llama-server PATH [--chunks 1000] [--tokens 256] [--per-request 32] [--files minilm,nomic]

Files: `minilm` is the built-in all-MiniLM-L6-v2 (bert, F16, converted by localrt.models.hf_bert); `nomic` is a
random-weight nomic-bert of nomic-embed-text v1.5's shape (768 wide, 12 layers, F16; speed does not depend on the
values). Inputs: `--chunks` documents of `--tokens` token ids each ([CLS] ... [SEP], fixed seed), sent as token
ids, `--per-request` documents per request, one client. Both servers get 2 threads, a batch of 2048 tokens (8
documents of 256 per forward; localrt's num_batch, llama-server's -b/-ub) and keep the model loaded. The first
request of each is a warm-up, not timed. JSON goes to stdout, and one record is appended to
bench/results/embed.jsonl (bench/results_log.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from results_log import append_record, split_native  # noqa: E402

THREADS, BATCH = 2, 2048


def nomic_file(path: Path, vocab_md: dict) -> Path:
    """A random nomic-bert of nomic-embed-text v1.5's shape, with all-MiniLM's vocabulary."""
    import gguf_io

    rng = np.random.default_rng(0)
    e, ff, layers, n_vocab = 768, 3072, 12, len(vocab_md["tokenizer.ggml.tokens"])

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), np.float32) / np.sqrt(cols)).astype(np.float16)

    def vec(n, c=0.0):
        return (c + 0.1 * rng.standard_normal(n, np.float32)).astype(np.float32)

    t = [
        ("token_embd.weight", 1, (n_vocab, e), mat(n_vocab, e)),
        ("token_types.weight", 0, (2, e), vec(2 * e).reshape(2, e)),
        ("token_embd_norm.weight", 0, (e,), vec(e, 1.0)),
        ("token_embd_norm.bias", 0, (e,), vec(e)),
    ]
    for il in range(layers):
        p = f"blk.{il}."
        t += [
            (p + "attn_qkv.weight", 1, (3 * e, e), mat(3 * e, e)),
            (p + "attn_output.weight", 1, (e, e), mat(e, e)),
            (p + "attn_output_norm.weight", 0, (e,), vec(e, 1.0)),
            (p + "attn_output_norm.bias", 0, (e,), vec(e)),
            (p + "ffn_up.weight", 1, (ff, e), mat(ff, e)),
            (p + "ffn_gate.weight", 1, (ff, e), mat(ff, e)),
            (p + "ffn_down.weight", 1, (e, ff), mat(e, ff)),
            (p + "layer_output_norm.weight", 0, (e,), vec(e, 1.0)),
            (p + "layer_output_norm.bias", 0, (e,), vec(e)),
        ]
    md = {
        "general.architecture": "nomic-bert",
        "general.name": "nomic-shaped random",
        "general.file_type": 1,
        "nomic-bert.context_length": 2048,
        "nomic-bert.embedding_length": e,
        "nomic-bert.feed_forward_length": ff,
        "nomic-bert.block_count": layers,
        "nomic-bert.attention.head_count": 12,
        "nomic-bert.attention.layer_norm_epsilon": 1e-12,
        "nomic-bert.attention.causal": False,
        "nomic-bert.pooling_type": 1,
        "nomic-bert.rope.freq_base": 1000.0,
        "tokenizer.ggml.token_type_count": 2,
        **vocab_md,
    }
    gguf_io.write(path, md, t)
    return path


def files(tmp: Path, wanted: list[str]) -> dict[str, Path]:
    from fixtures import encoders
    from localrt.models.hf_bert import convert, vocab_metadata

    minilm = convert(encoders.minilm_dir(), tmp / "minilm.gguf", "all-MiniLM-L6-v2")
    out = {"minilm": minilm}
    if "nomic" in wanted:  # nomic-embed-text's vocabulary is bert-base-uncased's, as all-MiniLM's
        out["nomic"] = nomic_file(tmp / "nomic.gguf", vocab_metadata(encoders.minilm_dir() / "tokenizer.json"))
    return {k: v for k, v in out.items() if k in wanted}


def documents(n: int, tokens: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [[101] + rng.integers(1000, 30000, tokens - 2).tolist() + [102] for _ in range(n)]


def wait(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{what} did not start")


def throughput(url: str, model: str, docs: list[list[int]], per: int) -> dict:
    with httpx.Client(timeout=600) as c:
        r = c.post(url + "/v1/embeddings", json={"model": model, "input": docs[:per]})  # warm-up: load, compile
        r.raise_for_status()
        t0 = time.perf_counter()
        for i in range(0, len(docs), per):
            r = c.post(url + "/v1/embeddings", json={"model": model, "input": docs[i : i + per]})
            r.raise_for_status()
            assert len(r.json()["data"]) == len(docs[i : i + per])
        wall = time.perf_counter() - t0
    return {
        "docs": len(docs),
        "wall_s": round(wall, 2),
        "docs_per_s": round(len(docs) / wall, 2),
        "tokens_per_s": round(sum(map(len, docs)) / wall, 1),
    }


def ours(path: Path, name: str, docs, per, tmp: Path) -> dict:
    from localrt.serve.daemon import free_port

    port = free_port()
    env = {
        **os.environ,
        "LOCALRT_HOST": f"127.0.0.1:{port}",
        "LOCALRT_MODELS": str(tmp / "models"),
        "LOCALRT_DATA": str(tmp / "data"),
        "LOCALRT_KEEP_ALIVE": "-1",
    }
    env.pop("LOCALRT_API_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / f"serve-{name}.log", "wb"),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait(url, proc, "localrt serve")
        mf = tmp / f"Modelfile.{name}"
        mf.write_text(f"FROM {path}\nPARAMETER num_batch {BATCH}\nPARAMETER num_thread {THREADS}\n")
        subprocess.run(
            [sys.executable, "-m", "cli", "create", name, "-f", str(mf)],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
        )
        return throughput(url, name, docs, per)
    finally:
        proc.terminate()
        proc.wait(30)


def native(server: str, path: Path, docs, per, tmp: Path, name: str) -> dict:
    from localrt.serve.daemon import free_port

    port = free_port()
    slots = BATCH // len(docs[0])
    proc = subprocess.Popen(
        [
            server,
            "-m",
            str(path),
            "--embedding",
            "--pooling",
            "mean",
            "-t",
            str(THREADS),
            "-tb",
            str(THREADS),
            "-b",
            str(BATCH),
            "-ub",
            str(BATCH),
            "-c",
            str(BATCH),
            "-np",
            str(slots),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / f"llama-server-{name}.log", "wb"),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait(url + "/health", proc, "llama-server")
        return throughput(url, name, docs, per)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"), help="native llama-server binary")
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--per-request", type=int, default=32)
    ap.add_argument("--files", default="minilm,nomic")
    ap.add_argument("--out", default=None, help="another JSONL file for the record")
    args = ap.parse_args()
    docs = documents(args.chunks, args.tokens)
    results, peers = {}, {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for name, path in files(tmp, args.files.split(",")).items():
            results[name] = ours(path, name, docs, args.per_request, tmp)
            if args.llama_server:
                peers[name] = native(args.llama_server, path, docs, args.per_request, tmp, name)
                results[name]["ratio_vs_llama_server"] = round(
                    results[name]["docs_per_s"] / peers[name]["docs_per_s"], 3
                )
    out = {
        "settings": {
            "chunks": args.chunks,
            "tokens": args.tokens,
            "per_request": args.per_request,
            "batch": BATCH,
            "threads": THREADS,
        },
        "localrt": results,
        "llama_server": peers or None,
    }
    print(json.dumps(out, indent=2))
    peer_figures = split_native(out, ("llama_server",))  # the peer's figures, at their path in the run
    append_record("embed", out, native=peer_figures, threads=THREADS, out=args.out)


if __name__ == "__main__":
    main()
