// FP8 (e4m3, the "fn" variant: no infinities, 448 the largest finite value) for weights
// quantized at load and for the per-token activations of the FP8 GEMMs.
//
// A row is quantized with one scale: scale = amax / 448 (1 for an all-zero row) and
// q = e4m3(v / scale), rounded to nearest even and saturated to +-448. The rounding is written
// out in integer steps (no cvt instruction), so it is the same on every architecture and the
// host reference in the kernel checks reproduces it bit for bit.

#define FP8_MAX 448.0f

__device__ __forceinline__ unsigned int f2e4m3(float f) {
    const unsigned int sign = (__float_as_uint(f) >> 24) & 0x80u;
    const float a = fabsf(f);
    if (a != a) return sign | 0x7fu;  // NaN
    if (a < 0.015625f) {
        // below the smallest normal (2^-6): multiples of 2^-9; 8 of them is 2^-6 itself (0x08)
        return sign | (unsigned int)__float2int_rn(a * 512.0f);
    }
    unsigned int u = __float_as_uint(a);
    u += 0x7ffffu + ((u >> 20) & 1u);  // round to 3 mantissa bits, ties to even
    const int e = (int)(u >> 23) - 127;
    const unsigned int m = (u >> 20) & 7u;
    if (e > 8 || (e == 8 && m > 6u)) return sign | 0x7eu;  // saturate to 448
    return sign | ((unsigned int)(e + 7) << 3) | m;
}

// Four e4m3 values (bytes of u) as f16, two per word (lo: bytes 0 and 1, hi: bytes 2 and 3),
// in units of FP8_F16_UNIT: from sm_89 the hardware conversion gives the values themselves;
// before it, the exponent field moves as it is (f16's bias is 8 more than e4m3's), which gives
// 1/256 of each value, subnormals exact too.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define FP8_F16_UNIT 1.0f
__device__ __forceinline__ void e4m3x4_to_f16x4(unsigned int u, unsigned int& lo,
                                                unsigned int& hi) {
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(u));
}
#else
#define FP8_F16_UNIT 256.0f
__device__ __forceinline__ void e4m3x4_to_f16x4(unsigned int u, unsigned int& lo,
                                                unsigned int& hi) {
    const unsigned int a = __byte_perm(u, 0u, 0x1404u);  // byte 0 -> bits 8-15, 1 -> 24-31
    const unsigned int b = __byte_perm(u, 0u, 0x3424u);
    lo = (a & 0x80008000u) | ((a & 0x7f007f00u) >> 1);
    hi = (b & 0x80008000u) | ((b & 0x7f007f00u) >> 1);
}
#endif

// An f16 bit pattern as f32.
__device__ __forceinline__ float h2f(unsigned int h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}

// The row kernels below keep a thread's vectors of 8 values in registers between their
// passes, packed as bf16 (every value they keep is a bf16 value): keep[v] is the thread's v-th
// vector. Selected by unrolled compares, so the array stays in registers.
template <int N>
__device__ __forceinline__ void keep_put(uint4 (&k)[N], int v, uint4 x) {
#pragma unroll
    for (int u = 0; u < N; ++u)
        if (u == v) k[u] = x;
}
template <int N>
__device__ __forceinline__ uint4 keep_get(const uint4 (&k)[N], int v) {
    uint4 r = k[0];
#pragma unroll
    for (int u = 1; u < N; ++u)
        if (u == v) r = k[u];
    return r;
}

// Eight e4m3 bytes of v[] / s (packed little-endian), rounded as f2e4m3 rounds. From sm_89
// the hardware conversion (nearest even, saturated to the largest finite value: the bits of
// f2e4m3 for every input but NaN's sign) does two values per instruction.
__device__ __forceinline__ uint2 quant8_e4m3(const float* v, float s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned int w[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        unsigned short h;
        // the second source goes to the low byte
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
            : "=h"(h)
            : "f"(v[2 * p + 1] / s), "f"(v[2 * p] / s));
        w[p] = h;
    }
    return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
