"""IQ4_NL and IQ4_XS in quant: hand-built blocks decode to their documented values (random blocks with edge
scales are compared bit for bit with gguf.quants in test_quant_dequant.py), and the quantizers are byte-exact
with ggml's `ggml_quantize_chunk` (the scale search llama-quantize runs) where libggml is present."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

import quant
from quant import FORMATS, KVALUES_IQ4NL, GGMLType
from quant.iquants import best_index
from _ggml_c import ggml_c_quantize_chunk  # pytest puts tests/ on sys.path
from test_quant_quantize import tricky_rows

IQ4 = [GGMLType.IQ4_NL, GGMLType.IQ4_XS]
name = lambda t: FORMATS[t].name  # noqa: E731
V = np.array(KVALUES_IQ4NL, dtype=np.float32)


def test_formats_and_activation_types():
    assert (FORMATS[GGMLType.IQ4_NL].block_size, FORMATS[GGMLType.IQ4_NL].type_size) == (32, 18)
    assert (FORMATS[GGMLType.IQ4_XS].block_size, FORMATS[GGMLType.IQ4_XS].type_size) == (256, 136)
    # llama.cpp's CPU type traits: vec_dot_iq4_nl_q8_0 and vec_dot_iq4_xs_q8_K
    assert quant.VEC_DOT_TYPE[GGMLType.IQ4_NL] == GGMLType.Q8_0
    assert quant.VEC_DOT_TYPE[GGMLType.IQ4_XS] == GGMLType.Q8_K
    assert KVALUES_IQ4NL == gq.IQ4_NL.kvalues


def test_hand_built_iq4_nl_block():
    b = np.zeros(1, dtype=FORMATS[GGMLType.IQ4_NL].dtype)
    b["d"] = 0.5
    idx = np.arange(32) % 16  # element j -> level j % 16
    b["qs"] = idx[:16] | (idx[16:] << 4)
    y = quant.dequantize(b.view(np.uint8), GGMLType.IQ4_NL, (32,))
    assert np.array_equal(y, np.float32(0.5) * V[idx])


def test_hand_built_iq4_xs_block_every_scale_bit():
    b = np.zeros(2, dtype=FORMATS[GGMLType.IQ4_XS].dtype)
    b["d"] = 0.25
    ls = np.array([[0, 63, 32, 1, 47, 16, 31, 48], [33, 15, 62, 2, 17, 49, 30, 34]])  # 6-bit scales, +32 offset
    b["scales_l"] = (ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)
    b["scales_h"] = ((ls >> 4) << (2 * np.arange(8))).sum(axis=1)
    idx = (np.arange(256) * 7) % 16  # every level in every sub-block
    b["qs"] = np.tile((idx.reshape(8, 2, 16)[:, 0] | (idx.reshape(8, 2, 16)[:, 1] << 4)).reshape(128), (2, 1))
    y = quant.dequantize(b.view(np.uint8), GGMLType.IQ4_XS, (2, 256))
    dl = np.float32(0.25) * (ls - 32).astype(np.float32)  # (2, 8)
    want = (dl[:, :, None] * V[idx].reshape(8, 32)[None]).reshape(2, 256)
    assert np.array_equal(y, want)
    theirs = gq.dequantize(b.view(np.uint8).reshape(2, -1), GGMLQuantizationType.IQ4_XS)
    assert np.array_equal(y.view(np.uint32), theirs.view(np.uint32))


def test_best_index_nearest_level_upper_on_ties():
    mids = (V[1:] + V[:-1]) / 2  # exact in float32: the levels are small integers
    assert np.array_equal(best_index(mids), np.arange(1, 16))
    assert np.array_equal(best_index(V), np.arange(16))
    edges = np.float32([-1e9, -127.0, -126.9, 113.0, 1e9, 0.0, -0.0])
    assert np.array_equal(best_index(edges), [0, 0, 0, 15, 15, 8, 8])
    x = np.random.default_rng(0).uniform(-140, 130, 10_000).astype(np.float32)
    nearest = np.abs(x[:, None] - V[None]).argmin(axis=1)  # first (lower) on an exact tie, none here
    assert np.array_equal(best_index(x), nearest)


def _c_or_skip(ggml_type):
    c_quantize = ggml_c_quantize_chunk(ggml_type)
    if c_quantize is None:
        pytest.skip("llama-cpp-python's libggml is not installed")
    return c_quantize


def _hard_rows(seed: int) -> np.ndarray:
    """Rows that probe the scale search: exact levels and midpoints, integers, spikes, tiny and sparse data."""
    rng = np.random.default_rng(seed)
    mids = (V[1:] + V[:-1]) / 2
    rows = [
        rng.choice(np.concatenate([V, mids, -V, -mids]), (16, 512)),
        rng.integers(-127, 114, (16, 512)),
        rng.laplace(size=(16, 512)),
        rng.standard_normal((16, 512)) * np.float32(10) ** rng.uniform(-30, 3, (16, 1)),
        np.where(rng.random((16, 512)) < 0.7, 0, rng.standard_normal((16, 512))),
    ]
    spikes = rng.standard_normal((16, 512))
    spikes[np.arange(16), rng.integers(0, 512, 16)] = 60.0
    return np.concatenate([*rows, spikes]).astype(np.float32)


@pytest.mark.parametrize("ggml_type", IQ4, ids=name)
def test_quantize_byte_exact_with_ggml_c(ggml_type):
    c_quantize = _c_or_skip(ggml_type)
    for x in (tricky_rows(1024, seed=21), _hard_rows(22)):
        assert np.array_equal(quant.quantize(x, ggml_type), c_quantize(x))


@pytest.mark.parametrize("ggml_type", IQ4, ids=name)
def test_zero_blocks_as_ggml(ggml_type):
    x = np.zeros((2, 256), dtype=np.float32)
    x[1, 40:72] = np.linspace(-1, 1, 32)  # IQ4_XS: live sub-blocks 1 and 2 in a live super-block, the rest zero
    raw = quant.quantize(x, ggml_type)
    b = raw.reshape(-1).view(FORMATS[ggml_type].dtype)
    y = quant.dequantize(raw, ggml_type, x.shape)
    assert np.array_equal(y[0], np.zeros(256, np.float32))
    assert np.all(b["qs"][: 8 if ggml_type == GGMLType.IQ4_NL else 1] == 0x88)  # level 8 (value 1) times d = 0
    if ggml_type == GGMLType.IQ4_XS:
        assert b["d"][0].view(np.uint16) == 0x8000  # d = -max_scale/32 = -0.0, as ggml stores it
        assert np.all(y[1, :32] == 0) and np.all(y[1, 96:] == 0)
    else:
        assert np.all(b["d"][:8] == 0)


# RMSE relative to the data RMS on N(0, 1) rows (64 x 1536): measured IQ4_NL 0.0759, IQ4_XS 0.0765, between
# Q4_K (0.0712) and Q4_0 (0.0858), as their 4.5 and 4.25 bits per weight suggest; ~5% headroom.
GAUSSIAN_BOUNDS = {GGMLType.IQ4_NL: 0.080, GGMLType.IQ4_XS: 0.080}


@pytest.mark.parametrize("ggml_type", IQ4, ids=name)
def test_gaussian_relative_rmse_and_independent_decode(ggml_type):
    x = np.random.default_rng(3).standard_normal((64, 1536)).astype(np.float32)
    raw = quant.quantize(x, ggml_type)
    y = quant.dequantize(raw, ggml_type, x.shape)
    rel = np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x**2))
    assert rel < GAUSSIAN_BOUNDS[ggml_type]
    theirs = gq.dequantize(raw, GGMLQuantizationType(ggml_type))
    assert np.array_equal(theirs.view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("ggml_type", IQ4, ids=name)
def test_edge_rows_decode_sanely(ggml_type):
    x = tricky_rows(512, seed=7)
    y = quant.dequantize(quant.quantize(x, ggml_type), ggml_type, x.shape)
    assert np.all(np.isfinite(y))
    assert np.all(y[0] == 0) and np.all(y[10] == 0)
    assert np.allclose(y[1], 5.0, rtol=0.02) and np.allclose(y[2], -5.0, rtol=0.02)


def test_bad_input_is_a_typed_error():
    with pytest.raises(quant.QuantError, match="multiple of 256"):
        quant.quantize(np.ones((2, 96), np.float32), GGMLType.IQ4_XS)
    with pytest.raises(quant.QuantError, match="IQ4_NL: element 3 is nan"):
        quant.quantize(np.float32([0, 1, 2, np.nan] + [0] * 28), GGMLType.IQ4_NL)
    with pytest.raises(quant.QuantError, match="beyond the f16 range"):
        quant.quantize(np.full(32, 1e7, np.float32), GGMLType.IQ4_NL)
