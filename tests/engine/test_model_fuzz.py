"""A hypothesis fuzzer over model hyperparameters (issue 12): tiny llama / qwen2 / gemma3 files with shapes drawn
in range and metadata keys overridden in and out of range, each estimated, loaded and run for two tokens in a
subprocess (tests/_fuzz_runner.py). A clean refusal (a LocalrtError: InvalidModel names the key) or a short
generation are both fine; a death by signal (the heap corruption this issue found), any other exception (a
hidden 500) or a MemoryError under the child's 8 GiB cap fails, naming the case.

Several cases share one subprocess to pay Numba's start-up once; the child prints a line before each case,
so a crash is attributed to the case it was in. Small for a 2-core CI: 6 batches of 4 cases."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fixtures.decoders import small, write_model
from _hostile_gguf import VT, rewrite
from _testpaths import REPO, TESTS

ROOT = REPO
RUNNER = TESTS / "_fuzz_runner.py"
CHILD_MEMORY = 8 << 30  # bytes of address space for the child (a 2e9-layer config asked for ~16 GB)
# Few threads and malloc arenas in the child: address space reserved per thread must not count against the cap
# on a many-core machine.
CHILD_ENV = {"NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
CHILD_TIMEOUT_S = 300  # generous: a fresh CI machine compiles the kernels in the first child

NAN, INF = float("nan"), float("inf")


def ints(*edges, lo=0, hi=64):
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def floats(*edges):
    return st.one_of(st.sampled_from(edges), st.floats(1e-8, 1e8))


# <arch>.<suffix> -> values, in and out of range (a negative int is written as INT32: the reader takes it)
OVERRIDES = {
    "block_count": ints(0, 1, 2, 3, 10**8, 2 * 10**9, hi=4),
    "context_length": ints(0, 1, 4, 2**24, 2**40, hi=64),
    "embedding_length": ints(0, 8, 16, 32, 33, 10**6),
    "attention.head_count": ints(0, 1, 2, 3, 4, 4096, hi=8),
    "attention.head_count_kv": ints(0, 1, 2, 3, hi=8),
    "attention.key_length": ints(-1, 0, 4, 8, 16, 24),
    "attention.value_length": ints(-1, 0, 4, 8, 16),
    "rope.dimension_count": ints(-1, 0, 1, 7, 8, 16, 32, 96, hi=128),
    "feed_forward_length": ints(0, 16, 17, 32),
    "vocab_size": ints(0, 259, 260, 261, 10**6, lo=250, hi=270),
    "attention.layer_norm_rms_epsilon": floats(NAN, -1e-5, 0.0, 1e-6, INF, 1e30, 1e-38),
    "rope.freq_base": floats(0.0, NAN, -1.0, 1.0, 1e6, INF, 1e-38),
    "rope.freq_base_swa": floats(0.0, NAN, 1e4),
    "attention.sliding_window": ints(-1, 0, 1, 4, 2**31, hi=40),
    "attention.sliding_window_pattern": ints(0, 1, 2, 6, hi=8),
    "final_logit_softcapping": floats(NAN, -1.0, 0.0, 30.0, 1e-30),
    "attention.scale": floats(NAN, -1.0, 0.0, 0.25, 1e30),
    "rope.scaling.factor": floats(NAN, 0.0, 2.0, 1e-40),
    "expert_count": ints(0, 8),
}

shapes = st.fixed_dictionaries(
    {
        "arch": st.sampled_from(["llama", "qwen2", "gemma3"]),
        "n_layer": st.integers(1, 3),
        "n_head": st.sampled_from([1, 2, 4]),
        "kv_group": st.sampled_from([1, 2]),
        "head_dim": st.sampled_from([8, 16]),
        "n_embd": st.sampled_from([16, 32]),
        "n_ff": st.sampled_from([16, 32]),
        "window": st.sampled_from([0, 3]),
        "q8_0": st.booleans(),
    }
)
overrides = st.lists(
    st.sampled_from(sorted(OVERRIDES)).flatmap(lambda k: st.tuples(st.just(k), OVERRIDES[k])), max_size=3
).map(dict)
poison = st.sampled_from([None, None, "nan_norm", "drop_tensor"])
case = st.tuples(shapes, overrides, poison)


def _spec(shape: dict):
    n_head_kv = max(1, shape["n_head"] // shape["kv_group"])
    dims = (shape["n_embd"], shape["n_ff"], shape["n_head"] * shape["head_dim"], n_head_kv * shape["head_dim"])
    q8 = shape["q8_0"] and all(d % 32 == 0 for d in dims)  # Q8_0 rows are whole 32-element blocks
    return small(
        arch=shape["arch"],
        n_layer=shape["n_layer"],
        n_head=shape["n_head"],
        n_head_kv=n_head_kv,
        head_dim=shape["head_dim"],
        n_embd=shape["n_embd"],
        n_ff=shape["n_ff"],
        window=shape["window"],
        wtype=8 if q8 else 0,
        n_ctx_train=64,
    )


def _write_case(root: Path, i: int, shape: dict, over: dict, bad: str | None) -> tuple[Path, str]:
    spec = _spec(shape)
    base = root / f"base{i}.gguf"
    write_model(base, spec)
    a = spec.arch
    meta = {f"{a}.{k}": v for k, v in over.items()}
    types = {f"{a}.{k}": VT.INT32 for k, v in over.items() if isinstance(v, int) and v < 0}
    kw: dict = {}
    if bad == "nan_norm":
        kw["nan_in"] = [f"blk.{spec.n_layer - 1}.ffn_norm.weight"]
    elif bad == "drop_tensor":
        kw["drop_tensors"] = [f"blk.{spec.n_layer - 1}.attn_v.weight"]
    path = rewrite(base, root / f"case{i}.gguf", meta=meta, types=types, **kw)
    return path, f"{spec} overrides={meta} poison={bad}"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def _run_batch(batch: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cases = [_write_case(Path(tmp), i, *c) for i, c in enumerate(batch)]
        env = dict(os.environ, **CHILD_ENV, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run(
            [sys.executable, str(RUNNER), *(str(p) for p, _ in cases)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            preexec_fn=_limit_memory,
        )
    lines = proc.stdout.splitlines()
    started = [int(x.split()[1]) for x in lines if x.startswith("START ")]
    if proc.returncode < 0:
        i = started[-1] if started else None
        what = cases[i][1] if i is not None else "start-up"
        raise AssertionError(f"the child died of signal {-proc.returncode} in case {i}: {what}\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, f"child exited {proc.returncode}\n{proc.stderr[-3000:]}"
    errors = [x for x in lines if x.startswith("ERROR ")]
    assert not errors, "\n".join(f"{x}\n  case: {cases[int(x.split()[1])][1]}" for x in errors)
    done = [x for x in lines if x.startswith(("OK ", "REFUSED "))]
    assert len(done) == len(cases), proc.stdout


KNOWN = [  # the crashers and 500s the review found, always in the first batch
    (
        dict(arch="llama", n_layer=2, n_head=4, kv_group=2, head_dim=16, n_embd=64, n_ff=32, window=0, q8_0=False),
        {"rope.dimension_count": 96},
        None,
    ),
    (
        dict(arch="gemma3", n_layer=2, n_head=2, kv_group=2, head_dim=16, n_embd=32, n_ff=32, window=3, q8_0=True),
        {"block_count": 10**8, "attention.key_length": 0},
        None,
    ),
    (
        dict(arch="qwen2", n_layer=1, n_head=2, kv_group=1, head_dim=8, n_embd=16, n_ff=16, window=0, q8_0=False),
        {"rope.dimension_count": 7, "attention.layer_norm_rms_epsilon": NAN},
        "nan_norm",
    ),
    (
        dict(arch="llama", n_layer=1, n_head=2, kv_group=1, head_dim=16, n_embd=32, n_ff=32, window=0, q8_0=True),
        {},
        None,
    ),  # a good one: it must generate
]


@pytest.mark.slow  # a fuzzer; the hostile values' named cases (test_model_validation.py) stay in the README's run
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(case, min_size=4, max_size=4))
@example(batch=KNOWN)
def test_no_hyperparameter_kills_the_process(batch):
    _run_batch(batch)
