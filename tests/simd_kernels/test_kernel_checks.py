"""Kernel entry points cannot be driven out of bounds (issue 12): each simd_kernels.ops function (and the
checked matvec / matmul / get_rows, and backend.linear in front of the raw fused kernels) checks the shapes and
index ranges it will use and raises KernelArgumentError before any kernel runs. The buffers here are the
right size for the *good* call, so a kernel that ran anyway would write past them."""

from __future__ import annotations

import numpy as np
import pytest

import simd_kernels
from localrt.engine.backends.backend import CPUBackend, QTensor
from simd_kernels import KernelArgumentError, ops

rng = np.random.default_rng(0)
N_TOK, N_HEAD, N_KV, HD, CAP = 3, 4, 2, 16, 8


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def idx(*values):
    return np.array(values, np.int64)


POS, SLOTS = idx(0, 1, 2), idx(0, 0, 0)
ONES = np.ones(HD // 2, np.float32)  # rope freq_factors (n_rot/2,)


def caches(n_slots=1, cap=CAP, hd=HD, hd_v=HD):
    return np.zeros((n_slots, N_KV, cap, hd), np.float32), np.zeros((n_slots, N_KV, cap, hd_v), np.float32)


def f16_caches(n_slots=1, cap=CAP, hd=HD, hd_v=HD):
    return tuple(c.astype(np.float16).view(np.uint16) for c in caches(n_slots, cap, hd, hd_v))


BAD_CALLS = {
    # rope: n_rot beyond the head (the heap corruption of issue 12), odd, zero; short freq factors / positions
    "rope_n_rot_larger": lambda: ops.rope(
        f32(N_TOK, N_HEAD, HD), POS, 2 * HD, 1e4, 1.0, np.ones(HD, np.float32), ops.ROPE_NEOX
    ),
    "rope_n_rot_odd": lambda: ops.rope(
        f32(N_TOK, N_HEAD, HD), POS, HD - 1, 1e4, 1.0, np.ones(7, np.float32), ops.ROPE_NORMAL
    ),
    "rope_n_rot_zero": lambda: ops.rope(
        f32(N_TOK, N_HEAD, HD), POS, 0, 1e4, 1.0, np.ones(0, np.float32), ops.ROPE_NORMAL
    ),
    "rope_freq_factors_short": lambda: ops.rope(
        f32(N_TOK, N_HEAD, HD), POS, HD, 1e4, 1.0, np.ones(2, np.float32), ops.ROPE_NEOX
    ),
    "rope_positions_short": lambda: ops.rope(f32(N_TOK, N_HEAD, HD), idx(0), HD, 1e4, 1.0, ONES, ops.ROPE_NEOX),
    "rope_base_zero": lambda: ops.rope(f32(N_TOK, N_HEAD, HD), POS, HD, 0.0, 1.0, ONES, ops.ROPE_NEOX),
    "rope_mode": lambda: ops.rope(f32(N_TOK, N_HEAD, HD), POS, HD, 1e4, 1.0, ONES, 7),
    "rope_2d": lambda: ops.rope(f32(N_TOK, HD), POS, HD, 1e4, 1.0, ONES, ops.ROPE_NEOX),
    # norms
    "rms_norm_w_short": lambda: ops.rms_norm(f32(N_TOK, 64), f32(32), 1e-5, f32(N_TOK, 64)),
    "rms_norm_out_short": lambda: ops.rms_norm(f32(N_TOK, 64), f32(64), 1e-5, f32(1, 64)),
    "rms_norm_eps_nan": lambda: ops.rms_norm(f32(N_TOK, 64), f32(64), float("nan"), f32(N_TOK, 64)),
    "add_rms_norm_delta": lambda: ops.add_rms_norm(f32(N_TOK, 64), f32(N_TOK, 32), f32(64), 1e-5, f32(N_TOK, 64)),
    "rms_norm_heads_w": lambda: ops.rms_norm_heads(f32(N_TOK, N_HEAD, HD), f32(HD - 1), 1e-6),
    "add_bias_short": lambda: ops.add_bias(f32(N_TOK, 64), f32(63)),
    "softmax_1d": lambda: ops.softmax_rows(f32(8)),
    "swiglu_up_short": lambda: ops.swiglu(f32(N_TOK, 96), f32(N_TOK, 95), f32(N_TOK, 96)),
    "geglu_out_short": lambda: ops.geglu_tanh(f32(20, 96), f32(20, 96), f32(19, 96)),
    "softcap_zero": lambda: ops.softcap(f32(4, 4), np.float32(0.0)),
    # KV store: a slot or position the cache does not have, mismatched head counts / sizes
    "kv_store_slot": lambda: ops.kv_store(f32(N_TOK, N_KV, HD), f32(N_TOK, N_KV, HD), *caches(), POS, idx(0, 1, 0)),
    "kv_store_negative_slot": lambda: ops.kv_store(
        f32(N_TOK, N_KV, HD), f32(N_TOK, N_KV, HD), *caches(), POS, idx(0, -1, 0)
    ),
    "kv_store_negative_position": lambda: ops.kv_store(
        f32(N_TOK, N_KV, HD), f32(N_TOK, N_KV, HD), *caches(), idx(0, -5, 2), SLOTS
    ),
    "kv_store_head_dim": lambda: ops.kv_store(f32(N_TOK, N_KV, 2 * HD), f32(N_TOK, N_KV, HD), *caches(), POS, SLOTS),
    "kv_store_value_dim": lambda: ops.kv_store(f32(N_TOK, N_KV, HD), f32(N_TOK, N_KV, 2 * HD), *caches(), POS, SLOTS),
    "kv_store_heads": lambda: ops.kv_store(f32(N_TOK, 2 * N_KV, HD), f32(N_TOK, 2 * N_KV, HD), *caches(), POS, SLOTS),
    "kv_store_slots_short": lambda: ops.kv_store(f32(N_TOK, N_KV, HD), f32(N_TOK, N_KV, HD), *caches(), POS, idx(0)),
    # an F16 cache (uint16 float16 bits) takes bits, never float32 values to convert; caches share one dtype
    "kv_store_f32_into_f16": lambda: ops.kv_store(
        f32(N_TOK, N_KV, HD), f32(N_TOK, N_KV, HD), *f16_caches(), POS, SLOTS
    ),
    "kv_store_f64_caches": lambda: ops.kv_store(
        f32(N_TOK, N_KV, HD).astype(np.float64),
        f32(N_TOK, N_KV, HD).astype(np.float64),
        *(c.astype(np.float64) for c in caches()),
        POS,
        SLOTS,
    ),
    "attention_mixed_caches": lambda: ops.attention(
        f32(N_TOK, N_HEAD, HD), caches()[0], f16_caches()[1], POS, SLOTS, 0, 0.25, f32(N_TOK, N_HEAD, HD)
    ),
    # attention: GQA that does not divide, a slot / position the cache lacks, a short output
    "attention_heads": lambda: ops.attention(f32(N_TOK, 3, HD), *caches(), POS, SLOTS, 0, 0.25, f32(N_TOK, 3, HD)),
    "attention_kv_heads_zero": lambda: ops.attention(
        f32(N_TOK, N_HEAD, HD),
        np.zeros((1, 0, CAP, HD), np.float32),
        np.zeros((1, 0, CAP, HD), np.float32),
        POS,
        SLOTS,
        0,
        0.25,
        f32(N_TOK, N_HEAD, HD),
    ),
    "attention_slot": lambda: ops.attention(
        f32(N_TOK, N_HEAD, HD), *caches(), POS, idx(0, 0, 3), 0, 0.25, f32(N_TOK, N_HEAD, HD)
    ),
    "attention_position": lambda: ops.attention(
        f32(N_TOK, N_HEAD, HD), *caches(), idx(0, 1, CAP), SLOTS, 0, 0.25, f32(N_TOK, N_HEAD, HD)
    ),
    "attention_head_dim": lambda: ops.attention(
        f32(N_TOK, N_HEAD, 2 * HD), *caches(), POS, SLOTS, 0, 0.25, f32(N_TOK, N_HEAD, HD)
    ),
    "attention_out": lambda: ops.attention(
        f32(N_TOK, N_HEAD, HD), *caches(), POS, SLOTS, 0, 0.25, f32(N_TOK, N_HEAD, HD - 1)
    ),
    # weight products and lookups
    "matmul_cols": lambda: simd_kernels.matmul(0, f32(8, 32).view(np.uint8), f32(2, 16)),
    "matvec_out": lambda: simd_kernels.matvec(0, f32(8, 32).view(np.uint8), f32(32), np.empty(4, np.float32)),
    "get_rows_id": lambda: simd_kernels.get_rows(0, f32(8, 32).view(np.uint8), idx(8)),
    "linear_cols": lambda: CPUBackend().linear(QTensor("w", 0, (8, 32), f32(8, 32).view(np.uint8)), f32(2, 16)),
    "linear_out": lambda: CPUBackend().linear(
        QTensor("w", 0, (8, 32), f32(8, 32).view(np.uint8)), f32(2, 32), np.empty((2, 4), np.float32)
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_call_is_refused_before_the_kernel_runs(name):
    with pytest.raises(KernelArgumentError):
        BAD_CALLS[name]()


def test_the_checked_calls_still_compute():
    x = f32(N_TOK, N_HEAD, HD)
    want = x.copy()
    ops._rope(want, POS, HD, 1e4, 1.0, ONES, ops.ROPE_NEOX)
    np.testing.assert_array_equal(ops.rope(x, POS, HD, 1e4, 1.0, ONES, ops.ROPE_NEOX), want)
    k_cache, v_cache = caches()
    k, v = f32(N_TOK, N_KV, HD), f32(N_TOK, N_KV, HD)
    ops.kv_store(k, v, k_cache, v_cache, POS, SLOTS)
    np.testing.assert_array_equal(k_cache[0, :, :N_TOK], k.transpose(1, 0, 2))
    out = ops.attention(
        f32(N_TOK, N_HEAD, HD), k_cache, v_cache, POS, SLOTS, 0, 0.25, np.empty((N_TOK, N_HEAD, HD), np.float32)
    )
    assert np.isfinite(out).all()
    ring = caches(cap=4)  # a sliding-window ring smaller than the positions: fine when the window fits it
    ops.kv_store(k, v, *ring, idx(5, 6, 7), SLOTS)
    ops.attention(
        f32(N_TOK, N_HEAD, HD), *ring, idx(5, 6, 7), SLOTS, 2, 0.25, np.empty((N_TOK, N_HEAD, HD), np.float32)
    )
    with pytest.raises(KernelArgumentError, match="beyond"):  # a window wider than the ring would read overwritten keys
        ops.attention(
            f32(N_TOK, N_HEAD, HD), *ring, idx(5, 6, 7), SLOTS, 6, 0.25, np.empty((N_TOK, N_HEAD, HD), np.float32)
        )
    empty = np.empty((0, N_HEAD, HD), np.float32)
    assert ops.attention(empty, k_cache, v_cache, idx(), idx(), 0, 0.25, empty.copy()).shape == (0, N_HEAD, HD)


def test_an_f16_cache_attends_exactly_as_its_float32_values():
    """An F16 cache holds uint16 float16 bits; the kernel widens each exactly, so attention over it equals attention
    over a float32 cache holding the same float16-rounded values, bit for bit."""
    k = f32(N_TOK, N_KV, HD).astype(np.float16)
    v = (100 * f32(N_TOK, N_KV, HD)).astype(np.float16)  # magnitudes past 2**-14 and subnormals both occur below
    v[0, 0, :4] = np.array([6e-8, -3e-6, 65504, -0.0], np.float16)
    bits, wide = f16_caches(), caches()
    ops.kv_store(k.view(np.uint16), v.view(np.uint16), *bits, POS, SLOTS)
    ops.kv_store(k.astype(np.float32), v.astype(np.float32), *wide, POS, SLOTS)
    np.testing.assert_array_equal(bits[1].view(np.float16).astype(np.float32), wide[1])
    q = f32(N_TOK, N_HEAD, HD)
    got = ops.attention(q, *bits, POS, SLOTS, 0, 0.25, np.empty((N_TOK, N_HEAD, HD), np.float32))
    want = ops.attention(q, *wide, POS, SLOTS, 0, 0.25, np.empty((N_TOK, N_HEAD, HD), np.float32))
    np.testing.assert_array_equal(got, want)


def test_messages_name_the_argument():
    with pytest.raises(KernelArgumentError, match=r"n_rot must be even and in 2..head_dim \(16\), got 32"):
        BAD_CALLS["rope_n_rot_larger"]()
    with pytest.raises(KernelArgumentError, match=r"slots must lie in \[0, 1\), got 0..1"):
        BAD_CALLS["kv_store_slot"]()
    with pytest.raises(KernelArgumentError, match="4 query heads cannot share 0 KV heads"):
        BAD_CALLS["attention_kv_heads_zero"]()
