"""The architectures beyond llama/qwen2/gemma3: `create --quantize q8_0` is the decoder builder's own Q8_0 model, and the config
rules read from their metadata (llama.cpp's defaults, refusals by name). `show`, the memory estimate, Q4_K_M/IQ4_XS
creates and the structured/tool paths of every case are in test_arch_runtime.py; quantized logits against llama.cpp
in test_arch_fixtures.py."""

from __future__ import annotations

import numpy as np
import pytest

from fixtures import decoders
from localrt.engine.config import config_from_metadata
from localrt.engine.loader import load_model
from localrt.errors import InvalidModel, MissingTensor
from localrt.models.quantize import quantize_model

NEW = ["llama3_rope", "qwen3", "phi3", "phi3_short", "gemma2", "gemma3", "qwen3moe"]


@pytest.mark.parametrize("name", NEW)
def test_create_quantize_q8_0_is_the_same_model_as_the_fixture(tmp_path, name):
    """quantize_model's Q8_0 of the F32 file computes exactly what the decoder builder's own Q8_0 file does."""
    case = decoders.CASES[name]
    src = decoders.write(tmp_path / "f32.gguf", case, decoders.F32)
    dst = tmp_path / "q8_0.gguf"
    for _ in quantize_model(src, dst, "q8_0"):
        pass
    ours = load_model(dst, num_ctx=case.n_ctx, num_gpu=0)
    ref = load_model(decoders.write(tmp_path / "ref.gguf", case, decoders.Q8_0), num_ctx=case.n_ctx, num_gpu=0)
    try:
        np.testing.assert_array_equal(ours.logits(decoders.IDS), ref.logits(decoders.IDS))
    finally:
        ours.close()
        ref.close()


def _md(arch: str, **keys) -> dict:
    md = {
        "general.architecture": arch,
        f"{arch}.embedding_length": 64,
        f"{arch}.block_count": 4,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.feed_forward_length": 128,
        f"{arch}.vocab_size": 512,
    }
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
    with gguf_io.open(decoders.write(tmp_path / "a.gguf", decoders.CASES["llama3_rope"])) as f:
        assert config_from_metadata({**f.metadata, **llama3}, f.tensors).rope_freq_scale == 1.0
    with gguf_io.open(decoders.write(tmp_path / "b.gguf", decoders.CASES["llama"])) as f:
        with pytest.raises(InvalidModel, match="rope_freqs.weight"):
            config_from_metadata({**f.metadata, **llama3}, f.tensors)
    with pytest.raises(InvalidModel, match="'longrope'"):
        config_from_metadata(_md("llama", **{"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0}))
    # YaRN where llama.cpp's logits were checked (the decoder builder's qwen2_yarn, qwen3_yarn, gpt-oss), refused by name elsewhere
    for arch in ("llama", "gemma3", "phi3"):
        with pytest.raises(InvalidModel, match=f"{arch}.rope.scaling.type 'yarn'"):
            config_from_metadata(_md(arch, **{"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}))
    yarn = config_from_metadata(
        _md(
            "qwen3",
            **{"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32768},
        )
    )
    assert yarn.rope_freq_scale == 0.25 and yarn.rope_yarn[:2] == (32768, 1.0)
    assert (
        config_from_metadata(_md("qwen3", **{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0})).rope_yarn
        == ()
    )
    assert config_from_metadata(_md("phi3", **{"rope.scaling.type": "longrope"})).rope_freq_scale == 1.0
    assert (
        config_from_metadata(
            _md("llama", **{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0})
        ).rope_freq_scale
        == 0.25
    )


def test_partial_rotary_only_where_llamacpp_has_it():
    assert config_from_metadata(_md("phi3", **{"rope.dimension_count": 12})).n_rot == 12
    for arch in ("llama", "qwen3", "gemma2"):
        with pytest.raises(InvalidModel, match="rotates the whole head"):
            config_from_metadata(_md(arch, **{"rope.dimension_count": 12}))


def test_phi3_needs_fused_or_separate_attention(tmp_path):
    import gguf_io

    path = decoders.write(tmp_path / "m.gguf", decoders.CASES["phi3"])
    with gguf_io.open(path) as f:
        tensors = {k: v for k, v in f.tensors.items() if k != "blk.1.attn_qkv.weight"}
        with pytest.raises(MissingTensor, match="blk.1.attn_qkv.weight"):
            config_from_metadata(f.metadata, tensors)


def test_longrope_factors_must_be_positive(tmp_path):
    import gguf_io

    path = decoders.write(tmp_path / "m.gguf", decoders.CASES["phi3_short"])
    with gguf_io.open(path) as f:
        bad = f.tensors["rope_factors_long.weight"]
        zeros = type("T", (), {"shape": bad.shape, "ggml_type": 0, "data": np.zeros(bad.data.nbytes, np.uint8)})()
        with pytest.raises(InvalidModel, match="rope_factors_long.weight"):
            config_from_metadata(f.metadata, {**f.tensors, "rope_factors_long.weight": zeros})
