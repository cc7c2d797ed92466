"""llama-quantize's per-tensor recipe: it must reproduce the real files' tensor types exactly."""

from __future__ import annotations

import pytest

import gguf_io
from quant import GGMLType, QuantError, recipe


def real_plan(path, ftype: str):
    with gguf_io.open(path) as f:
        tensors = [(t.name, t.shape, t.ggml_type) for t in f.tensors.values()]
        return recipe.plan(tensors, f.metadata, ftype), {n: t for n, _, t in tensors}, f.metadata


def test_recipe_reproduces_gemma3_q4_k_m(gemma3_path):
    planned, actual, metadata = real_plan(gemma3_path, "Q4_K_M")
    assert planned == actual
    assert metadata["general.file_type"] == recipe.get_file_type("q4_k_m").value == 15
    # use_more_bits over 18 layers: the attn_v bumped to Q6_K, then (ne0 = 640) to Q8_0
    bumped = {i for i in range(18) if actual[f"blk.{i}.attn_v.weight"] == GGMLType.Q8_0}
    assert bumped == {0, 1, 4, 7, 10, 13, 15, 16, 17}


def test_recipe_reproduces_smollm2_q4_1(smollm2_path):
    planned, actual, metadata = real_plan(smollm2_path, "q4_1")
    assert planned == actual
    assert actual["token_embd.weight"] == GGMLType.Q8_0  # tied output: Q6_K, then 576 % 256 -> Q8_0
    assert metadata["general.file_type"] == 3


def tiny(n_layer: int, n_embd: int, tied: bool = True):
    tensors = [("token_embd.weight", (100, n_embd), GGMLType.F16), ("output_norm.weight", (n_embd,), GGMLType.F32)]
    if not tied:
        tensors.append(("output.weight", (100, n_embd), GGMLType.F16))
    for i in range(n_layer):
        for part, shape in (
            ("attn_q", (n_embd, n_embd)),
            ("attn_k", (n_embd, n_embd)),
            ("attn_v", (n_embd, n_embd)),
            ("attn_output", (n_embd, n_embd)),
            ("ffn_gate", (512, n_embd)),
            ("ffn_up", (512, n_embd)),
            ("ffn_down", (n_embd, 512)),
            ("attn_norm", (n_embd,)),
        ):
            tensors.append((f"blk.{i}.{part}.weight", shape, GGMLType.F16 if len(shape) == 2 else GGMLType.F32))
    return tensors, {"general.architecture": "llama", "llama.block_count": n_layer}


def test_k_recipes_on_a_256_multiple_model():
    tensors, meta = tiny(16, 256, tied=False)
    m = recipe.plan(tensors, meta, "q4_K_M")
    assert m["output.weight"] == GGMLType.Q6_K and m["token_embd.weight"] == GGMLType.Q4_K
    assert m["output_norm.weight"] == GGMLType.F32 and m["blk.3.attn_norm.weight"] == GGMLType.F32
    more = {i for i in range(16) if recipe.use_more_bits(i, 16)}
    assert more == {0, 1, 4, 7, 10, 13, 14, 15}
    for i in range(16):
        want = GGMLType.Q6_K if i in more else GGMLType.Q4_K
        assert m[f"blk.{i}.attn_v.weight"] == want and m[f"blk.{i}.ffn_down.weight"] == want
        assert m[f"blk.{i}.attn_q.weight"] == m[f"blk.{i}.ffn_up.weight"] == GGMLType.Q4_K
    s = recipe.plan(tensors, meta, "Q4_K_S")
    assert [s[f"blk.{i}.attn_v.weight"] for i in (0, 3, 4)] == [GGMLType.Q5_K, GGMLType.Q5_K, GGMLType.Q4_K]
    assert [s[f"blk.{i}.ffn_down.weight"] for i in (0, 1, 2)] == [GGMLType.Q5_K, GGMLType.Q5_K, GGMLType.Q4_K]
    q6 = recipe.plan(tensors, meta, "q6_K")
    assert set(q6.values()) == {GGMLType.Q6_K, GGMLType.F32}
    q8 = recipe.plan(tensors, meta, "q8_0")
    assert set(q8.values()) == {GGMLType.Q8_0, GGMLType.F32}
    f16 = recipe.plan(tensors, meta, "f16")
    assert f16["blk.0.attn_q.weight"] == GGMLType.F16 and f16["output_norm.weight"] == GGMLType.F32


