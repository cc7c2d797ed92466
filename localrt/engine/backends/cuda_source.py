"""CUDA C source of the GPU device (compiled at run time by CuPy's NVRTC; no CUDA headers needed).

`DEVICE_FUNCS` holds one `deq_<fmt>(block, i)` per GGUF block format: element i of one raw block as
float, with f16 scales decoded from their bytes. It is plain C apart from the `DEV` qualifier, so the
CPU tests compile it with the host C compiler and compare it with `quant.dequantize` bit for bit (the
only way to check the block arithmetic on a machine without a GPU). `KERNELS` builds, per format, a
row dequantizer (embedding rows and the tiles cuBLAS multiplies during prefill) and a fused dequantize x
dot kernel (decode: each weight byte read once, one warp per output row); then norms, rope, gated
activations, the KV store and causal attention over the cache.
"""

from __future__ import annotations

# name -> (ggml type id, elements per block, bytes per block)
FORMATS: dict[str, tuple[int, int, int]] = {
    "f32": (0, 1, 4),
    "f16": (1, 1, 2),
    "bf16": (30, 1, 2),
    "q4_0": (2, 32, 18),
    "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24),
    "q8_0": (8, 32, 34),
    "q2_k": (10, 256, 84),
    "q3_k": (11, 256, 110),
    "q4_k": (12, 256, 144),
    "q5_k": (13, 256, 176),
    "q6_k": (14, 256, 210),
    "iq4_nl": (20, 32, 18),
    "iq4_xs": (23, 256, 136),
}

