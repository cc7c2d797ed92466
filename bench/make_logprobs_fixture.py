"""llama.cpp's log-probabilities on SmolLM2-135M Q4_1 for a greedy continuation, the oracle of
tests/e2e/test_logprobs.py.

    LLAMA_CPP_LIB_PATH=... PYTHONPATH=.:<llama-cpp-python> python3 bench/make_logprobs_fixture.py

For each prompt (raw text, tokenized by llama.cpp): the prompt's ids, then N_PREDICT greedy steps by single-token
decode (n_ctx 512, 2 threads), each with the chosen id, its log-probability and the TOP most likely (id,
log-probability), from the log-softmax (in double) of llama.cpp's logits at that step. Writes
tests/data/logprobs_llamacpp.json; tests need no llama.cpp. Needs `llama-cpp-python`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import llama_cpp  # noqa: E402

from localrt.models import builtin_models  # noqa: E402

OUT = ROOT / "tests" / "data" / "logprobs_llamacpp.json"
PROMPTS = ("The capital of France is", "1, 2, 3, 4,", "Water boils at")  # no near-tie among the greedy picks
N_PREDICT = 8
TOP = 5


def main() -> None:
    path = builtin_models.smollm2_path()
    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=2, logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()
    cases = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        steps = []
        for _ in range(N_PREDICT):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float64)
            lp = logits - logits.max()
            lp -= np.log(np.exp(lp).sum())
            order = np.argsort(-lp, kind="stable")[:TOP]
            tok = int(order[0])
            steps.append({"id": tok, "logprob": float(lp[tok]), "top": [[int(t), float(lp[t])] for t in order]})
            llm.eval([tok])
        cases.append({"prompt": text, "ids": [int(i) for i in ids], "steps": steps})
    OUT.write_text(
        json.dumps({"model": path.name, "n_predict": N_PREDICT, "top": TOP, "cases": cases}, indent=1) + "\n"
    )
    print("wrote", OUT)


if __name__ == "__main__":
    main()
