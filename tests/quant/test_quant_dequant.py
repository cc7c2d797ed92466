"""quant's reference dequantizers: bit-exact against gguf.quants and against hand-built blocks."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGML_QUANT_SIZES
from gguf import quants as gq

import gguf_io
import quant
from quant import FORMATS, GGMLType, QuantError

FILE_TYPES = [t for t, f in FORMATS.items() if not f.activations_only]

# f16 bit patterns that must decode exactly as ggml does
F16_EDGES = np.array(
    [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE01],
    dtype=np.uint16,
)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit equality of float32 arrays, where any NaN equals any NaN."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32).reshape(a.shape)
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | both_nan))


def oracle(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return gq.dequantize(raw, GGMLQuantizationType(ggml_type))


def random_blocks(ggml_type: int, n_rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Random raw bytes (n_rows, row_bytes), with f16 scale fields forced through edge patterns."""
    fmt = FORMATS[ggml_type]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n_rows, blocks_per_row * fmt.type_size), dtype=np.uint8)
    blocks = raw.reshape(-1).view(fmt.dtype)  # (n_blocks,) structured view, writes go to raw
    for name, dt, count in fmt.fields:
        if dt == "<f2" and count == 1:
            bits = blocks[name].view(np.uint16)
            bits[: len(F16_EDGES)] = F16_EDGES
            bits[len(F16_EDGES) : 2 * len(F16_EDGES)] = F16_EDGES[::-1]
            bits[-1] = 0  # a zero scale with nonzero quants
    return raw


def test_formats_agree_with_gguf_sizes():
    for t, fmt in FORMATS.items():
        if t == GGMLType.Q8_1:
            # gguf-py still lists the old 40-byte Q8_1 (f32 d and s); ggml's block_q8_1 is 2 f16 + 32 int8
            assert fmt.type_size == 36
            continue
        assert GGML_QUANT_SIZES[GGMLQuantizationType(t)] == (fmt.block_size, fmt.type_size), fmt.name
        assert fmt.dtype.itemsize == fmt.type_size
        assert gguf_io.BLOCK_SIZES[t] == (fmt.block_size, fmt.type_size)
        assert GGMLType(t).name == fmt.name


@pytest.mark.parametrize("ggml_type", FILE_TYPES, ids=lambda t: FORMATS[t].name)
def test_random_blocks_bit_exact_with_gguf(ggml_type):
    fmt = FORMATS[ggml_type]
    n_rows, bpr = 24, 3
    raw = random_blocks(ggml_type, n_rows, bpr, seed=ggml_type)
    ours = quant.dequantize(raw, ggml_type, (n_rows, bpr * fmt.block_size))
    assert ours.dtype == np.float32 and ours.shape == (n_rows, bpr * fmt.block_size)
    assert same_bits(ours, oracle(raw, ggml_type))


def test_f16_and_bf16_special_values():
    f16 = np.array([0.0, -0.0, 6e-8, -6e-8, np.inf, -np.inf, np.nan, 65504], dtype=np.float16)
    got = quant.dequantize(f16.view(np.uint8), GGMLType.F16, (8,))
    assert same_bits(got, f16.astype(np.float32))
    assert np.signbit(got[1])
    bf16 = np.array([0x3FC0, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x7FC1], dtype=np.uint16)
    got = quant.dequantize(bf16.view(np.uint8), GGMLType.BF16, (6,))
    assert got[0] == 1.5 and np.signbit(got[1]) and got[2] == np.inf and got[3] == -np.inf
    assert got[4] == np.float32(2.0**-133) and np.isnan(got[5])


def blank(ggml_type: int) -> np.ndarray:
    return np.zeros(1, dtype=FORMATS[ggml_type].dtype)


def deq1(block: np.ndarray, ggml_type: int) -> np.ndarray:
    return quant.dequantize(block.view(np.uint8), ggml_type, (FORMATS[ggml_type].block_size,))


def test_hand_built_legacy_blocks():
    i = np.arange(32)
    b = blank(GGMLType.Q8_0)
    b["d"], b["qs"] = 2.0, np.arange(1, 33)
    assert np.array_equal(deq1(b, GGMLType.Q8_0), 2.0 * np.arange(1, 33))

    b = blank(GGMLType.Q8_1)
    b["d"], b["s"], b["qs"] = 0.5, 123.0, i - 16
    assert np.array_equal(deq1(b, GGMLType.Q8_1), 0.5 * (i - 16))

    b = blank(GGMLType.Q4_0)  # low nibble j, high nibble 15-j
    b["d"], b["qs"] = 2.0, np.arange(16) | ((15 - np.arange(16)) << 4)
    want = np.concatenate([2.0 * (np.arange(16) - 8), 2.0 * (7 - np.arange(16))])
    assert np.array_equal(deq1(b, GGMLType.Q4_0), want)

    b = blank(GGMLType.Q4_1)
    b["d"], b["m"], b["qs"] = 0.5, -1.0, np.arange(16) * 0x11
    assert np.array_equal(deq1(b, GGMLType.Q4_1), 0.5 * np.tile(np.arange(16), 2) - 1)

    q5 = {"qs": (i[:16] & 15) | ((i[16:] & 15) << 4), "qh": 0xFFFF0000}  # element i has q = i
    b = blank(GGMLType.Q5_0)
    b["d"], b["qs"], b["qh"] = 1.0, q5["qs"], q5["qh"]
    assert np.array_equal(deq1(b, GGMLType.Q5_0), i - 16.0)
    b = blank(GGMLType.Q5_1)
    b["d"], b["m"], b["qs"], b["qh"] = 1.0, 10.0, q5["qs"], q5["qh"]
    assert np.array_equal(deq1(b, GGMLType.Q5_1), i + 10.0)


