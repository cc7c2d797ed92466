"""Record llama.cpp's logits on tiny random-weight models of each architecture, for
tests/engine/arch/test_arch_fixtures.py.

    python3 bench/make_arch_reference.py            # writes tests/data/arch/{tokenizer.json,<case>.npz}
    python3 bench/make_arch_reference.py qwen3moe   # only the named cases (the others' files stay as they are)
    python3 bench/make_arch_reference.py --redo     # recompute labels a case's file already has (default: add missing)

Needs `llama-cpp-python` (the tests never do) and the installed SmolLM2 package (for its tokenizer, cut to
decoders.VOCAB tokens and written once to tests/data/arch/tokenizer.json). For every fixtures.decoders case, in F32 and
Q8_0 weights, the GGUF is rebuilt from its seed, llama.cpp evaluates decoders.IDS in one batch (logits_all,
n_ctx = the case's, 2 threads) and the logits of every position are stored as float16 (len(IDS), VOCAB).
Labels q4_k_m and iq4_xs are llama.cpp on the F32 file quantized by `localrt create --quantize`'s own quantizer
(localrt.models.quantize: llama-quantize's recipe, so K-quants mixed with Q5_0/Q8_0/Q6_K fallbacks on 64-wide rows).
Label mxfp4 is the decoder builder's file with its experts in MXFP4 (gpt-oss's own layout). Each case lists its labels
(decoders.Case.labels).
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

from fixtures import decoders  # noqa: E402


def write_tokenizer() -> None:
    """SmolLM2's tokenizer.ggml.* cut to its first VOCAB tokens and the merges whose parts and result are among them."""
    import gguf_io
    from localrt.models import builtin_models

    with gguf_io.open(builtin_models.smollm2_path()) as f:
        md = f.metadata
        tokens = list(md["tokenizer.ggml.tokens"][: decoders.VOCAB])
        kept = set(tokens)
        merges = [
            m
            for m in md["tokenizer.ggml.merges"]
            if (parts := m.split(" "))
            and len(parts) == 2
            and parts[0] in kept
            and parts[1] in kept
            and parts[0] + parts[1] in kept
        ]
        tok = {
            "source": "SmolLM2-135M-Instruct tokenizer.ggml.*, first %d tokens" % decoders.VOCAB,
            "model": md["tokenizer.ggml.model"],
            "pre": md["tokenizer.ggml.pre"],
            "tokens": tokens,
            "token_type": [int(t) for t in md["tokenizer.ggml.token_type"][: decoders.VOCAB]],
            "merges": merges,
            **{
                k: int(md[f"tokenizer.ggml.{k}"])
                for k in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
            },
        }
    decoders.DATA.mkdir(parents=True, exist_ok=True)
    decoders.TOKENIZER_FILE.write_text(json.dumps(tok, ensure_ascii=False, indent=0) + "\n")


def oracle_logits(path: Path, n_ctx: int) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=64, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval(decoders.IDS)
        return np.array(llm.scores[: len(decoders.IDS)], dtype=np.float32)  # (n_tok, n_vocab)
    finally:
        llm.close()


LABELS = {"f32": decoders.F32, "q8_0": decoders.Q8_0, "q4_k_m": "q4_K_M", "iq4_xs": "iq4_xs", "mxfp4": decoders.MXFP4}


def case_file(d: Path, case: decoders.Case, label: str) -> Path:
    """The case's GGUF for a label: the decoder builder's own F32/Q8_0 file, or the F32 file through our quantizer."""
    wtype = LABELS[label]
    if isinstance(wtype, int):
        return decoders.write(d / f"{case.name}-{label}.gguf", case, wtype)
    from localrt.models.quantize import quantize_model

    dst = d / f"{case.name}-{label}.gguf"
    for _ in quantize_model(decoders.write(d / f"{case.name}-src.gguf", case, decoders.F32), dst, wtype):
        pass
    return dst


def main() -> None:
    if not decoders.TOKENIZER_FILE.exists():
        write_tokenizer()
    args = sys.argv[1:]
    redo = "--redo" in args
    args = [a for a in args if a != "--redo"]
    with tempfile.TemporaryDirectory() as d:
        names = args or list(decoders.CASES)
        unknown = [n for n in names if n not in decoders.CASES]
        if unknown:
            raise SystemExit(f"unknown case(s) {unknown}; the cases are {list(decoders.CASES)}")
        for case in (decoders.CASES[n] for n in names):
            npz = decoders.DATA / f"{case.name}.npz"
            out = {}
            if npz.exists() and not redo:
                with np.load(npz) as z:
                    out = {k: z[k] for k in z.files}
            for label in case.labels:
                if label in out:
                    continue
                path = case_file(Path(d), case, label)
                logits = oracle_logits(path, case.n_ctx)
                out[label] = logits.astype(np.float16)
                top2 = np.sort(logits, axis=1)[:, -2:]
                print(
                    f"{case.name:12s} {label:5s} range {np.ptp(logits, axis=1).mean():6.2f} "
                    f"top-2 gap min {np.min(top2[:, 1] - top2[:, 0]):.3f}"
                )
            np.savez_compressed(npz, **out)


if __name__ == "__main__":
    main()