DEVICE_FUNCS = r"""
#ifndef DEV
#define DEV __device__ __forceinline__
#endif
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned int u32;

DEV float bits_f32(u32 u) {
#ifdef __CUDACC_RTC__
    return __uint_as_float(u);
#elif defined(__CUDACC__)
    return __uint_as_float(u);
#else
    union { u32 u; float f; } c; c.u = u; return c.f;
#endif
}

/* IEEE half from two little-endian bytes, subnormals and inf/nan included. */
DEV float f16(const u8* p) {
    u32 h = (u32)p[0] | ((u32)p[1] << 8);
    u32 sign = (h & 0x8000u) << 16;
    u32 e = (h >> 10) & 0x1Fu;
    u32 m = h & 0x3FFu;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7F800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* The float16 value nearest to x (ties to even, overflow to inf) as float: what an F16 KV cache holds. */
DEV float round_f16(float x) {
    float a = fabsf(x), q;
    int e;
    if (a >= 65520.0f) return copysignf(bits_f32(0x7F800000u), x);
    if (a < 6.103515625e-05f) q = 5.9604644775390625e-8f; /* subnormal half: a fixed step of 2^-24 */
    else { frexpf(a, &e); q = ldexpf(1.0f, e - 11); }  /* 11 significant bits */
    return copysignf(rintf(a / q) * q, x);
}

DEV float deq_f32(const u8* b, int i) { (void)i; return bits_f32((u32)b[0] | ((u32)b[1] << 8) | ((u32)b[2] << 16) | ((u32)b[3] << 24)); }
DEV float deq_f16(const u8* b, int i) { (void)i; return f16(b); }
DEV float deq_bf16(const u8* b, int i) { (void)i; return bits_f32(((u32)b[0] | ((u32)b[1] << 8)) << 16); }

/* 32-element legacy blocks: the low nibbles hold elements 0..15, the high nibbles 16..31. */
DEV int nib32(const u8* qs, int i) { return i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4); }
DEV int qh_bit(const u8* qh, int i) { return (qh[i >> 3] >> (i & 7)) & 1; }

DEV float deq_q4_0(const u8* b, int i) { return f16(b) * (float)(nib32(b + 2, i) - 8); }
DEV float deq_q4_1(const u8* b, int i) { return f16(b) * (float)nib32(b + 4, i) + f16(b + 2); }
DEV float deq_q5_0(const u8* b, int i) { return f16(b) * (float)((nib32(b + 6, i) | (qh_bit(b + 2, i) << 4)) - 16); }
DEV float deq_q5_1(const u8* b, int i) { return f16(b) * (float)(nib32(b + 8, i) | (qh_bit(b + 4, i) << 4)) + f16(b + 2); }
DEV float deq_q8_0(const u8* b, int i) { return f16(b) * (float)(i8)b[2 + i]; }

/* Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scale and min packed in 12 bytes. */
DEV void scale_min_k4(int j, const u8* q, int* sc, int* mn) {
    if (j < 4) { *sc = q[j] & 63; *mn = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

DEV float deq_q4_k(const u8* b, int i) {
    int g = i >> 6, hi = (i >> 5) & 1, l = i & 31, sc, mn;
    scale_min_k4(2 * g + hi, b + 4, &sc, &mn);
    int q = (b[16 + 32 * g + l] >> (4 * hi)) & 0xF;
    return f16(b) * (float)sc * (float)q - f16(b + 2) * (float)mn;
}

DEV float deq_q5_k(const u8* b, int i) {
    int g = i >> 6, hi = (i >> 5) & 1, l = i & 31, sub = 2 * g + hi, sc, mn;
    scale_min_k4(sub, b + 4, &sc, &mn);
    int q = ((b[48 + 32 * g + l] >> (4 * hi)) & 0xF) | (((b[16 + l] >> sub) & 1) << 4);
    return f16(b) * (float)sc * (float)q - f16(b + 2) * (float)mn;
}

/* Q6_K: ql[128] qh[64] scales[16] d; two halves of 128, each four quarters of 32. */
DEV float deq_q6_k(const u8* b, int i) {
    int n = i >> 7, k = (i >> 5) & 3, l = i & 31;
    int lo = (b[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xF;
    int hi = (b[128 + 32 * n + l] >> (2 * k)) & 3;
    int sc = (i8)b[192 + 8 * n + (l >> 4) + 2 * k];
    return f16(b + 208) * (float)sc * (float)((lo | (hi << 4)) - 32);
}

/* Q2_K: scales[16] qs[64] d dmin; each scale byte is a 4-bit scale and a 4-bit min of 16 elements. */
DEV float deq_q2_k(const u8* b, int i) {
    int n = i >> 7, j = (i >> 5) & 3, l = i & 31;
    int sc = b[8 * n + 2 * j + (l >> 4)];
    int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
    return f16(b + 80) * (float)(sc & 0xF) * (float)q - f16(b + 82) * (float)(sc >> 4);
}

/* Q3_K: hmask[32] qs[64] scales[12] d; 16 6-bit signed (offset 32) scales; a clear hmask bit subtracts 4. */
DEV float deq_q3_k(const u8* b, int i) {
    int n = i >> 7, j = (i >> 5) & 3, l = i & 31, s = 8 * n + 2 * j + (l >> 4);
    const u8* sc = b + 96;
    int low = s < 8 ? (sc[s] & 0xF) : (sc[s - 8] >> 4);
    int high = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    int q = (b[32 + 32 * n + l] >> (2 * j)) & 3;
    int m = (b[l] >> (4 * n + j)) & 1 ? 0 : 4;
    return f16(b + 108) * (float)((low | (high << 4)) - 32) * (float)(q - m);
}

/* IQ4_NL / IQ4_XS: a 4-bit index q stands for one of 16 int8 levels (ggml's kvalues_iq4nl). */
#ifdef __CUDACC__
__constant__
#endif
static const i8 kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

DEV float deq_iq4_nl(const u8* b, int i) { return f16(b) * (float)kvalues_iq4nl[nib32(b + 2, i)]; }

/* IQ4_XS: d, scales_h u16, scales_l[4], qs[128]; sub-block j of 32 has the 6-bit scale ls (offset 32). */
DEV float deq_iq4_xs(const u8* b, int i) {
    int j = i >> 5, l = i & 31;
    int sh = (int)b[2] | ((int)b[3] << 8);
    int ls = ((b[4 + (j >> 1)] >> (4 * (j & 1))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
    return f16(b) * (float)(ls - 32) * (float)kvalues_iq4nl[nib32(b + 8 + 16 * j, l)];
}
"""

