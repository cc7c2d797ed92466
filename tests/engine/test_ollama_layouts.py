"""Files in the layout Ollama's converter wrote before 2026 (tests/_ollama_files.py) run exactly as the same weights in
llama.cpp's layout: gpt-oss as `gptoss` (other tensor names, no expert width, YaRN unnamed), EmbeddingGemma as
`gemma3` with dense.0/dense.1, and gemma3 with its rope bases under rope.global/local, no eps and a longer
vocabulary than its embedding. The llama.cpp-layout files are the
ones checked against llama.cpp in test_arch_fixtures.py and test_gemma_embedding.py."""

from __future__ import annotations

import dataclasses

import _ollama_files
from fixtures import decoders
from fixtures import encoders
import numpy as np
import pytest
from _hostile_gguf import rewrite

import gguf_io
from localrt.engine.compat import ollama_layout
from localrt.engine.loader import load_model
from localrt.errors import InvalidModel
from localrt.models.gguf_facts import gguf_facts
from localrt.runtime.loading import read_config


def _load(path, **kw):
    return load_model(path, num_gpu=0, **kw)


def test_ollamas_gptoss_file_gives_llamacpps_logits(tmp_path):
    case = decoders.CASES["gpt-oss"]
    src = decoders.write(tmp_path / "llamacpp.gguf", case)
    dst = _ollama_files.gptoss(src, tmp_path / "ollama.gguf")
    with gguf_io.open(dst) as f:
        assert "blk.0.attn_out.weight" in f.tensors and "blk.0.attn_sinks" in f.tensors
        assert "blk.0.ffn_norm.weight" in f.tensors and "gptoss.rope.scaling.type" not in f.metadata
    a, b = _load(src, num_ctx=case.n_ctx), _load(dst, num_ctx=case.n_ctx)
    try:
        assert dataclasses.replace(b.config, arch="gpt-oss") == a.config  # expert width and YaRN recovered
        assert np.array_equal(a.logits(decoders.IDS), b.logits(decoders.IDS))
    finally:
        a.close()
        b.close()
    cfg, _ = read_config(dst)  # the daemon's memory estimate reads the same layout
    assert dataclasses.replace(cfg, arch="gpt-oss") == read_config(src)[0]


def test_ollamas_embeddinggemma_file_gives_llamacpps_embeddings(tmp_path):
    src = encoders.write_gemma(tmp_path / "llamacpp.gguf", dense=True)
    dst = _ollama_files.embeddinggemma(src, tmp_path / "ollama.gguf")
    with gguf_io.open(dst) as f:
        assert f.metadata["general.architecture"] == "gemma3" and "dense.0.weight" in f.tensors
    ref = np.load(encoders.DATA / "gemma_f32_dense.npz")
    a, b = _load(src, tokenizer=False), _load(dst, tokenizer=False)
    try:
        assert b.config.arch == "gemma-embedding" and len(b.weights.dense) == 2
        assert b.config == a.config
        for key in ("", "long_"):
            assert np.array_equal(a.embed(ref[key + "ids"]), b.embed(ref[key + "ids"]))
    finally:
        a.close()
        b.close()


def test_ollamas_gemma3_file_gives_llamacpps_logits(tmp_path):
    src = rewrite(
        decoders.write(tmp_path / "g.gguf", decoders.CASES["gemma3"]),
        tmp_path / "llamacpp.gguf",
        meta={"gemma3.rope.freq_base_swa": 5000.0},
    )
    dst = _ollama_files.gemma3(src, tmp_path / "ollama.gguf", extra_tokens=3)
    with gguf_io.open(dst) as f:
        assert "gemma3.rope.freq_base" not in f.metadata and f.metadata["gemma3.rope.global.freq_base"] == 1e6
        assert "gemma3.attention.layer_norm_rms_epsilon" not in f.metadata
        assert len(f.metadata["tokenizer.ggml.tokens"]) == f.tensors["token_embd.weight"].shape[0] + 3
    a, b = _load(src, num_ctx=256), _load(dst, num_ctx=256)
    try:
        assert b.config == a.config and (b.config.rope_base, b.config.rope_base_swa) == (1e6, 5000)
        assert np.array_equal(a.logits(decoders.IDS), b.logits(decoders.IDS))
        assert b.tokenizer.encode("hello world") == a.tokenizer.encode("hello world")
    finally:
        a.close()
        b.close()


def test_ollamas_gemma3_defaults_are_gemma3s_own():
    md = {"general.architecture": "gemma3", "gemma3.context_length": 131072, "gemma3.mm.tokens_per_image": 256}
    out, _ = ollama_layout(md, {})
    assert out["gemma3.attention.layer_norm_rms_epsilon"] == np.float32(1e-6)
    assert (out["gemma3.rope.freq_base"], out["gemma3.rope.freq_base_swa"]) == (1e6, 1e4)
    assert (out["gemma3.rope.scaling.type"], out["gemma3.rope.scaling.factor"]) == ("linear", 8.0)
    assert md == {
        "general.architecture": "gemma3",
        "gemma3.context_length": 131072,
        "gemma3.mm.tokens_per_image": 256,
    }  # the file's own mapping is not changed
    llamacpp = {
        "general.architecture": "gemma3",
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.context_length": 131072,
    }  # no quirk: llama.cpp's layout, left as it is
    assert ollama_layout(llamacpp, {})[0] is llamacpp
    assert ollama_layout({"general.architecture": "gptoss"}, {})[0]["tokenizer.ggml.pre"] == "gpt-4o"


def test_the_validation_on_create_reads_the_same_layouts(tmp_path):
    gpt = _ollama_files.gptoss(decoders.write(tmp_path / "g.gguf", decoders.CASES["gpt-oss"]), tmp_path / "o.gguf")
    emb = _ollama_files.embeddinggemma(encoders.write_gemma(tmp_path / "e.gguf", dense=True), tmp_path / "oe.gguf")
    for path in (gpt, emb):
        assert gguf_facts(path, scan=True)["invalid"] is None


def test_a_tensor_under_both_names_is_refused(tmp_path):
    src = decoders.write(tmp_path / "g.gguf", decoders.CASES["gpt-oss"])
    dst = _ollama_files.gptoss(src, tmp_path / "ollama.gguf")
    both = rewrite(dst, tmp_path / "both.gguf", add_tensors={"blk.0.attn_output.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(
        InvalidModel,
        match="both blk.0.attn_out.weight and blk.0.attn_output.weight|"
        "both blk.0.attn_output.weight and blk.0.attn_out.weight",
    ):
        _load(both, num_ctx=64)
    assert isinstance(gguf_facts(both)["invalid"], InvalidModel)
