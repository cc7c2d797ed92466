"""The nomic-bert encoder (nomic-embed-text v1 / v1.5) against llama.cpp: the tiny random nomic-bert of fixtures.encoders at
F32, F16 and Q8_0 (fused attn_qkv, no biases, as nomic's files) and at F32 with separate q/k/v and every optional
bias; every token's hidden state and the mean pooling, of a short and a 48-token input. References:
tests/data/bert/nomic_*.npz, written by `bench/make_bert_reference.py nomic`."""

from __future__ import annotations

from fixtures import encoders
import numpy as np
import pytest

import gguf_io
from localrt.engine.encoder import Encoder
from localrt.engine.loader import load_model
from localrt.errors import (
    ContextLengthExceeded,
    InvalidModel,
    InvalidRequest,
    MissingTensor,
)

# label -> (wtype, write_nomic keywords, tolerance): test_bert's tolerances per type
CASES = {
    "f32": (encoders.F32, {}, 2e-4),
    "f16": (encoders.F16, {}, 2e-3),
    "q8_0": (encoders.Q8_0, {}, 2e-2),
    "f32_split_bias": (encoders.F32, {"fused": False, "biases": True}, 2e-4),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = load_model(encoders.write_nomic(tmp_path_factory.mktemp("nomic") / "m.gguf"), tokenizer=False)
    yield model
    model.close()


@pytest.mark.parametrize("label", CASES)
def test_tiny_nomic_bert_matches_llamacpp_token_by_token(tmp_path, label):
    wtype, kw, tol = CASES[label]
    ref = np.load(encoders.DATA / f"nomic_{label}.npz")
    model = load_model(encoders.write_nomic(tmp_path / "m.gguf", wtype, **kw), tokenizer=False)
    try:
        assert isinstance(model, Encoder) and not hasattr(model, "cache") and model.pooling == "mean"
        for key in ("", "long_"):
            hidden = model.hidden(ref[key + "ids"])  # (n_tok, n_embd)
            # LayerNorm output: values of order 1; llama.cpp quantizes activations for Q8_0 as we do not
            assert np.abs(hidden - ref[key + "tokens"]).max() < tol * 10
            for i in range(len(hidden)):
                assert encoders.cosine(hidden[i], ref[key + "tokens"][i]) > 1 - tol
            assert encoders.cosine(model.embed(ref[key + "ids"]), ref[key + "mean"]) > 1 - tol
    finally:
        model.close()


def test_the_config_reads_nomics_keys(tiny):
    cfg = tiny.config
    assert cfg.encoder and cfg.rope_base == encoders.NOMIC_ROPE_BASE and cfg.n_rot == cfg.head_dim == 16
    assert cfg.n_ctx_train == encoders.NOMIC_CTX and tiny.num_ctx == encoders.NOMIC_CTX  # capped by the trained context


def test_positions_come_from_rope(tiny):
    """Without a position embedding, only the rotation tells the order: swapping two tokens changes the others'
    states, and changing the last token changes the first one's (the attention is not causal)."""
    a, b = tiny.hidden([2, 17, 44, 3]), tiny.hidden([2, 44, 17, 3])
    assert np.abs(a[0] - b[0]).max() > 1e-3
    c = tiny.hidden([2, 17, 44, 5])
    assert np.abs(a[0] - c[0]).max() > 1e-3


def test_an_input_longer_than_the_trained_context_is_refused(tiny):
    with pytest.raises(ContextLengthExceeded):
        tiny.embed([5] * (encoders.NOMIC_CTX + 1))
    with pytest.raises(InvalidRequest):
        tiny.embed([len(encoders.VOCAB)])
    with pytest.raises(InvalidRequest):
        tiny.generate([2, 3])


def test_inputs_embedded_together_equal_each_alone(tmp_path):
    """embed_many runs several inputs in one forward: each is rotated from position 0 and attends within itself."""
    model = load_model(encoders.write_nomic(tmp_path / "m.gguf"), tokenizer=False, num_batch=24)
    try:
        inputs = [[2, 5, 3], [2, 17, 44, 5, 99, 63, 3], [2] + list(range(5, 35)) + [3], [2, 9, 3]]
        for ids, got in zip(inputs, model.embed_many(inputs)):
            np.testing.assert_allclose(got, model.embed(ids), rtol=1e-5, atol=1e-5)
    finally:
        model.close()


def _rewrite(src, dst, *, drop=(), md_update=None, md_drop=(), replace=None):
    """src rewritten to dst without the tensors `drop` and keys `md_drop`, with `md_update` and the F32 tensors
    `replace` (name -> array)."""
    with gguf_io.open(src) as f:
        md = {k: v for k, v in f.metadata.items() if not k.startswith("GGUF.") and k not in md_drop}
        md.update(md_update or {})
        tensors = [(n, t.ggml_type, t.shape, np.array(t.data)) for n, t in f.tensors.items() if n not in drop]
    tensors = [
        (n, encoders.F32, replace[n].shape, replace[n]) if n in (replace or {}) else (n, *rest) for n, *rest in tensors
    ]
    gguf_io.write(dst, md, tensors)
    return dst


_E, _QKV0 = encoders.N_EMBD, "blk.0.attn_qkv.weight"


@pytest.mark.parametrize(
    "change, error, named",
    [
        ({"replace": {_QKV0: np.zeros((2 * _E, _E), np.float32)}}, InvalidModel, "attn_qkv"),  # q and k rows, no v
        ({"md_drop": ("nomic-bert.rope.freq_base",)}, InvalidModel, "nomic-bert.rope.freq_base"),
        ({"md_update": {"nomic-bert.rope.freq_base": float("nan")}}, InvalidModel, "nomic-bert.rope.freq_base"),
        ({"md_update": {"nomic-bert.rope.dimension_count": 8}}, InvalidModel, "rope.dimension_count"),  # whole heads
        ({"drop": (_QKV0,)}, MissingTensor, "attn_qkv"),  # neither fused nor separate q/k/v
        ({"drop": ("blk.1.ffn_gate.weight",)}, MissingTensor, "blk.1.ffn_gate.weight"),
        ({"md_update": {"tokenizer.ggml.token_type_count": 0}}, InvalidModel, "token_type_count"),
        ({"md_drop": ("nomic-bert.attention.layer_norm_epsilon",)}, InvalidModel, "layer_norm_epsilon"),
    ],
)
def test_a_hostile_nomic_file_is_refused_by_name(tmp_path, change, error, named):
    path = _rewrite(encoders.write_nomic(tmp_path / "m.gguf"), tmp_path / "bad.gguf", **change)
    with pytest.raises(error, match=named):
        load_model(path, tokenizer=False)
