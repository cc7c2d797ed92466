"""Hostile model metadata (issue 12): every hyperparameter the forward uses is checked against sane ranges and
the tensors' real shapes before anything is allocated or run. Each hostile value is an InvalidModel (a 400)
naming the GGUF key (or tensor) and the numbers, from the loader, from `create` and from the memory estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest

import store as st
from fixtures.decoders import small, write_model
from fixtures.reference import BYTE_TOKENS
from _hostile_gguf import VT, rewrite
from localrt import load_model
from localrt.models.create import CreateError, create, gguf_facts
from localrt.errors import InvalidModel, InvalidRequest, MissingTensor, ModelLoadError
from localrt.engine.model import config_from_metadata
from localrt.runtime.service import estimate_memory

BASES = {
    "llama": small(),  # n_embd 64, 4 heads of 16 (no key_length key: the default), 2 KV heads, n_ff 96, 2 blocks
    "qwen2": small(arch="qwen2"),
    "gemma3": small(arch="gemma3", head_dim=32, window=4),  # key_length 32 written
}
NAN, INF = float("nan"), float("inf")

# (arch, rewrite arguments, texts the message must contain)
CASES = {
    # rope.dimension_count: larger than the head (the heap corruption), odd, smaller, zero
    "rot_larger": (
        "llama",
        dict(meta={"llama.rope.dimension_count": 96}),
        ["llama.rope.dimension_count is 96 but the head size (llama.attention.key_length) is 16"],
    ),
    "rot_odd": ("llama", dict(meta={"llama.rope.dimension_count": 15}), ["llama.rope.dimension_count is 15", "is 16"]),
    "rot_smaller": (
        "llama",
        dict(meta={"llama.rope.dimension_count": 8}),
        ["llama.rope.dimension_count is 8", "is 16"],
    ),
    "rot_zero": ("llama", dict(meta={"llama.rope.dimension_count": 0}), ["llama.rope.dimension_count is 0"]),
    "rot_gemma": (
        "gemma3",
        dict(meta={"gemma3.rope.dimension_count": 64}),
        ["gemma3.rope.dimension_count is 64 but the head size (gemma3.attention.key_length) is 32"],
    ),
    # block_count against the blocks in the file
    "blocks_1e8": (
        "llama",
        dict(meta={"llama.block_count": 10**8, "llama.attention.key_length": 0}),
        ["llama.block_count is 100000000", "holds 2 block"],
    ),
    "blocks_2e9": ("llama", dict(meta={"llama.block_count": 2 * 10**9}), ["llama.block_count is 2000000000"]),
    "blocks_zero": ("llama", dict(meta={"llama.block_count": 0}), ["llama.block_count is 0"]),
    "blocks_more": ("llama", dict(meta={"llama.block_count": 3}), ["llama.block_count is 3", "holds 2 block"]),
    "blocks_fewer": ("llama", dict(meta={"llama.block_count": 1}), ["llama.block_count is 1", "holds 2 block"]),
    "blocks_gap": (
        "llama",
        dict(
            drop_tensors=[
                n
                for n in (
                    "attn_norm",
                    "attn_q",
                    "attn_k",
                    "attn_v",
                    "attn_output",
                    "ffn_norm",
                    "ffn_gate",
                    "ffn_up",
                    "ffn_down",
                )
                for n in [f"blk.0.{n}.weight"]
            ]
        ),
        ["llama.block_count is 2", "blk.0 missing"],
    ),
    # context, widths, heads
    "ctx_zero": ("llama", dict(meta={"llama.context_length": 0}), ["llama.context_length is 0"]),
    "ctx_huge": ("llama", dict(meta={"llama.context_length": 2**40}), ["llama.context_length is 1099511627776"]),
    "key_len_zero": ("llama", dict(meta={"llama.attention.key_length": 0}), ["llama.attention.key_length is 0"]),
    "key_len_negative": (
        "llama",
        dict(meta={"llama.attention.key_length": -1}, types={"llama.attention.key_length": VT.INT32}),
        ["llama.attention.key_length is -1"],
    ),
    "key_len_wrong": (
        "llama",
        dict(meta={"llama.attention.key_length": 32}),
        ["blk.0.attn_q.weight", "llama.attention.head_count x llama.attention.key_length is 128"],
    ),
    "value_len_wrong": (
        "llama",
        dict(meta={"llama.attention.value_length": 8}),
        ["blk.0.attn_v.weight", "llama.attention.head_count_kv x llama.attention.value_length is 16"],
    ),
    "embd_zero": ("llama", dict(meta={"llama.embedding_length": 0}), ["llama.embedding_length is 0"]),
    "embd_indivisible": (
        "llama",
        dict(meta={"llama.embedding_length": 63}),
        ["llama.embedding_length (63) is not a multiple of llama.attention.head_count (4)"],
    ),
    "embd_wrong": (
        "llama",
        dict(meta={"llama.embedding_length": 128}),
        ["token_embd.weight", "(260, 64)", "llama.embedding_length is 128"],
    ),
    "heads_zero": ("llama", dict(meta={"llama.attention.head_count": 0}), ["llama.attention.head_count is 0"]),
    "kv_heads_zero": ("llama", dict(meta={"llama.attention.head_count_kv": 0}), ["llama.attention.head_count_kv is 0"]),
    "kv_heads_indivisible": (
        "llama",
        dict(meta={"llama.attention.head_count_kv": 3}),
        ["llama.attention.head_count (4) is not a multiple of llama.attention.head_count_kv (3)"],
    ),
    "heads_float": (
        "llama",
        dict(meta={"llama.attention.head_count": 4.0}),
        ["llama.attention.head_count must be an integer"],
    ),
    "heads_wrong": (
        "llama",
        dict(meta={"llama.attention.head_count": 8}),
        ["blk.0.attn_k.weight", "llama.attention.head_count_kv"],
    ),
    "heads_per_layer": (
        "llama",
        dict(meta={"llama.attention.head_count": np.array([4, 2], np.int32)}),
        ["llama.attention.head_count varies per layer"],
    ),
    "ff_zero": ("llama", dict(meta={"llama.feed_forward_length": 0}), ["llama.feed_forward_length is 0"]),
    "ff_wrong": (
        "llama",
        dict(meta={"llama.feed_forward_length": 95}),
        ["blk.0.ffn_gate.weight", "llama.feed_forward_length is 95"],
    ),
    # vocabulary: metadata, tokenizer and token_embd must agree
    "vocab_larger": (
        "llama",
        dict(meta={"llama.vocab_size": len(BYTE_TOKENS) + 1}),
        [f"llama.vocab_size is {len(BYTE_TOKENS) + 1} but tokenizer.ggml.tokens has {len(BYTE_TOKENS)} tokens"],
    ),
    "vocab_zero": ("llama", dict(meta={"llama.vocab_size": 0}), ["llama.vocab_size is 0"]),
    "tokens_fewer": (
        "llama",
        dict(
            meta={
                "tokenizer.ggml.tokens": BYTE_TOKENS[:-2] + [BYTE_TOKENS[-1]],
                "tokenizer.ggml.token_type": np.array([1] * (len(BYTE_TOKENS) - 2) + [3], np.int32),
            }
        ),
        ["token_embd.weight", f"the number of tokenizer.ggml.tokens is {len(BYTE_TOKENS) - 1}"],
    ),
    # floats: finite and > 0 where the forward divides or takes a power
    "eps_nan": (
        "llama",
        dict(meta={"llama.attention.layer_norm_rms_epsilon": NAN}),
        ["llama.attention.layer_norm_rms_epsilon is nan"],
    ),
    "eps_negative": (
        "llama",
        dict(meta={"llama.attention.layer_norm_rms_epsilon": -1e-5}),
        ["llama.attention.layer_norm_rms_epsilon is -1e-05"],
    ),
    "eps_zero": (
        "llama",
        dict(meta={"llama.attention.layer_norm_rms_epsilon": 0.0}),
        ["llama.attention.layer_norm_rms_epsilon is 0"],
    ),
    "rope_base_zero": ("llama", dict(meta={"llama.rope.freq_base": 0.0}), ["llama.rope.freq_base is 0"]),
    "rope_base_inf": ("llama", dict(meta={"llama.rope.freq_base": INF}), ["llama.rope.freq_base is inf"]),
    "rope_factor_nan": ("llama", dict(meta={"llama.rope.scaling.factor": NAN}), ["llama.rope.scaling.factor is nan"]),
    "attn_scale_negative": ("llama", dict(meta={"llama.attention.scale": -1.0}), ["llama.attention.scale is -1"]),
    "rope_base_swa_zero": ("gemma3", dict(meta={"gemma3.rope.freq_base_swa": 0.0}), ["gemma3.rope.freq_base_swa is 0"]),
    "softcap_nan": (
        "gemma3",
        dict(meta={"gemma3.final_logit_softcapping": NAN}),
        ["gemma3.final_logit_softcapping is nan"],
    ),
    # sliding windows, experts
    "window_negative": (
        "gemma3",
        dict(meta={"gemma3.attention.sliding_window": -1}, types={"gemma3.attention.sliding_window": VT.INT32}),
        ["gemma3.attention.sliding_window is -1"],
    ),
    "window_pattern_length": (
        "gemma3",
        dict(meta={"gemma3.attention.sliding_window_pattern": np.array([True, False, True])}),
        ["gemma3.attention.sliding_window_pattern has 3 entries for 2 layers"],
    ),
    "experts": (
        "llama",
        dict(meta={"llama.expert_count": 8, "llama.expert_used_count": 2}),
        ["llama.expert_count is 8"],
    ),
    "experts_used_only": ("llama", dict(meta={"llama.expert_used_count": 2}), ["llama.expert_used_count is 2"]),
    # tensors: NaN in norms, missing ones, rope factors the kernel divides by
    "nan_norm": ("llama", dict(nan_in=["blk.1.ffn_norm.weight"]), ["tensor 'blk.1.ffn_norm.weight' holds NaN"]),
    "nan_output_norm": ("llama", dict(nan_in=["output_norm.weight"]), ["tensor 'output_norm.weight' holds NaN"]),
    "nan_qk_norm": (
        "gemma3",
        dict(nan_in=["blk.0.attn_q_norm.weight"]),
        ["tensor 'blk.0.attn_q_norm.weight' holds NaN"],
    ),
    "nan_small_matrix": ("llama", dict(nan_in=["blk.0.attn_q.weight"]), ["tensor 'blk.0.attn_q.weight' holds NaN"]),
    "missing_ffn_up": ("llama", dict(drop_tensors=["blk.1.ffn_up.weight"]), ["blk.1.ffn_up.weight"]),
    "missing_qwen_bias": ("qwen2", dict(drop_tensors=["blk.0.attn_q.bias"]), ["blk.0.attn_q.bias"]),
    "rope_freqs_zero": (
        "llama",
        dict(add_tensors={"rope_freqs.weight": np.zeros(8, np.float32)}),
        ["rope_freqs.weight", "greater than 0"],
    ),
    "rope_freqs_shape": (
        "llama",
        dict(add_tensors={"rope_freqs.weight": np.ones(4, np.float32)}),
        ["rope_freqs.weight", "llama.rope.dimension_count / 2 is 8"],
    ),
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    out = {}
    for arch, spec in BASES.items():
        out[arch] = root / f"{arch}.gguf"
        write_model(out[arch], spec)
    return out


@pytest.fixture(scope="module")
def hostile(bases, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return {name: rewrite(bases[arch], root / f"{name}.gguf", **kw) for name, (arch, kw, _) in CASES.items()}


def _assert_names(exc: BaseException, texts: list[str]) -> None:
    for text in texts:
        assert text in str(exc), f"{text!r} not in {str(exc)!r}"


def test_the_good_bases_load_and_validate(bases):
    for arch, path in bases.items():
        model = load_model(path, num_ctx=16)
        assert model.config.n_layer == BASES[arch].n_layer and model.config.n_rot == BASES[arch].head_dim


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_value_is_refused_at_load_naming_the_key(hostile, name):
    with pytest.raises(InvalidModel) as exc:
        load_model(hostile[name], num_ctx=16)
    _assert_names(exc.value, CASES[name][2])
    assert isinstance(exc.value, ModelLoadError) and isinstance(exc.value, InvalidRequest)  # a 400 at the edge


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_value_is_refused_by_the_memory_estimate(hostile, name):
    with pytest.raises(InvalidModel) as exc:
        estimate_memory(hostile[name], 4096, 512)
    _assert_names(exc.value, CASES[name][2])


@pytest.mark.parametrize(
    "name", ["rot_larger", "blocks_1e8", "eps_nan", "vocab_larger", "nan_norm", "missing_qwen_bias"]
)
def test_hostile_file_is_refused_by_create(hostile, tmp_path, name):
    s = st.Store(tmp_path / "models")
    with pytest.raises(InvalidModel) as exc:
        list(create(s, "bad", f"FROM {hostile[name]}\n"))
    _assert_names(exc.value, CASES[name][2])
    assert s.list() == [] and list((tmp_path / "models" / "blobs").glob("*")) == []  # nothing kept
    digest = s.import_file(hostile[name]).digest  # an uploaded blob (POST /api/blobs) is refused the same way
    with pytest.raises(InvalidModel):
        list(create(s, "bad", f"FROM @{digest}\n", allow_local_paths=False))


def test_create_still_accepts_the_good_files(bases, tmp_path):
    s = st.Store(tmp_path / "models")
    for arch, path in bases.items():
        events = list(create(s, arch, f"FROM {path}\n"))
        assert events[-1] == {"status": "success"}
    assert gguf_facts(bases["llama"])["invalid"] is None


def test_unsupported_architecture_is_refused_at_create(bases, tmp_path):
    other = rewrite(bases["llama"], tmp_path / "mamba.gguf", meta={"general.architecture": "mamba"})
    with pytest.raises(InvalidModel, match="unsupported model architecture 'mamba'"):
        list(create(st.Store(tmp_path / "models"), "m", f"FROM {other}\n"))
    adapterish = rewrite(bases["llama"], tmp_path / "a.gguf", meta={"general.type": "adapter"})
    with pytest.raises(CreateError, match="ADAPTER"):  # an adapter is not validated as a model
        list(create(st.Store(tmp_path / "models"), "m", f"FROM {adapterish}\n"))


def test_nothing_per_layer_is_built_before_block_count_is_checked(bases):
    """block_count 2e9 is refused by comparing with the file, before a per-layer tuple (16 GB) could be built."""
    import gguf_io

    with gguf_io.open(bases["gemma3"]) as f:
        md = dict(f.metadata, **{"gemma3.block_count": 2 * 10**9})
        with pytest.raises(InvalidModel, match="gemma3.block_count is 2000000000 but the file holds 2"):
            config_from_metadata(md, f.tensors)
    with pytest.raises(InvalidModel, match="at most 4096"):  # without the tensors, the cap still bounds it
        config_from_metadata(md)


def test_memory_estimate_uses_the_validated_config(bases, smollm2_path, gemma3_path):
    need = estimate_memory(bases["gemma3"], 64, 8)
    spec = BASES["gemma3"]
    kv = spec.n_layer * (spec.window + 8) * spec.n_head_kv * 2 * spec.head_dim * 2  # both layers are local: rings
    assert need.private >= kv > 0
    smol = estimate_memory(smollm2_path, 4096, 512)
    assert smol.private >= 30 * 4096 * 3 * (64 + 64) * 2  # 30 layers, 3 KV heads of 64, f16 K and V
    gemma = estimate_memory(gemma3_path, 4096, 512)
    assert gemma.private >= (3 * 4096 + 15 * 1024) * 1 * 512 * 2  # 3 global layers, 15 rings of 512 + 512, f16
    assert gemma.mapped > 200 << 20


def test_real_models_validate(smollm2_path, gemma3_path):
    import gguf_io

    for path, arch, n_layer in ((smollm2_path, "llama", 30), (gemma3_path, "gemma3", 18)):
        with gguf_io.open(path) as f:
            cfg = config_from_metadata(f.metadata, f.tensors)
        assert (cfg.arch, cfg.n_layer, cfg.n_rot) == (arch, n_layer, cfg.head_dim)
        assert gguf_facts(path)["invalid"] is None


def test_missing_tensor_is_still_named_as_before(hostile):
    with pytest.raises(MissingTensor, match="blk.1.ffn_up.weight"):
        load_model(hostile["missing_ffn_up"])


def test_messages_carry_both_numbers():
    """The messages the issue asked for, word for word where it gave them."""
    md = {
        "general.architecture": "llama",
        "llama.block_count": 1,
        "llama.embedding_length": 256,
        "llama.attention.head_count": 4,
        "llama.feed_forward_length": 64,
        "llama.vocab_size": 8,
        "llama.attention.key_length": 64,
        "llama.rope.dimension_count": 96,
    }
    with pytest.raises(InvalidModel) as exc:
        config_from_metadata(md)
    assert str(exc.value).startswith(
        "llama.rope.dimension_count is 96 but the head size (llama.attention.key_length) is 64"
    )
    assert not math.isnan(config_from_metadata({**md, "llama.rope.dimension_count": 64}).attn_scale)
