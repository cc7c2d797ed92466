"""qwen3moe beyond the oracle fixture (tests/engine/arch/test_arch_fixtures.py): its metadata validated against the
stacked expert tensors, experts viewed in place, only the routed experts read, and a token's result independent of
its batch."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fixtures import decoders
import gguf_io
from localrt.engine.arch import moe
from localrt.engine.config import config_from_metadata
from localrt.engine.loader import load_model
from localrt.errors import InvalidModel

CASE = decoders.CASES["qwen3moe"]


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    return decoders.write(tmp_path_factory.mktemp("moe") / "m.gguf", CASE, decoders.Q8_0)


def _config(path, **keys):
    """config_from_metadata of the file with `qwen3moe.<suffix>` keys replaced (None: removed)."""
    with gguf_io.open(path) as f:
        md = dict(f.metadata)
        for suffix, value in keys.items():
            md.pop(f"qwen3moe.{suffix}", None)
            if value is not None:
                md[f"qwen3moe.{suffix}"] = value
        return config_from_metadata(md, f.tensors)


def test_config_reads_the_expert_keys(moe_file):
    cfg = _config(moe_file)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.expert_weights_norm) == (8, 2, 32, True)
    # llama.cpp's default width: feed_forward_length / expert_used_count (128 / 4 = 32 matches the tensors)
    assert _config(moe_file, expert_feed_forward_length=None, expert_used_count=4).n_ff_exp == 32


@pytest.mark.parametrize(
    "keys, message",
    [
        (dict(expert_count=None), "no metadata key 'qwen3moe.expert_count'"),
        (dict(expert_count=0), "qwen3moe.expert_count is 0; it must be at least 1"),
        (dict(expert_used_count=None), "no metadata key 'qwen3moe.expert_used_count'"),
        (dict(expert_used_count=0), "qwen3moe.expert_used_count is 0; it must be at least 1 and at most 8"),
        (dict(expert_used_count=9), "qwen3moe.expert_used_count is 9; it must be at least 1 and at most 8"),
        (dict(expert_used_count=[2, 2, 3]), "qwen3moe.expert_used_count varies per layer"),
        (dict(expert_group_count=4), "qwen3moe.expert_group_count is 4: grouped expert selection is not supported"),
        # the metadata against the 3-D tensors' shapes, naming the tensor and the key
        (
            dict(expert_count=4),
            "'blk.0.ffn_gate_inp.weight' has shape (8, 64) but the metadata gives (4, 64) (qwen3moe.expert_count is 4)",
        ),
        (
            dict(expert_feed_forward_length=16),
            "'blk.0.ffn_gate_exps.weight' has shape (8, 32, 64) but the metadata "
            "gives (8, 16, 64) (qwen3moe.expert_feed_forward_length is 16)",
        ),
        (
            dict(expert_feed_forward_length=None, feed_forward_length=1, expert_used_count=2),
            "no qwen3moe.expert_feed_forward_length and qwen3moe.feed_forward_length",
        ),
    ],
)
def test_bad_expert_metadata_is_refused_by_name(moe_file, keys, message):
    with pytest.raises(InvalidModel, match=re.escape(message)):
        _config(moe_file, **keys)


def test_a_dense_family_claiming_experts_is_refused(tmp_path):
    path = decoders.write(tmp_path / "q.gguf", decoders.CASES["qwen3"])
    with gguf_io.open(path) as f:
        with pytest.raises(InvalidModel, match="qwen3.expert_count is 8: qwen3 has no mixture-of-experts layers"):
            config_from_metadata({**f.metadata, "qwen3.expert_count": 8, "qwen3.expert_used_count": 2}, f.tensors)


def test_a_3d_tensor_of_the_wrong_rank_or_type_is_refused(moe_file):
    with gguf_io.open(moe_file) as f:
        t = f.tensors["blk.2.ffn_down_exps.weight"]
        flat = type("T", (), {"shape": (8 * 64, 32), "ggml_type": t.ggml_type, "data": t.data})()
        with pytest.raises(InvalidModel, match=re.escape("'blk.2.ffn_down_exps.weight' has shape (512, 32)")):
            config_from_metadata(f.metadata, {**f.tensors, "blk.2.ffn_down_exps.weight": flat})
        odd = type("T", (), {"shape": t.shape, "ggml_type": 37, "data": t.data})()  # TQ2_0: no kernel reads it
        with pytest.raises(InvalidModel, match="'blk.2.ffn_down_exps.weight' has ggml type 37"):
            config_from_metadata(f.metadata, {**f.tensors, "blk.2.ffn_down_exps.weight": odd})


def test_each_expert_is_a_view_of_its_rows_in_the_mmap(moe_file):
    model = load_model(moe_file, num_ctx=64, num_gpu=0)
    try:
        stacked = model._source.tensors["blk.1.ffn_down_exps.weight"].data  # (8 * 64, row bytes)
        views = model.weights.layers[1].ffn_down_exps
        assert len(views) == 8 and all(v.shape == (64, 32) for v in views)
        for e, v in enumerate(views):
            assert v.data.base is not None and np.shares_memory(v.data, stacked)
            assert v.data.ctypes.data == stacked.ctypes.data + e * 64 * stacked.strides[0]
    finally:
        model.close()


class _Recording:
    """The model's backend, recording the name of every weight a product reads."""

    def __init__(self, inner) -> None:
        self.inner, self.read = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def linear(self, w, x, out=None, **kw):
        self.read.append(w.name)
        return self.inner.linear(w, x, out, **kw)

    def linear_experts(self, w, rows, x, experts, xrow):
        self.read += [f"{w.name}[{e}]" for e in experts]  # the stacked tensor: the experts whose rows it reads
        return self.inner.linear_experts(w, rows, x, experts, xrow)

    def linear_grouped(self, ws, rows, x, experts, starts):
        self.read += [f"{w.name}[{e}]" for w in ws for e in experts]
        return self.inner.linear_grouped(ws, rows, x, experts, starts)