# One row dequantizer and one fused matvec per format; FMT(name, elements per block, bytes per block).
_PER_FORMAT = r"""
extern "C" __global__ void rows_NAME(const u8* w, long long row_bytes, const long long* ids, int n_ids, int cols, float* out) {
    long long total = (long long)n_ids * cols;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total; idx += (long long)gridDim.x * blockDim.x) {
        int r = (int)(idx / cols), e = (int)(idx % cols);
        const u8* row = w + ids[r] * row_bytes;
        out[idx] = deq_NAME(row + (long long)(e / QK) * BB, e % QK);
    }
}

/* out (n_tok, rows) = x (n_tok, cols) @ W.T; a warp per row, up to 8 tokens share each decoded weight. */
extern "C" __global__ void mul_NAME(const u8* w, long long row_bytes, int rows, int cols, const float* x, int n_tok, float* out) {
    int warp = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31;
    if (warp >= rows) return;
    const u8* row = w + (long long)warp * row_bytes;
    for (int t0 = 0; t0 < n_tok; t0 += 8) {
        int nt = n_tok - t0 < 8 ? n_tok - t0 : 8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int e = lane; e < cols; e += 32) {
            float v = deq_NAME(row + (long long)(e / QK) * BB, e % QK);
            for (int k = 0; k < nt; ++k) acc[k] += v * x[(long long)(t0 + k) * cols + e];
        }
        for (int k = 0; k < nt; ++k) {
            float a = acc[k];
            for (int off = 16; off > 0; off >>= 1) a += __shfl_down_sync(0xffffffffu, a, off);
            if (lane == 0) out[(long long)(t0 + k) * rows + warp] = a;
        }
    }
}
"""

