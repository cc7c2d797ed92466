"""MXFP4 in quant: every exponent byte 0..255 with every code decodes bit for bit as gguf.quants (random blocks run with
every other format in test_quant_dequant.py), the quantizer is byte-exact with gguf.quants and with ggml's
`quantize_row_mxfp4_ref` where libggml is present, and `create --quantize` never writes MXFP4: it refuses it as a
target by name and keeps MXFP4 tensors as they are."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

import gguf_io
import quant
from quant import FORMATS, KVALUES_MXFP4, GGMLType, recipe
from quant.dequant import e8m0_half
from _ggml_c import ggml_c_quantize_chunk  # pytest puts tests/ on sys.path
from test_quant_quantize import tricky_rows

MXFP4 = GGMLType.MXFP4
DT = FORMATS[MXFP4].dtype
V = np.array(KVALUES_MXFP4, dtype=np.float32)  # (16,) doubled E2M1 values
UP = "blk.0.ffn_up_exps.weight"


def oracle_dequant(raw: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return gq.dequantize(raw.reshape(-1, 17), GGMLQuantizationType.MXFP4).reshape(-1)


def oracle_quant(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return gq.quantize(x, GGMLQuantizationType.MXFP4).reshape(x.shape[0], -1)


def test_format_table_and_activation_type():
    fmt = FORMATS[MXFP4]
    assert (fmt.name, fmt.block_size, fmt.type_size) == ("MXFP4", 32, 17)
    assert gguf_io.BLOCK_SIZES[MXFP4] == (32, 17)
    assert [name for name, _, _ in fmt.fields] == ["e", "qs"]
    assert quant.VEC_DOT_TYPE[MXFP4] == GGMLType.Q8_0  # llama.cpp's CPU type traits: ggml_vec_dot_mxfp4_q8_0
    assert KVALUES_MXFP4 == tuple(gq.MXFP4.kvalues)


def test_e8m0_half_edges():
    e = np.array([0, 1, 2, 3, 126, 127, 128, 129, 254, 255], dtype=np.uint8)
    want = np.float32([2.0**-128, 2.0**-127, 2.0**-126, 2.0**-125, 0.25, 0.5, 1.0, 2.0, 2.0**126, 2.0**127])
    got = e8m0_half(e)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert got[0].view(np.uint32) == 0x00200000 and got[1].view(np.uint32) == 0x00400000  # subnormals, exactly


def _every_exponent_and_code() -> np.ndarray:
    """Raw (256 * 3, 17): for every exponent byte, a block with codes 0..15 in the low nibbles and 15..0 in the high,
    one with every (low, high) pair shifted, and one of random codes."""
    rng = np.random.default_rng(39)
    b = np.zeros((256, 3), dtype=DT)
    b["e"] = np.arange(256, dtype=np.uint8)[:, None]
    q = np.arange(16, dtype=np.uint8)
    b["qs"][:, 0] = q | (q[::-1] << 4)
    b["qs"][:, 1] = ((q + 5) % 16) | (((q * 7) % 16) << 4)
    b["qs"][:, 2] = rng.integers(0, 256, (256, 16), dtype=np.uint8)
    return b.reshape(-1).view(np.uint8)


def test_every_exponent_and_code_bit_exact_with_gguf():
    raw = _every_exponent_and_code()
    n = raw.size // 17
    ours = quant.dequantize(raw, MXFP4, (n, 32))
    theirs = oracle_dequant(raw).reshape(n, 32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    # e = 255 reads as 2^127, not NaN (ggml handles no NaN): code 1 (0.5) gives 2^127, code 2 (1.0) overflows
    top = ours.reshape(256, 3, 32)[255, 0]
    assert top[1] == np.float32(2.0**127) and top[2] == np.inf and top[9] == -np.float32(2.0**127)
    assert not np.isnan(ours).any()
    assert np.isfinite(ours.reshape(256, 3, 32)[:253]).all()  # up to e = 252 every code is finite


def test_hand_built_block():
    b = np.zeros(2, dtype=DT)
    b["e"] = [127, 130]  # scales 1 and 8: elements are the E2M1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 (times 8)
    idx = np.arange(32) % 16
    b["qs"] = idx[:16] | (idx[16:] << 4)
    y = quant.dequantize(b.view(np.uint8), MXFP4, (2, 32))
    e2m1 = np.float32([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    assert np.array_equal(y[0], e2m1[idx]) and np.array_equal(y[1], 8 * e2m1[idx])
    assert not np.signbit(y[0, 8])  # code 8 is a plain zero (ggml's table holds 0, not -0)


def _c_or_skip():
    c_quantize = ggml_c_quantize_chunk(MXFP4)
    if c_quantize is None:
        pytest.skip("llama-cpp-python's libggml is not installed")
    return c_quantize


def _hard_rows() -> np.ndarray:
    """Blocks that probe the exponent and the code choice: absmax just below and at every power of two (log2 rounds
    up to the integer there), subnormal and near-max magnitudes, and elements at the midpoints between codes."""
    k = np.arange(-149, 128)
    a = np.concatenate([(2.0**k * (1 - m * 2.0**-24)).astype(np.float32) for m in range(4)])
    a = a[(a > 0) & np.isfinite(a)]
    powers = np.zeros((len(a), 32), np.float32)  # (n, 32)
    powers[:, 3], powers[:, 20], powers[:, 30] = a, -a / np.float32(3), a * np.float32(0.74)
    rng = np.random.default_rng(5)
    scale = np.float32(2.0) ** rng.integers(-20, 20, (64, 1)).astype(np.float32)  # (64, 1) powers of two
    mids = np.concatenate([(V[1:8] + V[:7]) / 4, -(V[1:8] + V[:7]) / 4])  # midpoints of the E2M1 values
    ties = rng.choice(mids, (64, 32)).astype(np.float32) * scale
    ties[:, 0] = np.float32(6) * scale[:, 0]  # absmax 6 * scale: the block's scale is scale
    return np.concatenate([powers, ties])


def test_quantize_byte_exact_with_gguf():
    for x in (tricky_rows(1024, seed=39).reshape(-1, 32), _hard_rows()):
        assert np.array_equal(quant.quantize(x, MXFP4), oracle_quant(x))


def test_quantize_byte_exact_with_ggml_c():
    c_quantize = _c_or_skip()
    for x in (tricky_rows(1024, seed=40), _hard_rows()):
        assert np.array_equal(quant.quantize(x, MXFP4), c_quantize(x))


def test_ties_take_the_first_code_and_zero_is_code_0():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 6.0  # e = floor(log2(6)) - 2 + 127 = 127: scale 1, the codes are the E2M1 values themselves
    x[0, 1:8] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]  # midpoints: the code listed first (the smaller value's)
    x[0, 8:15] = -x[0, 1:8]  # -0.25 ties 0 (code 0) with -0.5 (code 9): code 0
    b = quant.quantize(x, MXFP4).reshape(-1).view(DT)
    assert b["e"][0] == 127
    codes = np.concatenate([b["qs"][0] & 15, b["qs"][0] >> 4])
    assert list(codes[:15]) == [7, 0, 1, 2, 3, 4, 5, 6, 0, 9, 10, 11, 12, 13, 14]
    assert np.all(codes[15:] == 0)  # zeros: code 0, never 8
    zeros = quant.quantize(np.zeros((2, 32), np.float32), MXFP4).reshape(-1).view(DT)
    assert np.all(zeros["e"] == 0) and np.all(zeros["qs"] == 0)


def test_gaussian_relative_rmse_and_round_trip():
    x = np.random.default_rng(3).standard_normal((64, 1536)).astype(np.float32)
    raw = quant.quantize(x, MXFP4)
    y = quant.dequantize(raw, MXFP4, x.shape)
    # measured 0.1148: coarser than Q4_0 (0.0858), with no scale search and the top quarter of each block clipped
    assert np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x**2)) < 0.12
    assert np.array_equal(quant.quantize(y, MXFP4), raw)  # decoded values are re-encoded as they were


def test_bad_input_is_a_typed_error():
    with pytest.raises(quant.QuantError, match="multiple of 32"):
        quant.quantize(np.ones((2, 48), np.float32), MXFP4)
    with pytest.raises(quant.QuantError, match="MXFP4: element 3 is inf"):
        quant.quantize(np.float32([0, 1, 2, np.inf] + [0] * 28), MXFP4)
    with pytest.raises(quant.QuantError, match="MXFP4 tensor of shape .* needs 34 bytes, got 33"):
        quant.dequantize(np.zeros(33, np.uint8), MXFP4, (2, 32))


# ---- create --quantize: never a target, kept as a source ------------------------------------------------------


@pytest.mark.parametrize("name", ["MXFP4_MOE", "mxfp4_moe", "MXFP4", "mxfp4"])
def test_mxfp4_is_refused_as_a_target_by_name(name):
    with pytest.raises(
        quant.QuantError,
        match=rf"unsupported quantization type '{name}': .*MXFP4.*read here but "
        r"not written; choose one of F32, F16",
    ):
        recipe.get_file_type(name)


MOE_META = {
    "general.architecture": "qwen3moe",
    "qwen3moe.block_count": 1,
    "qwen3moe.attention.head_count": 4,
    "qwen3moe.attention.head_count_kv": 1,
    "qwen3moe.expert_count": 4,
}


def _moe_tensors() -> list[tuple[str, tuple[int, ...], int]]:
    return [
        ("token_embd.weight", (64, 256), GGMLType.F16),
        ("blk.0.attn_q.weight", (256, 256), GGMLType.F16),
        ("blk.0.attn_v.weight", (64, 256), GGMLType.F16),
        ("blk.0.attn_norm.weight", (256,), GGMLType.F32),
        ("blk.0.ffn_gate_inp.weight", (4, 256), GGMLType.F32),
        ("blk.0.ffn_gate_exps.weight", (4, 128, 256), MXFP4),
        ("blk.0.ffn_up_exps.weight", (4, 128, 256), MXFP4),
        ("blk.0.ffn_down_exps.weight", (4, 256, 128), MXFP4),
    ]


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0", "IQ4_XS", "Q2_K", "F16", "F32"])
def test_plan_keeps_mxfp4_tensors(ftype):
    tensors = _moe_tensors()
    out = recipe.plan(tensors, MOE_META, ftype)
    assert {n: out[n] for n, _, t in tensors if t == MXFP4} == {n: MXFP4 for n, _, t in tensors if t == MXFP4}
    as_f16 = recipe.plan([(n, s, GGMLType.F16 if t == MXFP4 else t) for n, s, t in tensors], MOE_META, ftype)
    # every other tensor is planned as in the same model without MXFP4 (the layer counters are unchanged)
    assert {n: t for n, t in out.items() if "exps" not in n} == {n: t for n, t in as_f16.items() if "exps" not in n}


def test_quantize_model_copies_mxfp4_tensors_unchanged(tmp_path):
    from localrt.models.quantize import quantize_model

    rng = np.random.default_rng(7)
    tensors, data = _moe_tensors(), {}
    for name, shape, t in tensors:
        x = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        data[name] = {
            GGMLType.F16: lambda v: v.astype(np.float16).view(np.uint8),
            GGMLType.F32: lambda v: v.view(np.uint8),
            MXFP4: lambda v: quant.quantize(v, MXFP4),
        }[t](x).reshape(int(np.prod(shape[:-1])), -1)
    src, dst = tmp_path / "src.gguf", tmp_path / "dst.gguf"
    with gguf_io.GGUFWriter(src, {**MOE_META, "general.file_type": 1}) as w:
        for name, shape, t in tensors:
            w.add_tensor_info(name, t, shape)
        for name, _, _ in tensors:
            w.write_tensor(data[name], name)
    assert list(quantize_model(src, dst, "q4_K_M"))[-1][:2] == (len(tensors), len(tensors))
    with gguf_io.open(dst) as f:
        for name, shape, t in tensors:
            info = f.tensors[name]
            if t == MXFP4:
                assert info.ggml_type == MXFP4 and info.shape == shape
                assert np.array_equal(np.asarray(info.data), data[name])
        assert f.tensors["blk.0.attn_q.weight"].ggml_type == GGMLType.Q4_K


# ---- hostile files: the size table refuses a tensor that is not whole MXFP4 blocks ---------------------------


def _write_raw_gguf(path, infos: list[tuple[str, tuple[int, ...], int, int]], payload: bytes) -> None:
    """A GGUF v3 with these tensor infos (name, ne in GGUF order, type, data offset) and payload as the data, whatever
    the shapes say."""

    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), 1) + s(b"general.architecture") + struct.pack("<I", 8)
    head += s(b"llama")
    for name, ne, t, offset in infos:
        head += s(name.encode()) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        head += struct.pack("<IQ", t, offset)
    path.write_bytes(head + bytes(-len(head) % 32) + payload)


@pytest.mark.parametrize(
    "infos, payload, match",
    [
        (
            [(UP, (48, 2), MXFP4, 0)],
            3 * 17,
            rf"tensor '{UP}'.*row length 48 is not a multiple of the MXFP4 block size 32",
        ),
        ([(UP, (64, 4, 2), MXFP4, 0)], 16 * 17 - 1, r"truncated file: header says \d+ bytes needed"),
        # 16 blocks (272 bytes) declared where the next tensor starts after 256: the two overlap
        (
            [(UP, (64, 4, 2), MXFP4, 0), ("b", (8,), GGMLType.F32, 256)],
            288,
            rf"tensors '{UP}' \[\d+, \d+\) and 'b' .*overlap",
        ),
    ],
)
def test_a_tensor_not_of_whole_blocks_is_refused_by_name(tmp_path, infos, payload, match):
    path = tmp_path / "bad.gguf"
    _write_raw_gguf(path, infos, bytes(payload))
    with pytest.raises(gguf_io.InvalidGGUF, match=match):
        gguf_io.open(path)


def test_a_whole_mxfp4_tensor_is_read_as_its_blocks(tmp_path):
    path = tmp_path / "good.gguf"
    _write_raw_gguf(path, [(UP, (64, 4, 2), MXFP4, 0)], bytes(16 * 17))
    with gguf_io.open(path) as f:
        t = f.tensors[UP]
        assert t.ggml_type == MXFP4 and t.shape == (2, 4, 64) and t.data.shape == (8, 34)


# ---- create's scan: an exponent that overflows float32 is refused, one that does not is legal ---------------


class _T:  # a tensor as gguf_io gives it: type, NumPy-order shape, raw rows
    def __init__(self, shape: tuple[int, ...], data: np.ndarray) -> None:
        self.ggml_type, self.shape, self.data = MXFP4, shape, data


def test_the_finite_scan_refuses_an_overflowing_exponent_by_name_and_place():
    from localrt.engine.finite import check_finite
    from localrt.errors import InvalidModel

    b = np.zeros((2, 4, 2), dtype=DT)  # (n_expert, rows, blocks): a stacked expert tensor of rows of 64
    b["e"] = 252  # 12 * 2^124: every code finite
    b["qs"] = 0x77
    b["e"][1, 2, 0], b["qs"][1, 2, 0] = 255, 0x10  # 2^127 * 0.5 and 0: finite, legal (ggml reads e = 255 as 2^127)
    b["e"][1, 3, 1], b["qs"][1, 3, 1] = 253, 0x60  # code 6 (4.0) * 2^126 = 2^128: infinite
    raw = b.view(np.uint8).reshape(8, 34)
    check_finite({"ok": _T((7, 64), raw[:7].copy())})  # rows before the overflowing block: legal
    with np.errstate(over="ignore"):
        assert np.isfinite(quant.dequantize(raw[:7], MXFP4, (7, 64))).all()
    with pytest.raises(
        InvalidModel,
        match=r"tensor 'blk.0.ffn_up_exps.weight' \(MXFP4\) has a block exponent "
        r"e = 253 in block 1 of expert 1, row 3: its element 4 x 2\^126 overflows",
    ):
        check_finite({UP: _T((2, 4, 64), raw)})