#else
    unsigned int w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j >> 2] |= f2e4m3(v[j] / s) << (8 * (j & 3));
    return make_uint2(w[0], w[1]);
#endif
}

// Rows the row kernels read once (activations streamed through them) are loaded without
// allocating in L1, so the per-column scales and weights that every row reads stay there.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Eight floats rounded to bf16 in pairs (one conversion instruction per pair): v[j] = rbf(v[j])
// for every value but NaN, which stays a NaN (of the conversion's payload).
__device__ __forceinline__ void round8_bf16(float* v) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const unsigned int w = pack_bf2(v[2 * p], v[2 * p + 1]);
        v[2 * p] = __uint_as_float(w << 16);
        v[2 * p + 1] = __uint_as_float(w & 0xffff0000u);
    }
}

// The activations' quantization divides by the row's scale through its reciprocal, with the
// same result as the IEEE division v / s that quant8_e4m3 (and quantize_rows_fp8, which also
// quantizes the weights at load) performs. With r = 1 / s correctly rounded: q0 = v r is within
// 1.5 ulp of v / s; one correction (e = s q0 - v is exact by FMA) makes it faithful, and a second
// is Markstein's step, which from a faithful quotient and a correctly rounded reciprocal gives
// the correctly rounded quotient. The residual is formed as s q - v (not v - s q) so a zero v
// keeps its sign, as the division keeps it. Valid while nothing underflows: the row keeps the
// division when its scale is outside [2^-60, 2^60] (row_recip returns 0); inside that range a
// quotient too small for the steps to be exact is below 2^-11, which rounds to a signed zero in
// e4m3 either way. kernel_check's exhaustive case compares every bf16 value against every bf16
// row maximum (its 128 mantissas, several exponents) with the host's division, byte for byte.
__device__ __forceinline__ float row_recip(float s) {
    return (s >= 0x1p-60f && s <= 0x1p60f) ? 1.0f / s : 0.0f;
}

__device__ __forceinline__ float quot_recip(float v, float s, float r) {
    const float q0 = __fmul_rn(v, r);
    const float q1 = __fmaf_rn(-__fmaf_rn(s, q0, -v), r, q0);
    return __fmaf_rn(-__fmaf_rn(s, q1, -v), r, q1);
}

// quant8_e4m3(v, s) through the reciprocal r = row_recip(s) (non-zero).
__device__ __forceinline__ uint2 quant8_e4m3_recip(const float* v, float s, float r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned int w[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        unsigned short h;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
            : "=h"(h)
            : "f"(quot_recip(v[2 * p + 1], s, r)), "f"(quot_recip(v[2 * p], s, r)));
        w[p] = h;
    }
    return make_uint2(__byte_perm(w[0], w[1], 0x5410), __byte_perm(w[2], w[3], 0x5410));
#else
    unsigned int w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j >> 2] |= f2e4m3(quot_recip(v[j], s, r)) << (8 * (j & 3));
    return make_uint2(w[0], w[1]);
#endif
}

// Eight values of a kept vector (bf16, packed) quantized with the row's scale s and r =
// row_recip(s): through the reciprocal, or the division where r is 0.
__device__ __forceinline__ uint2 quant8_kept(uint4 kept, float s, float r) {
    float f[8];
    unpack8(kept, f);
    return r != 0.0f ? quant8_e4m3_recip(f, s, r) : quant8_e4m3(f, s);
}

// The row's scale from the largest magnitude of its values before their last rounding to bf16:
// rounding is monotonic and symmetric, so rbf of that maximum is the maximum of the rounded
// values (NaN is ignored by fmaxf either way).
__device__ __forceinline__ float scale_of(float amax_unrounded) {
    const float amax = rbf(amax_unrounded);
    return amax > 0.0f ? amax / FP8_MAX : 1.0f;
}

// A thread's vectors of rows of nvec 8-value vectors (vector threadIdx.x + v blockDim.x), read
// as streamed rows; zero for the vectors past the row or when `ok` is false.
template <int V>
__device__ __forceinline__ void load_row(uint4 (&d)[V], const uint4* src, int nvec, bool ok) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
        const int i = threadIdx.x + v * blockDim.x;
        d[v] = (ok && i < nvec) ? ld_stream(src + i) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// Vectors per thread quantize_rows_fp8 holds in its prefetching form (blocks of up to 1024
