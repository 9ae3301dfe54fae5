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

// One block per row of `rows` x `k` bf16 values: q (same shape, e4m3) and scale[row]. Rows
// with k % 8 == 0 are read as 8-value vectors and kept in registers between the two passes
// (up to QUANT_KEEP * 8 * 256 values; longer ones are read again); others one value at a time.
#define QUANT_KEEP 8
extern "C" __global__ void __launch_bounds__(256)
    quantize_rows_fp8(const bf16_t* __restrict__ x, unsigned char* __restrict__ q,
                      float* __restrict__ scale, int k) {
    __shared__ float red[32];
    pdl_wait();
    const size_t row = blockIdx.x;
    const bf16_t* xr = x + row * (size_t)k;
    unsigned char* qr = q + row * (size_t)k;
    float amax = 0.0f;
    if ((k & 7) == 0) {
        const uint4* xv = (const uint4*)xr;
        const int nvec = k / 8;
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
        for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(bf2f(xr[i])));
        amax = block_max(amax, red);
        const float s = amax > 0.0f ? amax / FP8_MAX : 1.0f;
        for (int i = threadIdx.x; i < k; i += blockDim.x)
            qr[i] = (unsigned char)f2e4m3(bf2f(xr[i]) / s);
        if (threadIdx.x == 0) scale[row] = s;
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
// fp8_rescale_bf16 rounds them: v[j] = bf16(v[j] * sx * ws[j]) (ws 16-byte aligned).
__device__ __forceinline__ void rescale8(float* v, float sx, const float* ws) {
    const float4 w0 = *(const float4*)ws, w1 = *(const float4*)(ws + 4);
    const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = rbf(v[j] * sx * w[j]);
}

// Vectors per thread add_rmsnorm_quant_fp8 keeps (its block has hidden / 8 threads, at most
// 1024): rows up to 32768 values; longer rows are read again for each pass.
#define NORM_KEEP 4

// add_rmsnorm_bf16 followed by quantize_rows_fp8 of its output, in one kernel and with the same
// values: the normalised row goes out as e4m3 bytes `q` and its scale `qscale[row]` instead of
// bf16. With `dxs`, `delta` is the unscaled product of an FP8 GEMM and its scales are applied
// first, as fp8_rescale_bf16 would: delta = bf16(d * dxs[row] * dws[col]). `dxs` may be `qscale`
// (a block reads its row's scale before anything writes it). The block size is
// add_rmsnorm_bf16's, so the sum of squares adds in the same order. hidden % 8 == 0.
extern "C" __global__ void add_rmsnorm_quant_fp8(unsigned char* __restrict__ q, float* qscale,
                                                 bf16_t* __restrict__ residual,
                                                 const bf16_t* __restrict__ delta,
                                                 const float* dxs, const float* __restrict__ dws,
                                                 const bf16_t* __restrict__ weight, int hidden,
                                                 float eps) {
    pdl_wait();
    pdl_trigger_early();
    __shared__ float scratch[32];
    const size_t row = (size_t)blockIdx.x * hidden;
    uint4* res = (uint4*)(residual + row);
    const int nvec = hidden / 8;
    const bool in_regs = nvec <= NORM_KEEP * (int)blockDim.x;
    const float sx = dxs != nullptr ? dxs[blockIdx.x] : 0.0f;
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
    const uint4* w = (const uint4*)weight;
    // The bf16 output of add_rmsnorm_bf16 (from the kept residual, or for long rows from the
    // residual again): its largest magnitude, then its e4m3 bytes.
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
    amax = block_max(amax, scratch);
    const float s = amax > 0.0f ? amax / FP8_MAX : 1.0f;
    uint2* qr = (uint2*)(q + row);
    for (int i = threadIdx.x, v = 0; i < nvec; i += blockDim.x, ++v) {
        float x[8];
        if (in_regs) {
            unpack8(keep_get(keep, v), x);
        } else {
            float g[8];
            unpack8(res[i], x);
            unpack8(w[i], g);
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = rbf(g[j] * rbf(x[j] * inv));
        }
        qr[i] = quant8_e4m3(x, s);
    }
    if (threadIdx.x == 0) qscale[blockIdx.x] = s;
    pdl_trigger_end();
}

// Threads of silu_mul_quant_fp8's block and the vectors each keeps: rows up to 256 * 8 * 8 =
// 16384 values (Llama-3.1-8B's 14336, 70B's at tp 2 and more) are computed once; longer rows
// are computed again for the second pass.
#define SILU_Q_THREADS 256
#define SILU_KEEP 8

// silu_mul_bf16 followed by quantize_rows_fp8 of its output, in one kernel and with the same
// values: each row of gate_up = [gate | up] (2 inter) becomes `inter` e4m3 bytes of
// bf16(bf16(silu(gate)) * up) and their scale `qscale[row]`. With `dxs`, gate_up is the
// unscaled product of an FP8 GEMM and its scales are applied first, as fp8_rescale_bf16 would
// (dws: 2 inter scales; `dxs` may be `qscale`). One block of SILU_Q_THREADS per row; inter % 8
// == 0.
__device__ __forceinline__ void silu_mul8(const uint4* gu, int i, int nvec, float sx,
                                          const float* dws, int inter, float* a) {
    float g[8], u[8];
    unpack8(gu[i], g);
    unpack8(gu[nvec + i], u);
    if (dws != nullptr) {
        rescale8(g, sx, dws + (size_t)i * 8);
        rescale8(u, sx, dws + inter + (size_t)i * 8);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = rbf(rbf(g[j] / (1.0f + expf(-g[j]))) * u[j]);
}

extern "C" __global__ void __launch_bounds__(SILU_Q_THREADS)
    silu_mul_quant_fp8(unsigned char* __restrict__ q, float* qscale,
                       const bf16_t* __restrict__ gate_up, const float* dxs,
                       const float* __restrict__ dws, int inter) {
    pdl_wait();
    pdl_trigger_early();
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const uint4* gu = (const uint4*)(gate_up + row * 2 * (size_t)inter);
    const int nvec = inter / 8;
    const bool in_regs = nvec <= SILU_KEEP * (int)blockDim.x;
    const float sx = dxs != nullptr ? dxs[row] : 0.0f;
    const float* ws = dxs != nullptr ? dws : nullptr;
    uint4 keep[SILU_KEEP];
    float amax = 0.0f;
    if (in_regs) {
        // every load of the thread's gate vectors first (up's follow in the loop), so many
        // are in flight at once
#pragma unroll
        for (int v = 0; v < SILU_KEEP; ++v) {
            const int i = threadIdx.x + v * blockDim.x;
            if (i < nvec) keep[v] = gu[i];
        }
#pragma unroll
        for (int v = 0; v < SILU_KEEP; ++v) {
            const int i = threadIdx.x + v * blockDim.x;
            if (i < nvec) {
                float g[8], u[8], a[8];
                unpack8(keep[v], g);
                unpack8(gu[nvec + i], u);
                if (ws != nullptr) {
                    rescale8(g, sx, ws + (size_t)i * 8);
                    rescale8(u, sx, ws + inter + (size_t)i * 8);
                }
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    a[j] = rbf(rbf(g[j] / (1.0f + expf(-g[j]))) * u[j]);
                    amax = fmaxf(amax, fabsf(a[j]));
                }
                keep[v] = pack8(a);
            }
        }
    } else {
        for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
            float a[8];
            silu_mul8(gu, i, nvec, sx, ws, inter, a);
#pragma unroll
            for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(a[j]));
        }
    }
    amax = block_max(amax, scratch);
    const float s = amax > 0.0f ? amax / FP8_MAX : 1.0f;
    uint2* qr = (uint2*)(q + row * (size_t)inter);
    if (in_regs) {
#pragma unroll
        for (int v = 0; v < SILU_KEEP; ++v) {
            const int i = threadIdx.x + v * blockDim.x;
            if (i < nvec) {
                float a[8];
                unpack8(keep[v], a);
                qr[i] = quant8_e4m3(a, s);
            }
        }
    } else {
        for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
            float a[8];
            silu_mul8(gu, i, nvec, sx, ws, inter, a);
            qr[i] = quant8_e4m3(a, s);
        }
    }
    if (threadIdx.x == 0) qscale[row] = s;
    pdl_trigger_end();
}
