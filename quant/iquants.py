"""Reference quantizers of the non-linear 4-bit formats IQ4_NL and IQ4_XS, as ggml's `quantize_iq4_nl` /
`quantize_iq4_xs` (what `ggml_quantize_chunk`, and so llama-quantize, runs), without an importance matrix.

Both share ggml's `quantize_row_iq4_nl_impl` with ntry = 7: per 32-element sub-block a scale is searched
(the absmax mapped to -127, then 15 trial scales, each refit by weighted least squares with weights x*x);
IQ4_NL stores that scale as f16, IQ4_XS quantizes the 8 sub-block scales of a super-block to 6 bits against
one f16 super-scale. Levels are then chosen once more with the stored scale (`best_index`).
float32 throughout with C's evaluation order and left-to-right sums, vectorised over all sub-blocks.
Each takes float32 blocks (n_blocks, block_size) and returns a structured array (n_blocks,).
"""

from __future__ import annotations

import numpy as np

from quant._numeric import F32, first_absmax, nearest_int, seqsum
from quant.formats import FORMATS, KVALUES_IQ4NL, GGMLType

NTRY = 7  # trial scales either side of the absmax one (ggml's quantize_iq4_nl / quantize_iq4_xs)
GROUP_MAX_EPS = F32(1e-15)  # a sub-block whose absmax is below this gets scale 0
_VALUES = np.array(KVALUES_IQ4NL, dtype=F32)  # (16,) the levels, as the float the C compares with


def best_index(x: np.ndarray) -> np.ndarray:
    """ggml's `best_index_int8` per element of x (float32): the index of the nearest level, the upper on a tie.

    The distances are float32 differences, as in the C, so a rounded difference decides a near-tie alike.
    """
    mu = np.clip(np.searchsorted(_VALUES, x, side="right"), 1, 15)  # first level above x (in range)
    lower_wins = (x - _VALUES[mu - 1]) < (_VALUES[mu] - x)
    idx = np.where(lower_wins, mu - 1, mu)
    return np.where(x <= _VALUES[0], 0, np.where(x >= _VALUES[15], 15, idx)).astype(np.uint8)


def _fit(x: np.ndarray, w: np.ndarray, iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Levels at iscale (m,) for rows x (m, 32) -> (Σ w*q*x, Σ w*q*q) per row, summed left to right."""
    q = _VALUES[best_index(iscale[:, None] * x)]  # (m, 32)
    wq = w * q
    return seqsum(wq * x), seqsum(wq * q)


def sub_block_scales(x: np.ndarray) -> np.ndarray:
    """The searched scale (m,) of each 32-element row of x (m, 32); 0 for an all-(near-)zero row."""
    w = x * x  # (m, 32) ggml's weights without an importance matrix
    mx = first_absmax(x)  # (m,) signed
    live = np.abs(mx) >= GROUP_MAX_EPS
    mx = np.where(live, mx, F32(1))  # dead rows: any finite value; their scale is 0 below
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (-mx) / F32(KVALUES_IQ4NL[0])
        sumqx, sumq2 = _fit(x, w, F32(1) / d)
        d = np.where(sumq2 > 0, sumqx / sumq2, F32(0)).astype(F32)
        best = d * sumqx
        for itry in range(-NTRY, NTRY + 1):
            sumqx, sumq2 = _fit(x, w, F32(itry + KVALUES_IQ4NL[0]) / mx)
            better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            d = np.where(better, sumqx / sumq2, d).astype(F32)
            best = np.where(better, d * sumqx, best).astype(F32)
    return np.where(live, d, F32(0)).astype(F32)


def _inverse(v: np.ndarray) -> np.ndarray:
    """`v ? 1/v : 0` elementwise in float32."""
    with np.errstate(divide="ignore"):
        return np.where(v != 0, F32(1) / v, F32(0)).astype(F32)


def pack_levels(L: np.ndarray) -> np.ndarray:
    """Level indices (n, k*32) -> (n, k*16) bytes: per 32 elements, element j low nibble, j+16 high nibble."""
    q = L.astype(np.uint8).reshape(len(L), -1, 2, 16)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(len(L), -1)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """(n, 32) -> IQ4_NL blocks: d = f16(searched scale), levels re-chosen with the f32 scale."""
    out = np.zeros(len(x), dtype=FORMATS[GGMLType.IQ4_NL].dtype)
    d = sub_block_scales(x)  # (n,)
    out["d"] = d
    out["qs"] = pack_levels(best_index(_inverse(d)[:, None] * x))
    return out


def quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """(n, 256) -> IQ4_XS blocks: 8 searched sub-block scales as 6-bit multiples of d = -max_scale/32."""
    nb = len(x)
    out = np.zeros(nb, dtype=FORMATS[GGMLType.IQ4_XS].dtype)
    xs = x.reshape(nb, 8, 32)
    scales = sub_block_scales(xs.reshape(-1, 32)).reshape(nb, 8)
    max_scale = first_absmax(scales)  # (nb,) signed; +0.0 when every scale is 0
    d = (-max_scale / F32(32)).astype(F32)  # an all-zero super-block stores -0.0, as ggml does
    out["d"] = d
    ls = np.clip(nearest_int(_inverse(d)[:, None] * scales), -32, 31)  # (nb, 8)
    dl = d[:, None] * ls.astype(F32)  # (nb, 8) the f32 scale the levels are chosen with (not f16-rounded)
    L = best_index(_inverse(dl)[:, :, None] * xs)  # (nb, 8, 32)
    u = (ls + 32).astype(np.uint16)  # (nb, 8) in 0..63
    out["scales_l"] = ((u[:, 0::2] & 0x0F) | ((u[:, 1::2] & 0x0F) << 4)).astype(np.uint8)
    out["scales_h"] = ((u >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
    out["qs"] = pack_levels(L.reshape(nb, 256))
    return out


I_QUANTIZERS = {
    GGMLType.IQ4_NL: quantize_iq4_nl,
    GGMLType.IQ4_XS: quantize_iq4_xs,
}
