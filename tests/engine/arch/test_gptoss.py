"""gpt-oss's configuration: llama.cpp's "gpt-oss" and Ollama's "gptoss" name one family (keys prefixed by the file's
name), its YaRN parameters as llama.cpp's context derives them, and bad metadata refused naming the key or tensor.
Its logits against llama.cpp are in test_arch_fixtures.py (fixtures.decoders case "gpt-oss")."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from fixtures import decoders
import gguf_io
from localrt.engine.config import config_from_metadata
from localrt.engine.loader import load_model
from localrt.errors import InvalidModel, MissingTensor

CASE = decoders.CASES["gpt-oss"]


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """(metadata, tensors) of the case's F32 file."""
    path = decoders.write(tmp_path_factory.mktemp("gptoss") / "m.gguf", CASE)
    with gguf_io.open(path) as f:
        yield dict(f.metadata), dict(f.tensors)


def test_gptoss_and_gpt_oss_files_load_the_same(tmp_path):
    ollama = dataclasses.replace(CASE, arch="gptoss")
    a = load_model(decoders.write(tmp_path / "a.gguf", CASE), num_ctx=CASE.n_ctx, num_gpu=0)
    b = load_model(decoders.write(tmp_path / "b.gguf", ollama), num_ctx=CASE.n_ctx, num_gpu=0)
    try:
        assert dataclasses.replace(b.config, arch="gpt-oss") == a.config
        assert np.array_equal(a.logits(decoders.IDS), b.logits(decoders.IDS))
    finally:
        a.close()
        b.close()


def test_config_is_llamacpps(gpt_oss):
    md, tensors = gpt_oss
    cfg = config_from_metadata(md, tensors)
    assert cfg.windows == (5, 0, 5, 0)  # pattern 2: even layers slide
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == (4, 2, 32)
    assert (cfg.expert_gating, cfg.expert_act, cfg.expert_weights_norm) == ("softmax_weight", "swiglu_oai", False)
    assert cfg.rope_freq_scale == cfg.rope_freq_scale_swa == 1 / 8 and cfg.rope_base_swa == cfg.rope_base
    n_ctx_orig, ext, attn, fast, slow = cfg.rope_yarn
    assert (n_ctx_orig, ext, fast, slow) == (64, 1.0, 32.0, 1.0)
    assert attn == pytest.approx(1.0, abs=1e-6)  # mscale(8) / (1 + 0.1 ln 8): ggml's rope_yarn applies it
    assert cfg.attn_scale == pytest.approx(1 / math.sqrt(64))
    half = config_from_metadata({**md, "gpt-oss.rope.scaling.attn_factor": 0.5}, tensors)
    assert half.rope_yarn[2] == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize(
    "window, message",
    [
        (0, "sliding_window is 0; it must be at least 1"),
        (-3, "sliding_window is -3; it must be at least 1"),
        (None, "no metadata key 'gpt-oss.attention.sliding_window'"),
    ],
)
def test_sliding_window_must_be_there_and_positive(gpt_oss, window, message):
    md, tensors = gpt_oss
    md = {k: v for k, v in md.items() if k != "gpt-oss.attention.sliding_window"}
    if window is not None:
        md["gpt-oss.attention.sliding_window"] = window
    with pytest.raises(InvalidModel, match=message):
        config_from_metadata(md, tensors)


def test_sinks_of_the_wrong_shape_name_the_tensor_and_the_key(gpt_oss):
    md, tensors = gpt_oss
    bad = {**tensors, "blk.1.attn_sinks.weight": SimpleNamespace(shape=(CASE.n_head + 1,), ggml_type=0)}
    with pytest.raises(InvalidModel, match=r"blk\.1\.attn_sinks\.weight.*gpt-oss\.attention\.head_count is 4"):
        config_from_metadata(md, bad)
    with pytest.raises(MissingTensor, match="blk.0.attn_sinks.weight"):
        config_from_metadata(md, {k: v for k, v in tensors.items() if k != "blk.0.attn_sinks.weight"})


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("expert_count", 5, r"ffn_gate_inp\.weight.*gpt-oss\.expert_count is 5"),
        ("expert_used_count", 5, r"gpt-oss\.expert_used_count is 5; it must be at least 1 and at most 4"),
        ("expert_feed_forward_length", 16, r"gpt-oss\.expert_feed_forward_length is 16"),
    ],
)
def test_expert_counts_contradicting_the_tensors_are_refused_by_key(gpt_oss, key, value, match):
    md, tensors = gpt_oss
    with pytest.raises(InvalidModel, match=match):
        config_from_metadata({**md, f"gpt-oss.{key}": value}, tensors)


def test_an_expert_bias_of_the_wrong_shape_is_refused(gpt_oss):
    md, tensors = gpt_oss
    bad = {**tensors, "blk.2.ffn_down_exps.bias": SimpleNamespace(shape=(4, 32), ggml_type=0)}
    with pytest.raises(InvalidModel, match=r"blk\.2\.ffn_down_exps\.bias.*gpt-oss\.embedding_length is 64"):
        config_from_metadata(md, bad)


def test_the_output_matrix_is_required(gpt_oss):
    md, tensors = gpt_oss
    with pytest.raises(MissingTensor, match="output.weight"):
        config_from_metadata(md, {k: v for k, v in tensors.items() if k != "output.weight"})


def test_both_moe_paths_apply_the_biases_alike_on_mxfp4_experts(tmp_path, monkeypatch):
    """Six tokens through the fused pairs call (MXFP4 has an experts kernel) and grouped by expert: the same bits,
    biases and swiglu_oai included, so decode (pairs) and prompt (grouped) rows compute alike."""
    from localrt.engine.arch import moe

    model = load_model(decoders.write(tmp_path / "mxfp4.gguf", CASE, decoders.MXFP4), num_ctx=64, num_gpu=0)
    try:
        L = model.weights.layers[1]
        assert L.ffn_up_exps.stacked.ggml_type == decoders.MXFP4
        m = np.ascontiguousarray(
            model.backend.embed(model.weights.token_embd, np.array(decoders.IDS[:6]))
        )  # (6, n_embd)
        monkeypatch.setattr(moe, "PAIRS_MAX_TOKENS", 8)
        fused = moe.moe_ffn(model.backend, model.config, L, m)
        monkeypatch.setattr(moe, "PAIRS_MAX_TOKENS", 0)
        grouped = moe.moe_ffn(model.backend, model.config, L, m)
        np.testing.assert_array_equal(fused, grouped)
        no_bias = dataclasses.replace(L, ffn_down_exps_bias=None)
        assert not np.array_equal(moe.moe_ffn(model.backend, model.config, no_bias, m), grouped)
    finally:
        model.close()