// threads: rows up to 32768 values) and keeps in its fallback form (longer rows are read again).
#define QUANT_VEC 4
#define QUANT_KEEP 8

// `rows` x `k` bf16 values to e4m3 `q` (same shape) and `scale[row]`, each row with its own
// scale (the division v / s of quant8_e4m3: the weights at load are quantized here too). Blocks
// take rows blockIdx.x, + gridDim.x, ...; rows with k % 8 == 0 and at most QUANT_VEC vectors per
// thread are held in registers, and the next row's loads are in flight while a row is reduced
// and written. Other rows: 8-value vectors kept between the passes (up to QUANT_KEEP per thread,
// longer rows read again), or one value at a time when k % 8 != 0.
extern "C" __global__ void __launch_bounds__(1024)
    quantize_rows_fp8(const bf16_t* __restrict__ x, unsigned char* __restrict__ q,
                      float* __restrict__ scale, int k, unsigned int rows) {
    __shared__ float red[32];
    pdl_wait();
    const int nvec = k / 8;
    if ((k & 7) == 0 && nvec <= QUANT_VEC * (int)blockDim.x) {
        unsigned int row = blockIdx.x;
        uint4 cur[QUANT_VEC];
        load_row(cur, (const uint4*)(x + (size_t)row * k), nvec, row < rows);
        for (; row < rows; row += gridDim.x) {
            const unsigned int next = row + gridDim.x;
            uint4 nxt[QUANT_VEC];
            load_row(nxt, (const uint4*)(x + (size_t)next * k), nvec, next < rows);
            float amax = 0.0f;
#pragma unroll
            for (int v = 0; v < QUANT_VEC; ++v) {
                float f[8];
                unpack8(cur[v], f);
#pragma unroll
                for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
            }
            amax = block_max(amax, red);
            const float s = amax > 0.0f ? amax / FP8_MAX : 1.0f;
            uint2* qr = (uint2*)(q + (size_t)row * k);
#pragma unroll
            for (int v = 0; v < QUANT_VEC; ++v) {
                const int i = threadIdx.x + v * blockDim.x;
                if (i < nvec) {
                    float f[8];
                    unpack8(cur[v], f);
                    qr[i] = quant8_e4m3(f, s);
                }
            }
            if (threadIdx.x == 0) scale[row] = s;
#pragma unroll
            for (int v = 0; v < QUANT_VEC; ++v) cur[v] = nxt[v];
        }
        pdl_trigger_end();
        return;
    }
    for (unsigned int row = blockIdx.x; row < rows; row += gridDim.x) {
        const bf16_t* xr = x + (size_t)row * k;
        unsigned char* qr = q + (size_t)row * k;
        float amax = 0.0f;
        if ((k & 7) == 0) {
            const uint4* xv = (const uint4*)xr;
            const bool in_regs = nvec <= QUANT_KEEP * (int)blockDim.x;
            uint4 keep[QUANT_KEEP];
            for (int i = threadIdx.x, v = 0; i < nvec; i += blockDim.x, ++v) {
                const uint4 raw = xv[i];
                float f[8];
                unpack8(raw, f);
#pragma unroll
                for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
                if (in_regs) keep_put(keep, v, raw);
            }
            amax = block_max(amax, red);
            const float s = amax > 0.0f ? amax / FP8_MAX : 1.0f;
            for (int i = threadIdx.x, v = 0; i < nvec; i += blockDim.x, ++v) {
                float f[8];
                unpack8(in_regs ? keep_get(keep, v) : xv[i], f);
                ((uint2*)qr)[i] = quant8_e4m3(f, s);
            }
            if (threadIdx.x == 0) scale[row] = s;
        } else {
            for (int i = threadIdx.x; i < k; i += blockDim.x)
                amax = fmaxf(amax, fabsf(bf2f(xr[i])));
            amax = block_max(amax, red);
            const float s = amax > 0.0f ? amax / FP8_MAX : 1.0f;
            for (int i = threadIdx.x; i < k; i += blockDim.x)
                qr[i] = (unsigned char)f2e4m3(bf2f(xr[i]) / s);
            if (threadIdx.x == 0) scale[row] = s;
        }
    }
    pdl_trigger_end();
}

