"""Record llama.cpp's logits on tiny random-weight models of each architecture, for tests/test_arch_fixtures.py.

    python3 bench/make_arch_reference.py            # writes tests/data/arch/{tokenizer.json,<case>.npz}
    python3 bench/make_arch_reference.py qwen3moe   # only the named cases (the others' files stay as they are)

Needs `llama-cpp-python` (the tests never do) and the installed SmolLM2 package (for its tokenizer, cut to
archgen.VOCAB tokens and written once to tests/data/arch/tokenizer.json). For every archgen case, in F32 and
Q8_0 weights, the GGUF is rebuilt from its seed, llama.cpp evaluates archgen.IDS in one batch (logits_all,
n_ctx = the case's, 2 threads) and the logits of every position are stored as float16 (len(IDS), VOCAB).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import archgen  # noqa: E402


def write_tokenizer() -> None:
    """SmolLM2's tokenizer.ggml.* cut to its first VOCAB tokens and the merges whose parts and result are among them."""
    import gguf_io
    from localrt.models import builtin_models

    with gguf_io.open(builtin_models.smollm2_path()) as f:
        md = f.metadata
        tokens = list(md["tokenizer.ggml.tokens"][: archgen.VOCAB])
        kept = set(tokens)
        merges = [m for m in md["tokenizer.ggml.merges"]
                  if (parts := m.split(" ")) and len(parts) == 2 and parts[0] in kept and parts[1] in kept
                  and parts[0] + parts[1] in kept]
        tok = {
            "source": "SmolLM2-135M-Instruct tokenizer.ggml.*, first %d tokens" % archgen.VOCAB,
            "model": md["tokenizer.ggml.model"], "pre": md["tokenizer.ggml.pre"],
            "tokens": tokens, "token_type": [int(t) for t in md["tokenizer.ggml.token_type"][: archgen.VOCAB]],
            "merges": merges,
            **{k: int(md[f"tokenizer.ggml.{k}"]) for k in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")},
        }
    archgen.DATA.mkdir(parents=True, exist_ok=True)
    archgen.TOKENIZER_FILE.write_text(json.dumps(tok, ensure_ascii=False, indent=0) + "\n")


def oracle_logits(path: Path, n_ctx: int) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=64, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval(archgen.IDS)
        return np.array(llm.scores[: len(archgen.IDS)], dtype=np.float32)  # (n_tok, n_vocab)
    finally:
        llm.close()


def main() -> None:
    if not archgen.TOKENIZER_FILE.exists():
        write_tokenizer()
    with tempfile.TemporaryDirectory() as d:
        names = sys.argv[1:] or list(archgen.CASES)
        unknown = [n for n in names if n not in archgen.CASES]
        if unknown:
            raise SystemExit(f"unknown case(s) {unknown}; the cases are {list(archgen.CASES)}")
        for case in (archgen.CASES[n] for n in names):
            out = {}
            for label, wtype in (("f32", archgen.F32), ("q8_0", archgen.Q8_0)):
                path = archgen.write(Path(d) / f"{case.name}-{label}.gguf", case, wtype)
                logits = oracle_logits(path, case.n_ctx)
                out[label] = logits.astype(np.float16)
                top2 = np.sort(logits, axis=1)[:, -2:]
                print(f"{case.name:12s} {label:5s} range {np.ptp(logits, axis=1).mean():6.2f} "
                      f"top-2 gap min {np.min(top2[:, 1] - top2[:, 0]):.3f}")
            np.savez_compressed(archgen.DATA / f"{case.name}.npz", **out)


if __name__ == "__main__":
    main()