@pytest.mark.parametrize(
    "path", ["sorted", "pairs", "grouped"], ids=["sorted by expert", "one call per weight", "grouped by expert"]
)
def test_a_token_reads_only_its_routed_experts(moe_file, monkeypatch, path):
    monkeypatch.setattr(moe, "SORTED_CALLS", path == "sorted")
    monkeypatch.setattr(moe, "PAIRS_MAX_TOKENS", 8 if path == "pairs" else 0)
    model = load_model(moe_file, num_ctx=64, num_gpu=0)
    try:
        L = model.weights.layers[0]
        h = np.ascontiguousarray(model.backend.embed(model.weights.token_embd, np.array([411])))  # (1, n_embd)
        chosen, weights = moe.route(model.backend, model.config, L, h)
        assert chosen.shape == (1, 2) and weights.sum() == pytest.approx(1.0, abs=1e-6)
        rec = _Recording(model.backend)
        moe.moe_ffn(rec, model.config, L, h)
        if path == "sorted":  # gate and up in one call, then down; each over the chosen experts in ascending order
            want = [f"blk.0.ffn_{k}_exps.weight[{e}]" for k in ("gate", "up", "down") for e in sorted(chosen[0])]
        elif path == "pairs":  # rank order, each weight once for both
            want = [f"blk.0.ffn_{k}_exps.weight[{e}]" for k in ("gate", "up", "down") for e in chosen[0]]
        else:
            want = [f"blk.0.ffn_{k}_exps.weight[{e}]" for e in sorted(chosen[0]) for k in ("gate", "up", "down")]
        assert rec.read == ["blk.0.ffn_gate_inp.weight"] + want
    finally:
        model.close()


def test_every_path_computes_the_same_bits(moe_file, monkeypatch):
    """Six tokens' MoE FFN sorted by expert, through the fused pairs call and grouped by expert: identical outputs,
    so where the batch size or the backend switches paths a token's result does not move."""
    model = load_model(moe_file, num_ctx=64, num_gpu=0)
    try:
        L = model.weights.layers[1]
        m = np.ascontiguousarray(
            model.backend.embed(model.weights.token_embd, np.array(decoders.IDS[:6]))
        )  # (6, n_embd)
        by_sort = moe.moe_ffn(model.backend, model.config, L, m)
        monkeypatch.setattr(moe, "SORTED_CALLS", False)
        monkeypatch.setattr(moe, "PAIRS_MAX_TOKENS", 8)
        fused = moe.moe_ffn(model.backend, model.config, L, m)
        monkeypatch.setattr(moe, "PAIRS_MAX_TOKENS", 0)
        grouped = moe.moe_ffn(model.backend, model.config, L, m)
        np.testing.assert_array_equal(fused, grouped)
        np.testing.assert_array_equal(by_sort, grouped)
    finally:
        model.close()


def test_a_tokens_logits_do_not_depend_on_its_batch(moe_file):
    """Slot 0's 8 tokens alone, then beside slot 1's 8 others (which route to other experts in other groups):
    bit for bit the same logits."""
    model = load_model(moe_file, num_ctx=64, n_slots=2, num_gpu=0)
    try:
        a, b = decoders.IDS[:8], decoders.IDS[8:]
        model.cache.clear(0)
        alone = model.forward(model.batch(a, 0, 0), model.cache)
        model.cache.clear(0)
        model.cache.clear(1)
        both = model.batch(a + b, 0, 0)
        both = type(both)(
            tokens=both.tokens,
            positions=np.r_[np.arange(8), np.arange(len(b))],
            slots=np.r_[np.zeros(8, np.int64), np.ones(len(b), np.int64)],
        )
        together = model.forward(both, model.cache)
        np.testing.assert_array_equal(together[:8], alone)
    finally:
        model.close()