// The inverse, for the GEMM's fallback path: y[row] = bf16(scale[row] * e4m3 value).
extern "C" __global__ void __launch_bounds__(256)
    dequantize_rows_fp8(const unsigned char* __restrict__ q, const float* __restrict__ scale,
                        bf16_t* __restrict__ y, int k) {
    pdl_wait();
    const size_t row = blockIdx.x;
    const float s = scale[row];
    const unsigned char* qr = q + row * (size_t)k;
    bf16_t* yr = y + row * (size_t)k;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        unsigned int lo, hi;
        e4m3x4_to_f16x4(qr[i], lo, hi);
        yr[i] = f2bf(h2f(lo & 0xffffu) * FP8_F16_UNIT * s);
    }
    pdl_trigger_end();
}

// The scales of an FP8 GEMM (per token row and per weight row) applied after cuBLASLt, whose
// FP8 GEMMs on sm_90 take only one scale per matrix: y[t, o] = bf16(d[t, o] * xs[t] * ws[o])
// (+ y[t, o] when `accumulate`, summed in f32 and rounded once). d may be y itself. One thread
// per 8 outputs; grid (ceil(n / 2048), tokens); n % 8 == 0.
extern "C" __global__ void __launch_bounds__(256)
    fp8_rescale_bf16(bf16_t* __restrict__ y, const bf16_t* d, const float* __restrict__ xs,
                     const float* __restrict__ ws, int n, int accumulate) {
    pdl_wait();
    const size_t t = blockIdx.y;
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (c < n) {
        float v[8], w[8];
        unpack8(*(const uint4*)(d + t * n + c), v);
        const float4 w0 = *(const float4*)(ws + c), w1 = *(const float4*)(ws + c + 4);
        w[0] = w0.x; w[1] = w0.y; w[2] = w0.z; w[3] = w0.w;
        w[4] = w1.x; w[5] = w1.y; w[6] = w1.z; w[7] = w1.w;
        const float s = xs[t];
        float o[8];
        if (accumulate) unpack8(*(const uint4*)(y + t * n + c), o);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = v[i] * s * w[i] + (accumulate ? o[i] : 0.0f);
        *(uint4*)(y + t * n + c) = pack8(o);
    }
    pdl_trigger_end();
}

// The scales of an FP8 GEMM's unscaled product applied to 8 of its values, rounded to bf16 as
// fp8_rescale_bf16 rounds them: v[j] = bf16(v[j] * sx * ws[j] + 0) (ws 16-byte aligned; the
// + 0 is fp8_rescale_bf16's, which turns a product of -0 into +0).
__device__ __forceinline__ void rescale8(float* v, float sx, const float* ws) {
    const float4 w0 = __ldg((const float4*)ws), w1 = __ldg((const float4*)(ws + 4));
    const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * sx * w[j] + 0.0f;
    round8_bf16(v);
}

// Eight values that are bf16 already, packed (exactly: their high halves).
__device__ __forceinline__ uint4 pack8_exact(const float* f) {
    uint4 r;
    r.x = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632);
    r.y = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632);
    r.z = __byte_perm(__float_as_uint(f[4]), __float_as_uint(f[5]), 0x7632);
    r.w = __byte_perm(__float_as_uint(f[6]), __float_as_uint(f[7]), 0x7632);
    return r;
}

// Vectors per thread the long-row form of add_rmsnorm_quant_fp8 keeps (its block has hidden / 8
// threads, at most 1024): rows up to 32768 values; longer rows are read again for each pass.
#define NORM_KEEP 4

