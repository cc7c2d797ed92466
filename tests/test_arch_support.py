"""The architectures beyond llama/qwen2/gemma3 through the rest of the runtime: `show` facts, the memory estimate,
`create --quantize`, and the config rules read from their metadata (llama.cpp's defaults, refusals by name)."""
from __future__ import annotations

import numpy as np
import pytest

import archgen
from localrt.engine.config import config_from_metadata
from localrt.engine.loader import load_model
from localrt.errors import InvalidModel, MissingTensor
from localrt.models.gguf_facts import config_from_gguf, gguf_facts, human_number
from localrt.models.quantize import quantize_model
from localrt.runtime.service import estimate_memory

NEW = ["llama3_rope", "qwen3", "phi3", "phi3_short", "gemma2", "qwen3moe"]


@pytest.mark.parametrize("name", NEW)
def test_show_facts_and_memory_estimate(tmp_path, name):
    case = archgen.CASES[name]
    path = archgen.write(tmp_path / "m.gguf", case, archgen.Q8_0)
    facts = gguf_facts(path)
    assert facts["invalid"] is None
    shown = config_from_gguf(facts)
    n_params = sum(a.size for a in archgen.weights(case).values())
    assert (shown["model_family"], shown["model_type"], shown["file_type"]) == (case.arch, human_number(n_params), "Q8_0")
    need = estimate_memory(path, num_ctx=case.n_ctx, num_batch=64)
    kv = case.n_layer * case.n_ctx * case.n_head_kv * 2 * case.head_dim * 2  # f16 K and V, full-context layers
    assert need.private >= kv if not case.window else need.private > 0
    assert 0 < need.mapped <= path.stat().st_size  # the tensors' bytes, viewed in the mmap


@pytest.mark.parametrize("name", NEW)
def test_create_quantize_q8_0_is_the_same_model_as_the_fixture(tmp_path, name):
    """quantize_model's Q8_0 of the F32 file computes exactly what archgen's own Q8_0 file does."""
    case = archgen.CASES[name]
    src = archgen.write(tmp_path / "f32.gguf", case, archgen.F32)
    dst = tmp_path / "q8_0.gguf"
    for _ in quantize_model(src, dst, "q8_0"):
        pass
    ours = load_model(dst, num_ctx=case.n_ctx, num_gpu=0)
    ref = load_model(archgen.write(tmp_path / "ref.gguf", case, archgen.Q8_0), num_ctx=case.n_ctx, num_gpu=0)
    try:
        np.testing.assert_array_equal(ours.logits(archgen.IDS), ref.logits(archgen.IDS))
    finally:
        ours.close()
        ref.close()


@pytest.mark.parametrize("name", ["phi3", "gemma2", "qwen3moe"])
def test_create_quantize_q4_k_m_runs(tmp_path, name):
    case = archgen.CASES[name]
    src = archgen.write(tmp_path / "f32.gguf", case, archgen.F32)
    dst = tmp_path / "q4km.gguf"
    for _ in quantize_model(src, dst, "q4_K_M"):
        pass
    assert gguf_facts(dst)["invalid"] is None
    m = load_model(dst, num_ctx=case.n_ctx, num_gpu=0)
    try:
        logits = m.logits(archgen.IDS)
    finally:
        m.close()
    with np.load(archgen.DATA / f"{name}.npz") as z:
        ref = z["f32"].astype(np.float32)
    assert np.isfinite(logits).all()
    assert (logits.argmax(1) == ref.argmax(1)).mean() >= 0.5  # 4-bit weights on a 64-wide model: most top-1s hold


def _md(arch: str, **keys) -> dict:
    md = {"general.architecture": arch, f"{arch}.embedding_length": 64, f"{arch}.block_count": 4,
          f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2, f"{arch}.feed_forward_length": 128,
          f"{arch}.vocab_size": 512}
    md.update({f"{arch}.{k}": v for k, v in keys.items()})
    return md


def test_gemma2_defaults_are_llamacpps():
    cfg = config_from_metadata(_md("gemma2"))
    assert (cfg.attn_softcap, cfg.final_logit_softcap) == (50.0, 30.0)
    assert cfg.windows == (4096, 0, 4096, 0)  # n_swa 4096, pattern 2: even layers local
    assert cfg.rope_base_swa == cfg.rope_base and cfg.rope_freq_scale_swa == cfg.rope_freq_scale
    assert cfg.attn_scale == 1 / 4 and cfg.embed_scale == pytest.approx(8.0)
    cfg = config_from_metadata(_md("gemma2", **{"attention.sliding_window_pattern": 0, "rope.freq_base_swa": 500.0}))
    assert cfg.windows == (4096,) * 4 and cfg.rope_base_swa == 500.0  # pattern 0: every layer local (set_swa_pattern)
    with pytest.raises(InvalidModel, match="gemma2.final_logit_softcapping"):
        config_from_metadata(_md("gemma2", final_logit_softcapping=0.0))  # gemma2 divides by it


def test_rope_scaling_types(tmp_path):
    import gguf_io

    llama3 = {"llama.rope.scaling.type": "llama3", "llama.rope.scaling.factor": 8.0}  # the factors are rope_freqs'
    with gguf_io.open(archgen.write(tmp_path / "a.gguf", archgen.CASES["llama3_rope"])) as f:
        assert config_from_metadata({**f.metadata, **llama3}, f.tensors).rope_freq_scale == 1.0
    with gguf_io.open(archgen.write(tmp_path / "b.gguf", archgen.CASES["llama"])) as f:
        with pytest.raises(InvalidModel, match="rope_freqs.weight"):
            config_from_metadata({**f.metadata, **llama3}, f.tensors)
    with pytest.raises(InvalidModel, match="'longrope'"):
        config_from_metadata(_md("llama", **{"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0}))
    with pytest.raises(InvalidModel, match="'yarn'"):
        config_from_metadata(_md("qwen3", **{"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}))
    assert config_from_metadata(_md("phi3", **{"rope.scaling.type": "longrope"})).rope_freq_scale == 1.0
    assert config_from_metadata(_md("llama", **{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0})).rope_freq_scale == 0.25


def test_partial_rotary_only_where_llamacpp_has_it():
    assert config_from_metadata(_md("phi3", **{"rope.dimension_count": 12})).n_rot == 12
    for arch in ("llama", "qwen3", "gemma2"):
        with pytest.raises(InvalidModel, match="rotates the whole head"):
            config_from_metadata(_md(arch, **{"rope.dimension_count": 12}))


def test_phi3_needs_fused_or_separate_attention(tmp_path):
    import gguf_io

    path = archgen.write(tmp_path / "m.gguf", archgen.CASES["phi3"])
    with gguf_io.open(path) as f:
        tensors = {k: v for k, v in f.tensors.items() if k != "blk.1.attn_qkv.weight"}
        with pytest.raises(MissingTensor, match="blk.1.attn_qkv.weight"):
            config_from_metadata(f.metadata, tensors)


def test_longrope_factors_must_be_positive(tmp_path):
    import gguf_io

    path = archgen.write(tmp_path / "m.gguf", archgen.CASES["phi3_short"])
    with gguf_io.open(path) as f:
        bad = f.tensors["rope_factors_long.weight"]
        zeros = type("T", (), {"shape": bad.shape, "ggml_type": 0, "data": np.zeros(bad.data.nbytes, np.uint8)})()
        with pytest.raises(InvalidModel, match="rope_factors_long.weight"):
            config_from_metadata(f.metadata, {**f.tensors, "rope_factors_long.weight": zeros})