def test_mixture_of_experts_layers_stay_on_the_cpu(moe_file):
    from localrt.engine.backends.offload import offload

    model = load_model(moe_file, num_ctx=64, num_gpu=0)
    try:
        model.weights.devices = []
        for num_gpu in (-1, 99):
            plan = offload(
                model,
                num_gpu,
                probe=lambda _gpu: pytest.fail("a GPU was probed for a MoE model"),
                make_device=lambda _gpu: pytest.fail("a device was made for a MoE model"),
            )
            model.weights.devices = []
        assert plan.gpu_layers == () and not plan.output and "mixture-of-experts" in plan.reason
    finally:
        model.close()


# One format in the README's run; the others compile a kernel of their own (5-20 s cold, which nothing else in the
# README's run needs): the slow set, which CI runs.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "ggml_type",
    [
        pytest.param(8, id="Q8_0"),
        pytest.param(12, id="Q4_K", marks=SLOW),
        pytest.param(14, id="Q6_K", marks=SLOW),
        pytest.param(23, id="IQ4_XS", marks=SLOW),
    ],
)
def test_the_experts_kernel_is_the_matmul_kernel_per_pair(ggml_type):
    """simd_kernels.EXPERTS against MUL on each expert's rows: bit for bit, whether MUL ran the token alone (one-token
    row dots) or among 5 (4-token row dots), so a pair computes as that token would in any batch."""
    import quant
    import simd_kernels

    rng = np.random.default_rng(ggml_type)
    n_expert, rows, cols = 4, 8, 256
    w = quant.quantize(rng.standard_normal((n_expert * rows, cols)).astype(np.float32), ggml_type)  # (32, row bytes)
    x = rng.standard_normal((5, cols)).astype(np.float32)  # (n_x, cols)
    experts = np.array([3, 0, 3, 1, 2, 0, 1], np.int64)  # (n_pair,)
    xrow = np.array([0, 0, 1, 4, 2, 3, 4], np.int64)  # (n_pair,)
    out = np.empty((len(experts), rows), np.float32)  # (n_pair, rows)
    simd_kernels.EXPERTS[ggml_type](w, rows, x, experts, xrow, out)
    for p, (e, t) in enumerate(zip(experts, xrow)):
        w_e = w[e * rows : (e + 1) * rows]
        alone, among = np.empty((1, rows), np.float32), np.empty((5, rows), np.float32)
        simd_kernels.MUL[ggml_type](w_e, np.ascontiguousarray(x[t : t + 1]), alone)
        simd_kernels.MUL[ggml_type](w_e, x, among)
        np.testing.assert_array_equal(out[p], alone[0])
        np.testing.assert_array_equal(out[p], among[t])


@pytest.mark.parametrize("ggml_type", [8, 12, 23, 39], ids=["Q8_0", "Q4_K", "IQ4_XS", "MXFP4"])  # the fixtures.decoders
# fixtures' formats: their models compile these kernels in the README's run anyway
def test_the_grouped_kernel_is_the_one_token_kernel(ggml_type):
    """simd_kernels.GROUPED (a prompt's pairs sorted by expert: groups of 1 to 11 rows of x, so 8-token passes and
    every tail) against MUL on each expert's rows for the token alone: bit for bit, for both weights of a call and
    for one weight alone."""
    import quant
    import simd_kernels

    rng = np.random.default_rng(ggml_type)
    n_expert, rows, cols = 4, 8, 256
    ws = [
        quant.quantize(rng.standard_normal((n_expert * rows, cols)).astype(np.float32), ggml_type) for _ in range(2)
    ]  # (32, row bytes) each
    x = rng.standard_normal((20, cols)).astype(np.float32)  # (n_x, cols)
    experts = np.array([0, 2, 3], np.int64)  # (n_groups,)
    starts = np.array([0, 1, 9, 20], np.int64)  # groups of 1, 8 and 11 rows
    outs = [np.full((20, rows), np.nan, np.float32) for _ in ws]  # (n_x, rows) each
    simd_kernels.GROUPED[ggml_type](ws[0], ws[1], rows, x, experts, starts, *outs)
    single = np.full((20, rows), np.nan, np.float32)
    simd_kernels.GROUPED[ggml_type](ws[1], ws[1][:0], rows, x, experts, starts, single, np.empty((20, 0), np.float32))
    np.testing.assert_array_equal(single, outs[1])
    for g, e in enumerate(experts):
        for t in range(starts[g], starts[g + 1]):
            for w, out in zip(ws, outs):
                alone = np.empty((1, rows), np.float32)
                simd_kernels.MUL[ggml_type](w[e * rows : (e + 1) * rows], np.ascontiguousarray(x[t : t + 1]), alone)
                np.testing.assert_array_equal(out[t], alone[0])