// One row of add_rmsnorm_quant_fp8 whose vectors are one per thread (hidden <= 8 blockDim.x):
// `res`, `dlt` this thread's residual and delta vectors (zero past the row), `g` its norm
// weights, `ws` its delta scales (MODE 2). MODE: 0 no delta, 1 a bf16 delta, 2 an FP8 GEMM's
// unscaled product with its row scale sx. Writes the residual (MODE > 0), the e4m3 vector and
// (thread 0) the row's scale.
template <int MODE>
__device__ __forceinline__ void norm_quant_row(uint4 res, uint4 dlt, float sx, const float* g,
                                               const float* ws, uint4* res_out, uint2* q_out,
                                               float* qscale_out, bool active, int hidden,
                                               float eps, float* scratch) {
    float x[8];
    unpack8(res, x);
    if (MODE > 0) {
        float d[8];
        unpack8(dlt, d);
        if (MODE == 2) {
#pragma unroll
            for (int j = 0; j < 8; ++j) d[j] = d[j] * sx * ws[j] + 0.0f;
            round8_bf16(d);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] = x[j] + d[j];
        round8_bf16(x);
        if (active) *res_out = pack8_exact(x);
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += x[j] * x[j];
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)hidden + eps);
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = x[j] * inv;
    round8_bf16(x);
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        x[j] = g[j] * x[j];
        amax = fmaxf(amax, fabsf(x[j]));
    }
    round8_bf16(x);
    const float s = scale_of(block_max(amax, scratch));
    const float r = row_recip(s);
    if (active) *q_out = r != 0.0f ? quant8_e4m3_recip(x, s, r) : quant8_e4m3(x, s);
    if (threadIdx.x == 0) *qscale_out = s;
}

// This thread's residual and delta vectors of row `row` (zero past the row or the rows) and the
// row's scale, issued as streamed loads.
template <int MODE>
struct NormIn {
    uint4 res, dlt;
    float sx;
    __device__ __forceinline__ void load(const bf16_t* residual, const bf16_t* delta,
                                         const float* dxs, size_t h, unsigned int row,
                                         unsigned int rows, bool active) {
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        res = zero;
        dlt = zero;
        sx = 0.0f;
        if (row < rows) {
            if (active) res = ld_stream((const uint4*)(residual + row * h) + threadIdx.x);
            if (MODE > 0 && active) dlt = ld_stream((const uint4*)(delta + row * h) + threadIdx.x);
            if (MODE == 2) sx = dxs[row];
        }
    }
};

template <int MODE>
__device__ __forceinline__ void norm_quant_rows(unsigned char* __restrict__ q, float* qscale,
                                                bf16_t* __restrict__ residual,
                                                const bf16_t* __restrict__ delta,
                                                const float* dxs, const float* __restrict__ dws,
                                                const bf16_t* __restrict__ weight, int hidden,
                                                float eps, unsigned int rows, float* scratch) {
    const int i = threadIdx.x;
    const bool active = i < hidden / 8;
    // this thread's columns are the same in every row: their norm weights and delta scales
    const uint4 graw = active ? ((const uint4*)weight)[i] : make_uint4(0u, 0u, 0u, 0u);
    float ws[8];
    if (MODE == 2) {
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 w0 = active ? __ldg((const float4*)(dws + (size_t)i * 8)) : z;
        const float4 w1 = active ? __ldg((const float4*)(dws + (size_t)i * 8 + 4)) : z;
        ws[0] = w0.x; ws[1] = w0.y; ws[2] = w0.z; ws[3] = w0.w;
        ws[4] = w1.x; ws[5] = w1.y; ws[6] = w1.z; ws[7] = w1.w;
    }
    const size_t h = hidden;
    const unsigned int step = gridDim.x;
    // the loads of the next two rows in flight while a row is reduced and written (`dxs` may
    // be `qscale`: a later row's scale is written by this block, after it is read here)
    NormIn<MODE> cur, n1, n2;
    cur.load(residual, delta, dxs, h, blockIdx.x, rows, active);
    n1.load(residual, delta, dxs, h, blockIdx.x + step, rows, active);
    for (unsigned int row = blockIdx.x; row < rows; row += step) {
        n2.load(residual, delta, dxs, h, row + 2 * step, rows, active);
        float g[8];
        unpack8(graw, g);
        norm_quant_row<MODE>(cur.res, cur.dlt, cur.sx, g, ws, (uint4*)(residual + row * h) + i,
                             (uint2*)(q + row * h) + i, qscale + row, active, hidden, eps,
                             scratch);
        cur = n1;
        n1 = n2;
    }
}