def test_fallbacks_for_rows_not_a_multiple_of_256():
    tensors, meta = tiny(8, 288)
    m = recipe.plan(tensors, meta, "q4_K_M")
    assert m["token_embd.weight"] == GGMLType.Q8_0  # tied: output rule, ne0 % 256 -> Q8_0
    assert m["blk.0.attn_q.weight"] == GGMLType.Q5_0  # Q4_K -> Q5_0
    assert m["blk.0.attn_v.weight"] == GGMLType.Q8_0  # Q6_K -> Q8_0
    assert m["blk.2.attn_v.weight"] == GGMLType.Q5_0
    assert m["blk.0.ffn_down.weight"] == GGMLType.Q6_K  # ne0 = 512 keeps the K-quant
    m5 = recipe.plan(tensors, meta, "q5_K_M")
    assert m5["blk.2.attn_q.weight"] == GGMLType.Q5_1  # Q5_K -> Q5_1
    odd = [("blk.0.attn_q.weight", (8, 40), GGMLType.F32)]
    assert recipe.plan(odd, {"general.architecture": "llama", "llama.block_count": 1}, "q4_K_M") == {
        "blk.0.attn_q.weight": GGMLType.F16
    }  # not even a multiple of 32
    with pytest.raises(QuantError, match="no fallback"):
        recipe.plan(odd, {"general.architecture": "llama", "llama.block_count": 1}, "q8_0")


def test_llama_order_and_bad_names():
    names = [
        "blk.10.attn_q.weight",
        "output_norm.weight",
        "blk.2.ffn_up.weight",
        "blk.2.attn_k.weight",
        "token_embd.weight",
    ]
    assert recipe.llama_order(names) == [
        "output_norm.weight",
        "token_embd.weight",
        "blk.2.attn_k.weight",
        "blk.2.ffn_up.weight",
        "blk.10.attn_q.weight",
    ]
    with pytest.raises(QuantError, match="unsupported quantization type 'q3_x'"):
        recipe.get_file_type("q3_x")


def test_low_bit_recipes():
    tensors, meta = tiny(16, 256, tied=False)
    gqa = {**meta, "llama.attention.head_count": 8, "llama.attention.head_count_kv": 2}
    q2 = recipe.plan(tensors, gqa, "q2_K")
    assert q2["blk.5.attn_v.weight"] == GGMLType.Q4_K  # 4 query heads per KV head
    no_gqa = {**gqa, "llama.attention.head_count_kv": 8}
    assert recipe.plan(tensors, no_gqa, "q2_K")["blk.5.attn_v.weight"] == GGMLType.Q3_K
    assert q2["blk.5.ffn_down.weight"] == q2["blk.5.attn_output.weight"] == GGMLType.Q3_K
    assert q2["blk.5.attn_q.weight"] == GGMLType.Q2_K and q2["output.weight"] == GGMLType.Q6_K
    m = recipe.plan(tensors, gqa, "Q3_K_M")
    assert [m[f"blk.{i}.attn_v.weight"] for i in (0, 1, 2)] == [GGMLType.Q5_K, GGMLType.Q5_K, GGMLType.Q4_K]
    assert [m[f"blk.{i}.ffn_down.weight"] for i in (0, 1)] == [GGMLType.Q5_K, GGMLType.Q4_K]  # first n/16
    assert m["blk.3.attn_output.weight"] == GGMLType.Q4_K and m["blk.3.attn_q.weight"] == GGMLType.Q3_K
    big = {**gqa, "llama.block_count": 80}  # llama.cpp's "70B": attn_v Q3_K/Q4_K become Q5_K
    assert recipe.plan(tensors, big, "q3_K_S")["blk.2.attn_v.weight"] == GGMLType.Q5_K
    odd, _ = tiny(2, 288)
    assert recipe.plan(odd, meta, "q3_K_S")["blk.0.attn_q.weight"] == GGMLType.Q4_0  # Q3_K fallback
