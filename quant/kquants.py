"""K-quant reference quantizers following ggml's `quantize_row_q{2,3,4,5,6}_K_ref` (no importance matrix).

Per sub-block the scale (and min) search is ggml's: `make_qkx2_quants` (Q2_K, Q4_K, Q5_K), `make_qx_quants`
(Q6_K), `make_q3_quants` (Q3_K). Everything runs in float32 with C's evaluation order and left-to-right
sums, vectorised over all sub-blocks at once; each takes float32 super-blocks (n_blocks, 256) and returns
a structured array (n_blocks,) of the format's dtype.
"""

from __future__ import annotations

import numpy as np

from quant._numeric import F32, first_absmax, nearest_int, seqsum, via_f16
from quant.dequant import k4_scales_mins, q3_k_scales
from quant.formats import FORMATS, GGMLType

GROUP_MAX_EPS = F32(1e-15)  # ggml: a group whose absmax is below this is all zero


def make_qkx2_quants(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Affine fit x ~ scale*L - the_min per row of x (m, n), L in 0..nmax, by a weighted grid search.

    Returns scale (m,), the_min (m,) (>= 0) and L (m, n) uint8.
    """
    rmin, rdelta, fnmax = F32(rmin), F32(rdelta), F32(nmax)
    lo = np.minimum(x.min(axis=1), F32(0))  # (m,) the fit's min is never above 0
    hi = x.max(axis=1)  # (m,)
    sum_w = seqsum(w)  # (m,)
    sum_x = seqsum(w * x)  # (m,)
    flat = hi == lo

    def err(scale, mn, L):
        diff = scale[:, None] * L + mn[:, None] - x  # (m, n)
        return seqsum(w * (np.abs(diff) if use_mad else diff * diff))

    def levels(iscale, mn):
        return np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax).astype(F32)  # (m, n)

    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = fnmax / (hi - lo)
        scale = F32(1) / iscale
        L = levels(iscale, lo)
        best = err(scale, lo, L)
        mn = lo
        for step in range(nstep + 1):
            iscale = (rmin + rdelta * F32(step) + fnmax) / (hi - mn)
            Laux = levels(iscale, mn)
            wl = w * Laux
            sum_l, sum_l2, sum_xl = seqsum(wl), seqsum(wl * Laux), seqsum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0  # a positive min is clamped to 0 and the scale refit without it
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            this_min = np.where(pos, F32(0), this_min)
            cur = err(this_scale, this_min, Laux)
            better = (D > 0) & (cur < best) & ~flat
            L = np.where(better[:, None], Laux, L)
            best = np.where(better, cur, best)
            scale = np.where(better, this_scale, scale)
            mn = np.where(better, this_min, mn)
    scale = np.where(flat, F32(0), scale).astype(F32)
    L = np.where(flat[:, None], F32(0), L)
    return scale, (-mn).astype(F32), L.astype(np.uint8)


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric fit x ~ scale*(L - nmax), L in 0..2*nmax-1, weights x*x (ggml rmse_type 1), per row of x (m, n).

    Returns scale (m,) and L (m, n) uint8; an all-zero row gets scale 0 and L = 0.
    """
    fnmax = F32(nmax)
    mx = first_absmax(x)  # (m,) signed
    zero = np.abs(mx) < GROUP_MAX_EPS
    w = x * x

    def fit(iscale):
        l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1).astype(F32)  # (m, n)
        return l, seqsum(w * x * l), seqsum(w * l * l)

    with np.errstate(divide="ignore", invalid="ignore"):
        l, sumlx, suml2 = fit(-fnmax / mx)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
        best = scale * sumlx
        L = l + fnmax
        for step in (*range(-9, 0), *range(1, 10)):
            l, sumlx, suml2 = fit(-(fnmax + F32(0.1) * F32(step)) / mx)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(better[:, None], l + fnmax, L)
            scale = np.where(better, sumlx / suml2, scale)
            best = np.where(better, scale * sumlx, best)
    scale = np.where(zero, F32(0), scale).astype(F32)
    return scale, np.where(zero[:, None], 0, L).astype(np.uint8)


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric fit with ggml's coordinate-descent refinement (do_rmse), per row of x (m, n).

    Returns scale (m,) and L (m, n) uint8 in 0..2*nmax-1; an all-zero row gets scale 0 and L = 0.
    """
    m, n = x.shape
    mx = first_absmax(x)  # (m,)
    zero = np.abs(mx) < GROUP_MAX_EPS
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.clip(nearest_int((-F32(nmax) / mx)[:, None] * x), -nmax, nmax - 1).astype(F32)  # (m, n)
        sumlx, suml2 = seqsum(w * x * L), seqsum(w * L * L)
        # ggml stops early once a pass changes nothing; further passes would change nothing either
        for _ in range(5):
            for i in range(n):
                wi, xi, li = w[:, i], x[:, i], L[:, i]
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1).astype(F32)
                slx2 = slx + wi * xi * new
                sl22 = sl2 + wi * new * new
                take = (slx > 0) & (new != li) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                L[:, i] = np.where(take, new, li)
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    scale = np.where(zero, F32(0), scale)
    return scale, np.where(zero[:, None], 0, L + F32(nmax)).astype(np.uint8)


def _requantize(x: np.ndarray, L: np.ndarray, d: np.ndarray, offset: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Where d != 0, L = clip(nearest_int((x + offset)/d), lo, hi); elsewhere keep L. Shapes (nb, s, k)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        fresh = np.clip(nearest_int((x + offset[..., None]) / d[..., None]), lo, hi)
    return np.where((d != 0)[..., None], fresh, L)


def _pack_k4_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins (nb, 8) -> the 12 packed bytes of Q4_K/Q5_K (inverse of get_scale_min_k4)."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    s = np.zeros((len(ls), 12), dtype=np.uint8)
    s[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    s[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    return s


def _k4_common(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, out: np.ndarray) -> np.ndarray:
    """Shared Q4_K/Q5_K body: fills d, dmin, scales of `out`, returns final levels L (nb, 8, 32) int."""
    nb = len(x)
    xs = x.reshape(nb, 8, 32)
    av_x = np.sqrt(seqsum(xs * xs) / F32(32))  # (nb, 8)
    w = av_x[..., None] + np.abs(xs)  # (nb, 8, 32)
    scales, mins, L = make_qkx2_quants(xs.reshape(-1, 32), w.reshape(-1, 32), nmax, rmin, rdelta, nstep)
    scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32).astype(np.int32)
    max_scale = np.maximum(scales.max(axis=1), F32(0))  # (nb,)
    max_min = np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0)).astype(F32)
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0)).astype(F32)
    # C stores nearest_int into a uint8 (wrapping) before clamping to 63
    ls = np.minimum(63, nearest_int(inv_scale[:, None] * scales) & 0xFF)
    lm = np.minimum(63, nearest_int(inv_min[:, None] * mins) & 0xFF)
    out["scales"] = _pack_k4_scales(ls, lm)
    out["d"] = max_scale / F32(63)
    out["dmin"] = max_min / F32(63)
    sc, mn = k4_scales_mins(out["scales"])
    d = via_f16(max_scale / F32(63))[:, None] * sc.astype(F32)  # (nb, 8)
    dm = via_f16(max_min / F32(63))[:, None] * mn.astype(F32)
    return _requantize(xs, L, d, dm, 0, nmax)


def _pack_k4_nibbles(L: np.ndarray) -> np.ndarray:
    """Levels (nb, 8, 32) -> qs (nb, 128): per 64-chunk, sub-block 2c in low nibbles, 2c+1 in high."""
    q = L.astype(np.uint8).reshape(len(L), 4, 2, 32)
    return ((q[:, :, 0] & 0x0F) | ((q[:, :, 1] & 0x0F) << 4)).reshape(len(L), 128)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x), dtype=FORMATS[GGMLType.Q4_K].dtype)
    L = _k4_common(x, 15, -1.0, 0.1, 20, out)
    out["qs"] = _pack_k4_nibbles(L)
    return out


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x), dtype=FORMATS[GGMLType.Q5_K].dtype)
    L = _k4_common(x, 31, -0.5, 0.1, 15, out)
    out["qs"] = _pack_k4_nibbles(L)
    # bit k of qh[l] is bit 4 of element 32k + l
    hbit = ((L >> 4) & 1).astype(np.uint8)  # (nb, 8, 32)
    out["qh"] = (hbit << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    return out


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    nb = len(x)
    out = np.zeros(nb, dtype=FORMATS[GGMLType.Q6_K].dtype)
    xs = x.reshape(nb, 16, 16)
    scales, L = make_qx_quants(xs.reshape(-1, 16), 32)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16).astype(np.int32)
    max_scale = first_absmax(scales)  # (nb,) signed
    live = np.abs(max_scale) >= GROUP_MAX_EPS  # other blocks stay all-zero bytes
    with np.errstate(divide="ignore"):
        iscale = np.where(live, F32(-128) / max_scale, F32(0)).astype(F32)
        dstore = np.where(live, F32(1) / iscale, F32(0))
    sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)  # (nb, 16)
    d = via_f16(dstore)[:, None] * sc.astype(F32)  # (nb, 16)
    L = _requantize(xs, L - 32, d, np.zeros_like(d), -32, 31) + 32
    L = np.where(live[:, None, None], L, 0).astype(np.uint8).reshape(nb, 2, 4, 32)  # (nb, half, k, l)
    ql = np.concatenate(
        [(L[:, :, 0] & 0x0F) | ((L[:, :, 2] & 0x0F) << 4), (L[:, :, 1] & 0x0F) | ((L[:, :, 3] & 0x0F) << 4)], axis=2
    )  # (nb, 2, 64)
    qh = ((L >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(axis=2, dtype=np.uint8)
    out["ql"], out["qh"] = ql.reshape(nb, 128), qh.reshape(nb, 64)
    out["scales"] = np.where(live[:, None], sc, 0)
    out["d"] = dstore
    return out


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """Levels (nb, 256) in 0..3 -> (nb, 64): bit pair s of byte 32h + l is element 128h + 32s + l."""
    q = L.astype(np.uint8).reshape(len(L), 2, 4, 32)
    return (q << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(axis=2, dtype=np.uint8).reshape(-1, 64)


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    nb = len(x)
    out = np.zeros(nb, dtype=FORMATS[GGMLType.Q2_K].dtype)
    xs = x.reshape(nb, 16, 16)
    flat = xs.reshape(-1, 16)
    scales, mins, L = make_qkx2_quants(flat, np.abs(flat), 3, -0.5, 0.1, 15, use_mad=True)
    scales, mins, L = scales.reshape(nb, 16), mins.reshape(nb, 16), L.reshape(nb, 16, 16).astype(np.int32)
    max_scale = np.maximum(scales.max(axis=1), F32(0))  # (nb,)
    max_min = np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore"):
        isc = np.where(max_scale > 0, F32(15) / max_scale, F32(0)).astype(F32)
        imn = np.where(max_min > 0, F32(15) / max_min, F32(0)).astype(F32)
    ls = np.where(max_scale[:, None] > 0, nearest_int(isc[:, None] * scales), 0)
    lm = np.where(max_min[:, None] > 0, nearest_int(imn[:, None] * mins), 0)
    packed = ((ls & 0xFF) | ((lm << 4) & 0xFF)).astype(np.uint8)  # C ORs int values into a uint8
    out["scales"] = packed
    out["d"] = np.where(max_scale > 0, max_scale / F32(15), F32(0))
    out["dmin"] = np.where(max_min > 0, max_min / F32(15), F32(0))
    d = out["d"].astype(F32)[:, None] * (packed & 0x0F).astype(F32)  # (nb, 16)
    dm = out["dmin"].astype(F32)[:, None] * (packed >> 4).astype(F32)
    L = _requantize(xs, L, d, dm, 0, 3)
    out["qs"] = _pack_2bit(L.reshape(nb, 256))
    return out


def _pack_q3_scales(l: np.ndarray) -> np.ndarray:
    """6-bit unsigned scales (nb, 16) -> 12 bytes: low nibbles in bytes 0..7, top 2 bits in bytes 8..11."""
    l = l.astype(np.uint8)
    s = np.zeros((len(l), 12), dtype=np.uint8)
    s[:, 0:8] = (l[:, 0:8] & 0x0F) | ((l[:, 8:16] & 0x0F) << 4)
    top = (l >> 4).reshape(len(l), 4, 4)  # (nb, j // 4, j % 4)
    s[:, 8:12] = (top << (2 * np.arange(4, dtype=np.uint8))[None, :, None]).sum(axis=1, dtype=np.uint8)
    return s


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    nb = len(x)
    out = np.zeros(nb, dtype=FORMATS[GGMLType.Q3_K].dtype)
    xs = x.reshape(nb, 16, 16)
    scales, L = make_q3_quants(xs.reshape(-1, 16), 4)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16).astype(np.int32)
    max_scale = first_absmax(scales)  # (nb,) signed
    live = max_scale != 0
    with np.errstate(divide="ignore"):
        iscale = np.where(live, F32(-32) / max_scale, F32(0)).astype(F32)
        out["d"] = np.where(live, F32(1) / iscale, F32(0))
    ls = np.clip(nearest_int(iscale[:, None] * scales), -32, 31) + 32  # (nb, 16) in 0..63
    out["scales"] = np.where(live[:, None], _pack_q3_scales(ls), 0)
    d = out["d"].astype(F32)[:, None] * q3_k_scales(out["scales"]).astype(F32)  # (nb, 16)
    L = (_requantize(xs, L - 4, d, np.zeros_like(d), -4, 3) + 4).reshape(nb, 256)
    high = L > 3
    # bit j // 32 of hmask[j % 32] holds element j's high bit
    out["hmask"] = (high.reshape(nb, 8, 32).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(
        axis=1, dtype=np.uint8
    )
    out["qs"] = _pack_2bit(np.where(high, L - 4, L))
    return out


K_QUANTIZERS = {
    GGMLType.Q2_K: quantize_q2_k,
    GGMLType.Q3_K: quantize_q3_k,
    GGMLType.Q4_K: quantize_q4_k,
    GGMLType.Q5_K: quantize_q5_k,
    GGMLType.Q6_K: quantize_q6_k,
}