// add_rmsnorm_bf16 followed by quantize_rows_fp8 of its output, in one kernel and with the same
// values: the normalised row goes out as e4m3 bytes `q` and its scale `qscale[row]` instead of
// bf16. With `dxs`, `delta` is the unscaled product of an FP8 GEMM and its scales are applied
// first, as fp8_rescale_bf16 would: delta = bf16(d * dxs[row] * dws[col]). `dxs` may be `qscale`
// (a block reads a row's scale before it writes it; each row is one block's). The block size is
// add_rmsnorm_bf16's and thread t holds the same vectors, so the sum of squares adds in the same
// order. Blocks take rows blockIdx.x, + gridDim.x, ...; with hidden <= 8 blockDim.x (one vector
// per thread) the next row's loads are in flight while a row is reduced and written, and each
// thread's norm weights and delta scales stay in registers. hidden % 8 == 0.
extern "C" __global__ void __launch_bounds__(1024)
    add_rmsnorm_quant_fp8(unsigned char* __restrict__ q, float* qscale,
                          bf16_t* __restrict__ residual, const bf16_t* __restrict__ delta,
                          const float* dxs, const float* __restrict__ dws,
                          const bf16_t* __restrict__ weight, int hidden, float eps,
                          unsigned int rows) {
    pdl_wait();
    pdl_trigger_early();
    __shared__ float scratch[32];
    const int nvec = hidden / 8;
    if (nvec <= (int)blockDim.x) {
        if (delta == nullptr)
            norm_quant_rows<0>(q, qscale, residual, delta, dxs, dws, weight, hidden, eps, rows,
                               scratch);
        else if (dxs == nullptr)
            norm_quant_rows<1>(q, qscale, residual, delta, dxs, dws, weight, hidden, eps, rows,
                               scratch);
        else
            norm_quant_rows<2>(q, qscale, residual, delta, dxs, dws, weight, hidden, eps, rows,
                               scratch);
        pdl_trigger_end();
        return;
    }
    const bool in_regs = nvec <= NORM_KEEP * (int)blockDim.x;
    const uint4* w = (const uint4*)weight;
    for (unsigned int rr = blockIdx.x; rr < rows; rr += gridDim.x) {
        const size_t row = (size_t)rr * hidden;
        uint4* res = (uint4*)(residual + row);
        const float sx = dxs != nullptr ? dxs[rr] : 0.0f;
        uint4 keep[NORM_KEEP];
        float ss = 0.0f;
        for (int i = threadIdx.x, v = 0; i < nvec; i += blockDim.x, ++v) {
            uint4 raw = res[i];
            float x[8];
            unpack8(raw, x);
            if (delta != nullptr) {
                float d[8];
                unpack8(((const uint4*)(delta + row))[i], d);
                if (dxs != nullptr) rescale8(d, sx, dws + (size_t)i * 8);
#pragma unroll
                for (int j = 0; j < 8; ++j) x[j] = rbf(x[j] + d[j]);
                raw = pack8(x);
                res[i] = raw;
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) ss += x[j] * x[j];
            if (in_regs) keep_put(keep, v, raw);
        }
        const float inv = rsqrtf(block_sum(ss, scratch) / (float)hidden + eps);
        // The bf16 output of add_rmsnorm_bf16 (from the kept residual, or for long rows from
        // the residual again): its largest magnitude, then its e4m3 bytes.
        float amax = 0.0f;
        for (int i = threadIdx.x, v = 0; i < nvec; i += blockDim.x, ++v) {
            float x[8], g[8];
            unpack8(in_regs ? keep_get(keep, v) : res[i], x);
            unpack8(w[i], g);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                x[j] = rbf(g[j] * rbf(x[j] * inv));
                amax = fmaxf(amax, fabsf(x[j]));
            }
            if (in_regs) keep_put(keep, v, pack8(x));
        }
        const float s = scale_of(block_max(amax, scratch));
        const float r = row_recip(s);
        uint2* qr = (uint2*)(q + row);
        for (int i = threadIdx.x, v = 0; i < nvec; i += blockDim.x, ++v) {
            uint4 y;
            if (in_regs) {
                y = keep_get(keep, v);
            } else {
                float x[8], g[8];
                unpack8(res[i], x);
                unpack8(w[i], g);
#pragma unroll
                for (int j = 0; j < 8; ++j) x[j] = rbf(g[j] * rbf(x[j] * inv));
                y = pack8(x);
            }
            qr[i] = quant8_kept(y, s, r);
        }
        if (threadIdx.x == 0) qscale[rr] = s;
    }
    pdl_trigger_end();
}