def test_hand_built_k_blocks():
    e = np.arange(256)
    b = blank(GGMLType.Q2_K)  # every q = 1; sub-block j has scale j and min 2
    b["d"], b["dmin"], b["qs"], b["scales"] = 1.0, 1.0, 0x55, np.arange(16) | (2 << 4)
    assert np.array_equal(deq1(b, GGMLType.Q2_K), e // 16 - 2.0)

    b = blank(GGMLType.Q3_K)  # every 6-bit scale 33 (so 1); bit pair s of qs holds s
    b["d"], b["hmask"], b["qs"], b["scales"] = 1.0, 0xFF, 0xE4, [0x11] * 8 + [0xAA] * 4
    assert np.array_equal(deq1(b, GGMLType.Q3_K), (e % 128) // 32 * 1.0)
    b["hmask"] = 0x00  # clear high bits subtract 4
    assert np.array_equal(deq1(b, GGMLType.Q3_K), (e % 128) // 32 - 4.0)

    b = blank(GGMLType.Q4_K)  # scale_j = j+1, min_j = 2; low nibbles 3, high nibbles 5
    b["d"], b["dmin"], b["qs"] = 1.0, 0.5, 0x53
    b["scales"] = [1, 2, 3, 4, 2, 2, 2, 2, 5 | 2 << 4, 6 | 2 << 4, 7 | 2 << 4, 8 | 2 << 4]
    j = e // 32
    want = (j + 1.0) * np.where(j % 2 == 0, 3, 5) - 1.0
    assert np.array_equal(deq1(b, GGMLType.Q4_K), want)

    b5 = blank(GGMLType.Q5_K)
    for name in ("d", "dmin", "scales", "qs"):
        b5[name] = b[name]
    b5["qh"] = 0xFF
    assert np.array_equal(deq1(b5, GGMLType.Q5_K), (j + 1.0) * np.where(j % 2 == 0, 19, 21) - 1.0)

    b = blank(GGMLType.Q6_K)  # groups k=0,1 of each half hold q=1, k=2,3 hold q=2; scale_i = i-8
    b["d"], b["ql"], b["qh"], b["scales"] = 0.25, 0x21, 0xAA, np.arange(16) - 8
    q = np.where((e % 128) // 64 == 0, 1.0, 2.0)
    assert np.array_equal(deq1(b, GGMLType.Q6_K), 0.25 * (e // 16 - 8.0) * q)

    b = blank(GGMLType.Q8_K)
    b["d"], b["qs"] = 0.5, e - 128
    assert np.array_equal(deq1(b, GGMLType.Q8_K), 0.5 * (e - 128.0))


def test_row_bytes():
    assert quant.row_bytes(GGMLType.Q4_K, 2048) == 8 * 144
    assert quant.row_bytes(GGMLType.Q8_0, 640) == 20 * 34
    assert quant.row_bytes(GGMLType.F32, 7) == 28
    with pytest.raises(QuantError, match="multiple of 256"):
        quant.row_bytes(GGMLType.Q6_K, 640)
    with pytest.raises(QuantError, match="unsupported ggml tensor type id 4"):
        quant.row_bytes(4, 32)


def test_bad_input_is_a_typed_error():
    raw = np.zeros((2, 34), dtype=np.uint8)
    with pytest.raises(QuantError, match="needs 102 bytes, got 68"):
        quant.dequantize(raw, GGMLType.Q8_0, (3, 32))
    with pytest.raises(QuantError, match="uint8"):
        quant.dequantize(raw.view(np.int8), GGMLType.Q8_0, (2, 32))
    with pytest.raises(QuantError, match="multiple of 32"):
        quant.dequantize(raw, GGMLType.Q8_0, (4, 17))
    with pytest.raises(QuantError, match="shape"):
        quant.dequantize(raw, GGMLType.Q8_0, (0, 32))


def check_every_tensor(path) -> set[int]:
    seen = set()
    with gguf_io.open(path) as f:
        for info in f.tensors.values():
            ours = quant.dequantize(info.data, info.ggml_type, info.shape)
            assert same_bits(ours, oracle(np.asarray(info.data), info.ggml_type)), info.name
            seen.add(info.ggml_type)
    return seen


def test_every_smollm2_tensor_bit_exact(smollm2_path):
    assert check_every_tensor(smollm2_path) == {GGMLType.F32, GGMLType.Q4_1, GGMLType.Q8_0}


def test_every_gemma3_tensor_bit_exact(gemma3_path):
    want = {GGMLType.F32, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.Q6_K}
    assert check_every_tensor(gemma3_path) == want
