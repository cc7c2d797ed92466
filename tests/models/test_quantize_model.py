"""localrt.models.quantize: a whole tiny F32 GGUF quantized per llama-quantize's recipe, read back by two readers."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

import gguf_io
import quant
from localrt.models.quantize import QUANTIZATIONS, quantize_model
from quant import GGMLType, QuantError, recipe
from _llama_oracle import llama_cpp_or_skip

N_EMBD, N_FF, N_VOCAB, N_LAYER = 288, 512, 64, 2  # 288: not a multiple of 256, so fallbacks happen

# max |error| / max |x| per output type for N(0, 1) weights
TOLERANCE = {
    GGMLType.F32: 0.0,
    GGMLType.F16: 1e-3,
    GGMLType.BF16: 8e-3,
    GGMLType.Q8_0: 0.01,
    GGMLType.Q6_K: 0.03,
    GGMLType.Q5_0: 0.05,
    GGMLType.Q5_1: 0.05,
    GGMLType.Q5_K: 0.06,
    GGMLType.Q4_0: 0.1,
    GGMLType.Q4_1: 0.1,
    GGMLType.Q4_K: 0.12,
    GGMLType.Q3_K: 0.2,
    GGMLType.Q2_K: 0.4,
    GGMLType.IQ4_NL: 0.12,
    GGMLType.IQ4_XS: 0.12,
}


def tiny_tensors(dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(42)
    t = {"token_embd.weight": rng.standard_normal((N_VOCAB, N_EMBD)), "output_norm.weight": 1 + rng.random(N_EMBD)}
    for i in range(N_LAYER):
        for part, shape in (
            ("attn_q", (N_EMBD, N_EMBD)),
            ("attn_k", (N_EMBD, N_EMBD)),
            ("attn_v", (N_EMBD, N_EMBD)),
            ("attn_output", (N_EMBD, N_EMBD)),
            ("ffn_gate", (N_FF, N_EMBD)),
            ("ffn_up", (N_FF, N_EMBD)),
            ("ffn_down", (N_EMBD, N_FF)),
            ("attn_norm", (N_EMBD,)),
            ("ffn_norm", (N_EMBD,)),
        ):
            t[f"blk.{i}.{part}.weight"] = rng.standard_normal(shape)
    return {k: v.astype(dtype if v.ndim == 2 else np.float32) for k, v in t.items()}


def write_tiny(path, dtype=np.float32, extra_meta=None):
    tensors = tiny_tensors(dtype)
    ggml = {np.float32: GGMLType.F32, np.float16: GGMLType.F16}
    metadata = {
        "general.architecture": "llama",
        "general.name": "tiny",
        "llama.block_count": N_LAYER,
        "llama.embedding_length": N_EMBD,
        "general.file_type": 0 if dtype == np.float32 else 1,
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(N_VOCAB)],
        **(extra_meta or {}),
    }
    gguf_io.write(path, metadata, [(n, ggml[a.dtype.type], a.shape, a) for n, a in tensors.items()])
    return tensors


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "tiny-f32.gguf"
    return path, write_tiny(path)


@pytest.mark.parametrize(
    "quantization",
    [
        "q8_0",
        "q4_0",
        "q4_1",
        "q5_0",
        "q5_1",
        "q2_K",
        "q3_K_M",
        "q4_K_S",
        "q4_K_M",
        "q5_K_M",
        "q6_K",
        "f16",
        "bf16",
        "iq4_nl",
        "iq4_xs",
    ],
)
def test_quantize_tiny_model(tiny_f32, tmp_path, quantization):
    src, originals = tiny_f32
    dst = tmp_path / "out.gguf"
    events = list(quantize_model(src, dst, quantization))
    assert [e[:2] for e in events] == [(i, len(originals)) for i in range(1, len(originals) + 1)]
    assert sorted(e[2] for e in events) == sorted(originals)
    ft = recipe.get_file_type(quantization)
    with gguf_io.open(src) as f:
        plan = recipe.plan([(t.name, t.shape, t.ggml_type) for t in f.tensors.values()], f.metadata, quantization)
    with gguf_io.open(dst) as out:
        assert out.metadata["general.file_type"] == ft.value
        assert out.metadata["general.quantization_version"] == 2
        assert out.metadata["general.name"] == "tiny" and out.metadata["tokenizer.ggml.tokens"][5] == "t5"
        assert list(out.tensors) == recipe.llama_order(originals)
        for name, info in out.tensors.items():
            assert info.ggml_type == plan[name] and info.shape == originals[name].shape
            x = originals[name]
            y = quant.dequantize(info.data, info.ggml_type, info.shape)
            assert np.max(np.abs(y - x)) <= TOLERANCE[info.ggml_type] * np.max(np.abs(x)), name
            if info.ggml_type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
                # exactly what quantizing the source tensor gives
                assert np.array_equal(info.data, quant.quantize(x, info.ggml_type)), name
    reader = GGUFReader(dst)  # an independent reader accepts the file
    assert {t.name: int(t.tensor_type) for t in reader.tensors} == plan


def test_q4_k_m_bumps_and_falls_back(tiny_f32, tmp_path):
    src, _ = tiny_f32
    list(quantize_model(src, tmp_path / "m.gguf", "Q4_K_M"))
    with gguf_io.open(tmp_path / "m.gguf") as out:
        types = {n: t.ggml_type for n, t in out.tensors.items()}
    assert types["token_embd.weight"] == GGMLType.Q8_0  # tied output, 288 % 256 != 0
    assert types["blk.0.attn_q.weight"] == GGMLType.Q5_0  # Q4_K fallback
    # of 2 layers use_more_bits picks layer 1 only
    assert types["blk.1.attn_v.weight"] == GGMLType.Q8_0  # Q6_K, then fallback
    assert types["blk.0.attn_v.weight"] == GGMLType.Q5_0
    assert types["blk.1.ffn_down.weight"] == GGMLType.Q6_K  # rows of 512 keep the K-quant
    assert types["blk.0.ffn_down.weight"] == GGMLType.Q4_K
    assert types["blk.1.attn_norm.weight"] == GGMLType.F32


def test_f16_and_q8_0_sources(tmp_path):
    f16_src = tmp_path / "tiny-f16.gguf"
    originals = write_tiny(f16_src, np.float16)
    list(quantize_model(f16_src, tmp_path / "q8.gguf", "q8_0"))
    list(quantize_model(tmp_path / "q8.gguf", tmp_path / "q4.gguf", "q4_0"))  # Q8_0 may be requantized
    with gguf_io.open(tmp_path / "q4.gguf") as out:
        w = out.tensors["blk.1.ffn_up.weight"]
        assert w.ggml_type == GGMLType.Q4_0
        x = originals["blk.1.ffn_up.weight"].astype(np.float32)
        assert np.max(np.abs(quant.dequantize(w.data, w.ggml_type, w.shape) - x)) < 0.15 * np.max(np.abs(x))
    with pytest.raises(QuantError, match="already Q4_0; requantizing"):
        list(quantize_model(tmp_path / "q4.gguf", tmp_path / "again.gguf", "q4_1"))
    assert not (tmp_path / "again.gguf").exists()
    list(quantize_model(tmp_path / "q4.gguf", tmp_path / "again.gguf", "q4_1", allow_requantize=True))
    # same target type: the blocks are copied untouched
    list(quantize_model(tmp_path / "q4.gguf", tmp_path / "same.gguf", "q4_0"))
    with gguf_io.open(tmp_path / "q4.gguf") as a, gguf_io.open(tmp_path / "same.gguf") as b:
        assert all(np.array_equal(a.tensors[n].data, b.tensors[n].data) for n in a.tensors)


def test_stopping_early_leaves_no_file(tiny_f32, tmp_path):
    src, _ = tiny_f32
    dst = tmp_path / "partial.gguf"
    events = quantize_model(src, dst, "q4_K_M")
    next(events)
    events.close()
    assert not dst.exists() and not list(tmp_path.iterdir())


def test_bad_requests(tiny_f32, tmp_path):
    src, _ = tiny_f32
    with pytest.raises(QuantError, match="unsupported quantization type 'q9_9'"):
        list(quantize_model(src, tmp_path / "x.gguf", "q9_9"))
    with pytest.raises(gguf_io.InvalidGGUF):
        (tmp_path / "junk.gguf").write_bytes(b"<html>not a model</html>")
        list(quantize_model(tmp_path / "junk.gguf", tmp_path / "x.gguf", "q8_0"))
    assert "Q4_K_M" in QUANTIZATIONS and "Q8_0" in QUANTIZATIONS


LLAMA_HPARAMS = {
    "llama.context_length": 128,
    "llama.feed_forward_length": N_FF,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 4,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.rope.dimension_count": 72,
}
ALL_QUANTIZATIONS = [
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "q2_K",
    "q3_K_S",
    "q3_K_M",
    "q3_K_L",
    "q4_K_S",
    "q4_K_M",
    "q5_K_S",
    "q5_K_M",
    "q6_K",
    "iq4_nl",
    "iq4_xs",
]


def write_deep(path, n_layer: int = 12) -> None:
    """An untied, grouped-query llama with rows of 256 and few rows per matrix: every recipe rule fires.

    llama-quantize reads only the hyperparameters, so the matrices can be short (16 rows) to stay fast.
    """
    rng = np.random.default_rng(7)
    tensors = [("token_embd.weight", (32, 256)), ("output.weight", (32, 256)), ("output_norm.weight", (256,))]
    for i in range(n_layer):
        tensors += [
            (f"blk.{i}.{p}.weight", (16, 256))
            for p in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
        ]
        tensors.append((f"blk.{i}.attn_norm.weight", (256,)))
    metadata = {
        "general.architecture": "llama",
        "llama.block_count": n_layer,
        "llama.embedding_length": 256,
        **LLAMA_HPARAMS,
        "llama.feed_forward_length": 256,
        "llama.attention.head_count_kv": 1,
        "llama.rope.dimension_count": 64,
    }
    arrays = [(n, GGMLType.F32, shape, rng.standard_normal(shape).astype(np.float32)) for n, shape in tensors]
    gguf_io.write(path, metadata, arrays)


def llama_cpp_quantize(src, dst, quantization: str) -> None:
    llama_cpp = llama_cpp_or_skip()
    import ctypes

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = recipe.get_file_type(quantization).value, 1
    llama_cpp.llama_backend_init()
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0


@pytest.mark.parametrize("quantization", ALL_QUANTIZATIONS)
def test_byte_identical_with_llama_cpp_quantize(tmp_path, quantization):
    llama_cpp_or_skip()
    for name, write in (("tiny", lambda p: write_tiny(p, extra_meta=LLAMA_HPARAMS)), ("deep", write_deep)):
        src = tmp_path / f"{name}.gguf"
        write(src)
        llama_cpp_quantize(src, tmp_path / f"{name}-c.gguf", quantization)
        list(quantize_model(src, tmp_path / f"{name}-ours.gguf", quantization))
        assert (tmp_path / f"{name}-ours.gguf").read_bytes() == (tmp_path / f"{name}-c.gguf").read_bytes(), name