// silu_mul_quant_fp8's largest block, the vectors per thread of its register form (rows up to
// 1024 * 2 * 8 = 16384 values: Llama-3.1-8B's 14336, 70B's at tp 2 and more), and the vectors
// per thread its long-row form keeps (up to 32768 values; longer rows are computed again).
#define SILU_Q_THREADS 1024
#define SILU_Q_VEC 2
#define SILU_KEEP 4

// silu_f32 (silu_mul_bf16's SiLU) of 8 values.
__device__ __forceinline__ void silu8(float* g) {
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = silu_f32(g[j]);
}

// Eight values of silu_mul_bf16 from a gate and an up vector (with SCALED, an FP8 GEMM's
// unscaled product, first rescaled as fp8_rescale_bf16 rounds it; wg, wu their scales), packed
// as bf16; amax takes their magnitudes before the last rounding (see scale_of). The same
// arithmetic as silu_mul_bf16: bf16(bf16(silu_f32(g)) * u).
template <bool SCALED>
__device__ __forceinline__ uint4 silu_mul8(uint4 graw, uint4 uraw, float sx, const float* wg,
                                           const float* wu, float& amax) {
    float g[8], u[8];
    unpack8(graw, g);
    unpack8(uraw, u);
    if (SCALED) {
        rescale8(g, sx, wg);
        rescale8(u, sx, wu);
    }
    silu8(g);
    round8_bf16(g);
    float p[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        p[j] = g[j] * u[j];
        amax = fmaxf(amax, fabsf(p[j]));
    }
    return make_uint4(pack_bf2(p[0], p[1]), pack_bf2(p[2], p[3]), pack_bf2(p[4], p[5]),
                      pack_bf2(p[6], p[7]));
}

// The register form: each thread's SILU_Q_VEC gate and up vectors of a row in registers. The
// next row's loads are not held in registers as well (that doubled the registers and kept one
// 448-thread block on a multiprocessor: 48.8 µs at 1024 x 14336 on an H200, against 44.9 for
// this form in 896 threads); the other warps' loads and arithmetic overlap a row's reductions.
template <bool SCALED>
__device__ __forceinline__ void silu_quant_rows(unsigned char* __restrict__ q, float* qscale,
                                                const bf16_t* __restrict__ gate_up,
                                                const float* dxs, const float* __restrict__ dws,
                                                int inter, unsigned int rows, float* scratch) {
    const int nvec = inter / 8;
    for (unsigned int row = blockIdx.x; row < rows; row += gridDim.x) {
        uint4 cg[SILU_Q_VEC], cu[SILU_Q_VEC];
        const uint4* gu = (const uint4*)(gate_up + row * 2 * (size_t)inter);
        load_row(cg, gu, nvec, true);
        load_row(cu, gu + nvec, nvec, true);
        // `dxs` may be `qscale`: this row's scale is read here and written below by this block
        const float sc = SCALED ? dxs[row] : 0.0f;
        float amax = 0.0f;
#pragma unroll
        for (int v = 0; v < SILU_Q_VEC; ++v) {
            const int i = threadIdx.x + v * blockDim.x;
            if (i < nvec)
                cg[v] = silu_mul8<SCALED>(cg[v], cu[v], sc, dws + (size_t)i * 8,
                                          dws + inter + (size_t)i * 8, amax);
        }
        const float s = scale_of(block_max(amax, scratch));
        const float r = row_recip(s);
        uint2* qr = (uint2*)(q + row * (size_t)inter);
#pragma unroll
        for (int v = 0; v < SILU_Q_VEC; ++v) {
            const int i = threadIdx.x + v * blockDim.x;
            if (i < nvec) qr[i] = quant8_kept(cg[v], s, r);
        }
        if (threadIdx.x == 0) qscale[row] = s;
    }
}