_OPS = r"""
DEV float neg_inf() { return __int_as_float(0xff800000); }

/* Block-wide reductions over blockDim.x <= 1024 threads through `red` (32 floats/doubles of shared). */
DEV double block_sum_d(double v, double* red) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    double s = 0.0;
    for (int k = 0; k < nw; ++k) s += red[k];
    return s;
}

DEV float block_max_f(float v, float* red) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float m = red[0];
    for (int k = 1; k < nw; ++k) m = fmaxf(m, red[k]);
    return m;
}

DEV float block_sum_f(float v, float* red) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float s = 0.f;
    for (int k = 0; k < nw; ++k) s += red[k];
    return s;
}

/* One block per row of n: x += delta (when delta), then out = x / sqrt(mean(x^2) + eps) * w; out may be x. */
extern "C" __global__ void add_rms_norm(float* x, const float* delta, const float* w, float eps, int n, float* out) {
    __shared__ double red[32];
    float* xr = x + (long long)blockIdx.x * n;
    float* orow = out + (long long)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (delta) { v += delta[(long long)blockIdx.x * n + i]; xr[i] = v; }
        ss += (double)v * v;
    }
    ss = block_sum_d(ss, red);
    float scale = (float)(1.0 / sqrt((double)(float)(ss / n) + (double)eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
}

extern "C" __global__ void rope(float* x, const long long* pos, int n_head, int head_dim, int n_rot, float theta_scale,
                                float freq_scale, const float* ff, int neox) {
    int half = n_rot / 2;
    int t = blockIdx.y;  /* gridDim.y = n_tok */
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < (long long)n_head * half; idx += (long long)gridDim.x * blockDim.x) {
        int h = (int)(idx / half), i = (int)(idx % half);
        float theta = (float)pos[t];
        for (int k = 0; k < i; ++k) theta = theta * theta_scale;  /* repeated f32 products, as ggml builds it */
        float a = freq_scale * (theta / ff[i]);
        float c = (float)cos((double)a), s = (float)sin((double)a);
        float* v = x + ((long long)t * n_head + h) * head_dim;
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float p = v[i0], q = v[i1];
        v[i0] = p * c - q * s;
        v[i1] = p * s + q * c;
    }
}

extern "C" __global__ void gated(const float* gate, const float* up, long long n, int gelu, float* out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float g = gate[i], a;
        if (gelu) {
            float inner = 0.7978845608028654f * g * (1.0f + 0.044715f * g * g);
            a = 0.5f * g * (1.0f + (float)tanh((double)inner));
        } else {
            a = g / (1.0f + (float)exp((double)-g));
        }
        out[i] = a * up[i];
    }
}

extern "C" __global__ void softcap(float* x, long long n, float cap) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = cap * (float)tanh((double)(x[i] / cap));
}

/* k, v (n_tok, n_kv, hd) -> caches (n_slots, n_kv, cap, hd) at row pos % cap of the token's slot (f16-rounded if as_f16). */
extern "C" __global__ void kv_store(const float* k, const float* v, float* kc, float* vc, const long long* pos,
                                    const long long* slots, int n_tok, int n_kv, int cap, int hd, int hd_v, int as_f16) {
    int w = hd > hd_v ? hd : hd_v;
    long long total = (long long)n_tok * n_kv * w;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total; idx += (long long)gridDim.x * blockDim.x) {
        int d = (int)(idx % w);
        long long th = idx / w;
        int h = (int)(th % n_kv), t = (int)(th / n_kv);
        long long row = (slots[t] * n_kv + h) * (long long)cap + pos[t] % cap;
        if (d < hd) {
            float x = k[((long long)t * n_kv + h) * hd + d];
            kc[row * hd + d] = as_f16 ? round_f16(x) : x;
        }
        if (d < hd_v) {
            float x = v[((long long)t * n_kv + h) * hd_v + d];
            vc[row * hd_v + d] = as_f16 ? round_f16(x) : x;
        }
    }
}

/* One block per (token, head): scores into `scores` (n_tok * n_head, max_keys), softmax, mix values. */
extern "C" __global__ void attention(const float* q, const float* kc, const float* vc, const long long* pos,
                                     const long long* slots, int n_head, int n_kv, int cap, int hd, int hd_v,
                                     int window, float scale, float softcap, float* scores, int max_keys, float* out) {
    __shared__ float red[32];
    int job = blockIdx.x, t = job / n_head, h = job % n_head, kvh = h / (n_head / n_kv);
    long long p = pos[t], s = slots[t];
    long long start = (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
    int n = (int)(p - start + 1);
    float* sc = scores + (long long)job * max_keys;
    const float* qv = q + ((long long)t * n_head + h) * hd;
    const float* kb = kc + (s * n_kv + kvh) * (long long)cap * hd;
    const float* vb = vc + (s * n_kv + kvh) * (long long)cap * hd_v;
    float m = neg_inf();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float* kr = kb + ((start + j) % cap) * hd;
        float acc = 0.f;
        for (int d = 0; d < hd; ++d) acc += qv[d] * kr[d];
        acc *= scale;
        if (softcap > 0.f) acc = softcap * tanhf(acc / softcap);  /* gemma2's attention logit soft-capping */
        sc[j] = acc;
        m = fmaxf(m, acc);
    }
    m = block_max_f(m, red);
    float sum = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(sc[j] - m);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum_f(sum, red);  /* its __syncthreads also publishes sc[] to the whole block */
    float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < n; ++j) acc += sc[j] * vb[((start + j) % cap) * hd_v + d];
        out[((long long)t * n_head + h) * hd_v + d] = acc * inv;
    }
}
"""


def per_format_source(name: str) -> str:
    _, qk, bb = FORMATS[name]
    return _PER_FORMAT.replace("NAME", name).replace("QK", str(qk)).replace("BB", str(bb))


def kernel_source() -> str:
    """The whole module NVRTC compiles: device functions, per-format kernels, then the layer ops."""
    return DEVICE_FUNCS + "".join(per_format_source(n) for n in FORMATS) + _OPS