// silu_mul_bf16 followed by quantize_rows_fp8 of its output, in one kernel and with the same
// values: each row of gate_up = [gate | up] (2 inter) becomes `inter` e4m3 bytes of
// bf16(bf16(silu(gate)) * up) and their scale `qscale[row]`. With `dxs`, gate_up is the
// unscaled product of an FP8 GEMM and its scales are applied first, as fp8_rescale_bf16 would
// (dws: 2 inter scales; `dxs` may be `qscale`: each row is one block's, which reads its scale
// before writing it). Blocks of up to SILU_Q_THREADS take rows blockIdx.x, + gridDim.x, ...;
// inter % 8 == 0.
extern "C" __global__ void __launch_bounds__(SILU_Q_THREADS)
    silu_mul_quant_fp8(unsigned char* __restrict__ q, float* qscale,
                       const bf16_t* __restrict__ gate_up, const float* dxs,
                       const float* __restrict__ dws, int inter, unsigned int rows) {
    pdl_wait();
    pdl_trigger_early();
    __shared__ float scratch[32];
    const int nvec = inter / 8;
    if (nvec <= SILU_Q_VEC * (int)blockDim.x) {
        if (dxs != nullptr)
            silu_quant_rows<true>(q, qscale, gate_up, dxs, dws, inter, rows, scratch);
        else
            silu_quant_rows<false>(q, qscale, gate_up, dxs, dws, inter, rows, scratch);
        pdl_trigger_end();
        return;
    }
    // long rows: kept between the passes up to SILU_KEEP vectors per thread, else computed again
    const bool in_regs = nvec <= SILU_KEEP * (int)blockDim.x;
    for (unsigned int row = blockIdx.x; row < rows; row += gridDim.x) {
        const uint4* gu = (const uint4*)(gate_up + row * 2 * (size_t)inter);
        const float sx = dxs != nullptr ? dxs[row] : 0.0f;
        uint4 keep[SILU_KEEP];
        float amax = 0.0f;
        for (int i = threadIdx.x, v = 0; i < nvec; i += blockDim.x, ++v) {
            const uint4 a = dxs != nullptr
                                ? silu_mul8<true>(gu[i], gu[nvec + i], sx, dws + (size_t)i * 8,
                                                  dws + inter + (size_t)i * 8, amax)
                                : silu_mul8<false>(gu[i], gu[nvec + i], sx, dws, dws, amax);
            if (in_regs) keep_put(keep, v, a);
        }
        const float s = scale_of(block_max(amax, scratch));
        const float r = row_recip(s);
        uint2* qr = (uint2*)(q + row * (size_t)inter);
        for (int i = threadIdx.x, v = 0; i < nvec; i += blockDim.x, ++v) {
            float unused = 0.0f;
            const uint4 a = in_regs ? keep_get(keep, v)
                            : dxs != nullptr
                                ? silu_mul8<true>(gu[i], gu[nvec + i], sx, dws + (size_t)i * 8,
                                                  dws + inter + (size_t)i * 8, unused)
                                : silu_mul8<false>(gu[i], gu[nvec + i], sx, dws, dws, unused);
            qr[i] = quant8_kept(a, s, r);
        }
        if (threadIdx.x == 0) qscale[row] = s;
    }
    pdl_trigger_end();
}
