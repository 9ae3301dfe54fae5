// Skinny GEMM for decode: y[m, n] = sum_k x[m, k] * w[n, k] for M <= 8 token rows, bf16 in and
// out, f32 accumulation, weights row-major [N, K] (the checkpoint layout, as cuBLASLt uses it).
//
// The tensor cores do the arithmetic (mma m16n8k16): 16 weight rows are the A operand and the
// (up to 8) tokens the 8 columns of B, so one kernel serves every M and the weight stream alone
// sets the pace. The sum over k does not care which k lands in which MMA slot as long as A and B
// agree: lane (g, t) of the warp (g = lane / 4, t = lane % 4) owns the k-slots {2t, 2t+1, 2t+8,
// 2t+9} of both operands, so it loads 8 consecutive weights of rows g and g + 8 (one 16-byte
// load each) and the same 8 positions of token g's x row, and feeds elements 0-3 to one MMA and
// 4-7 to the next. A warp step covers 4 * CH such 8-wide chunks of k for 16 * RT rows; the next
// step's loads are issued before the current step's MMAs. The GV_WARPS warps of a block split k
// and are summed through shared memory; with `splits` > 1, blocks along grid.y split k further,
// and the last block of a tile to finish (counted in `counters`, reset by that block) sums the
// partials in split order, so results never depend on timing.
//
// FP8 weights (the gemv_*fp8_* entries): w is e4m3 [N, K] with one f32 scale per row. A lane's
// 16-byte load then holds 16 weights, two of the 8-wide chunks above, and the x rows are loaded
// to match; the weights become f16 numbers of 1/256 of their value (exact, subnormals too: see
// e4m3x4_to_f16x4) and x is converted to f16 (exact for bf16 values of magnitude 2^-14 to
// 65504; larger ones saturate, smaller ones keep fewer bits), so the f16 MMA sums exact
// products in f32, and the epilogue multiplies each row's sum by FP8_F16_UNIT * scale[row]
// before it rounds. A step covers as many elements as the bf16 kernel's (half the bytes): with twice the
// bytes per step (and x single-buffered to fit the registers) the kernel ran 12% slower.
//
// Epilogues (`mode`): 0 store, 1 add into y (y += x w^T), 2 SwiGLU of a fused [gate; up] weight
// of N = 2 * inter rows: each 16-row MMA tile holds 8 gate rows (A rows 0-7) and the matching 8
// up rows (A rows 8-15), and the block writes act[m, f] = bf16(bf16(silu(bf16(gate))) *
// bf16(up)) for its features f, as silu_mul_bf16 does after an unfused GEMM.
//
// Programmatic dependent launch: weights never change, so each warp issues its first step's
// weight loads (and L2 prefetches of the `pf_steps` steps after it) before pdl_wait, while the
// kernel before it drains; x, the split partials, the counters and y are touched only after
// the wait. Once its main loop is done a block lets the next kernel start launching.
//
// RMSNorm fused into the input (the gemv_rms_* entries): x is the raw residual stream and each
// block first computes every token row's 1 / rms itself (the rows are L2 hits), then normalises
// x as it loads it, rounding as add_rmsnorm_bf16 does: bf16(norm_w * bf16(x * inv)).

#define GV_WARPS 8
#define GV_THREADS (GV_WARPS * 32)
#define GV_MAX_M 8

// Weights are read once per pass: no L1 allocation, so x stays resident there. Weights never
// change, so these loads may run before pdl_wait (and the compiler may move them freely).
__device__ __forceinline__ uint4 gv_ld_weights(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ void gv_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Activations are written by earlier kernels: ordinary (coherent) loads, cached in L1, and
// volatile so that they stay after pdl_wait. Predicated in the instruction (zeros where `ok`
// is false, p then never dereferenced) rather than branched around, so that a run of them
// issues back to back before any result is used.
__device__ __forceinline__ uint4 gv_ld_act(const uint4* p, bool ok) {
    uint4 v = make_uint4(0, 0, 0, 0);
    asm volatile(
        "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %4, 0;\n\t"
        "@q ld.global.v4.u32 {%0, %1, %2, %3}, [%5];\n\t}"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "r"((int)ok), "l"(p));
    return v;
}

// RMSNorm weights are constants re-read by every block: read-only path, cached; predicated
// like gv_ld_act.
__device__ __forceinline__ uint4 gv_ld_const(const uint4* p, bool ok) {
    uint4 v = make_uint4(0, 0, 0, 0);
    asm("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %4, 0;\n\t"
        "@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%5];\n\t}"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "r"((int)ok), "l"(p));
    return v;
}

// Partials written by other blocks: read from L2, never from a stale L1 line.
__device__ __forceinline__ float gv_ld_partial(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// bf16(g * bf16(x * inv)) for 8 elements: add_rmsnorm_bf16's f32 products and rounding points
// (cvt.rn rounds to nearest even like f2bf; only a NaN's payload may differ).
__device__ __forceinline__ uint4 gv_rmsnorm8(const uint4 xv, const uint4 gv, float inv) {
    const unsigned int xs[4] = {xv.x, xv.y, xv.z, xv.w};
    const unsigned int gs[4] = {gv.x, gv.y, gv.z, gv.w};
    unsigned int o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int n = pack_bf2(__uint_as_float(xs[i] << 16) * inv,
                                        __uint_as_float(xs[i] & 0xffff0000u) * inv);
        o[i] = pack_bf2(__uint_as_float(gs[i] << 16) * __uint_as_float(n << 16),
                        __uint_as_float(gs[i] & 0xffff0000u) * __uint_as_float(n & 0xffff0000u));
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

// s_inv[m] = 1 / sqrt(mean(x[m]^2) + eps) for the M rows of x, in f32 as add_rmsnorm_bf16
// computes it (the order of the sum of squares differs). Every thread of the block calls it.
__device__ __forceinline__ void gv_inv_rms(const bf16_t* __restrict__ x, int M, int K, float eps,
                                           float* s_part /* [GV_WARPS][GV_MAX_M] */,
                                           float* s_inv /* [GV_MAX_M] */) {
    const int k8 = K >> 3;
    const uint4* x4 = (const uint4*)x;
    float ss[GV_MAX_M];
#pragma unroll
    for (int m = 0; m < GV_MAX_M; ++m) ss[m] = 0.0f;
    for (int i = threadIdx.x; i < k8; i += GV_THREADS) {
        uint4 v[GV_MAX_M];  // every row's load in flight before the first is used
#pragma unroll
        for (int m = 0; m < GV_MAX_M; ++m) v[m] = gv_ld_act(x4 + (size_t)m * k8 + i, m < M);
#pragma unroll
        for (int m = 0; m < GV_MAX_M; ++m) {
            float f[8];
            unpack8(v[m], f);
#pragma unroll
            for (int j = 0; j < 8; ++j) ss[m] += f[j] * f[j];
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int m = 0; m < GV_MAX_M; ++m) {
        if (m < M) {
            const float v = warp_sum(ss[m]);
            if (lane == 0) s_part[warp * GV_MAX_M + m] = v;
        }
    }
    __syncthreads();
    if ((int)threadIdx.x < M) {
        float total = 0.0f;
#pragma unroll
        for (int wi = 0; wi < GV_WARPS; ++wi) total += s_part[wi * GV_MAX_M + threadIdx.x];
        s_inv[threadIdx.x] = rsqrtf(total / (float)K + eps);
    }
    __syncthreads();
}

// A lane's registers for one step: CH 16-byte weight units of its two rows per sub-tile, and
// the x chunks they meet (one 8-wide chunk per unit in bf16, two in FP8).
template <int RT, int CH, bool FP8>
struct GvFrag {
    uint4 w[RT][2][CH];  // [sub-tile][row g, row g + 8][unit]
    uint4 x[FP8 ? 2 * CH : CH];
};

// Two bf16 values as f16x2, saturated to the f16 range.
__device__ __forceinline__ unsigned int bf2_to_h2(unsigned int v) {
    unsigned int r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;"
        : "=r"(r)
        : "f"(__uint_as_float(v & 0xffff0000u)), "f"(__uint_as_float(v << 16)));
    return r;
}

__device__ __forceinline__ uint4 bf8_to_h8(const uint4 v) {
    return make_uint4(bf2_to_h2(v.x), bf2_to_h2(v.y), bf2_to_h2(v.z), bf2_to_h2(v.w));
}

template <int RT, int CH, bool FP8>
__device__ __forceinline__ void gv_load_w(GvFrag<RT, CH, FP8>& f,
                                          const uint4* const (&wr)[RT][2], int c0, int k8) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int ch = c0 + 4 * c;
        const bool ok = ch < k8;
#pragma unroll
        for (int j = 0; j < RT; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                f.w[j][h][c] = ok ? gv_ld_weights(wr[j][h] + ch) : make_uint4(0, 0, 0, 0);
            }
        }
    }
}

// L2 prefetch of chunks [c_beg, c_end) of the lane's weight rows, one prefetch per 128 bytes
// (8 chunks): the four lanes t of a row group take every fourth such piece.
template <int RT>
__device__ __forceinline__ void gv_prefetch_w(const uint4* const (&wr)[RT][2], int c_beg,
                                              int c_end, int t) {
    for (int c = c_beg + 8 * t; c < c_end; c += 32) {
#pragma unroll
        for (int j = 0; j < RT; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) gv_prefetch_l2(wr[j][h] + c);
        }
    }
}

// x chunks of the lane's token row (zeros past k or past the M rows), normalised with NORM
// once every chunk's loads are in flight.
// With FP8, unit ch covers the x chunks 2 ch and 2 ch + 1, converted to f16.
template <int RT, int CH, bool NORM, bool FP8>
__device__ __forceinline__ void gv_load_x(GvFrag<RT, CH, FP8>& f, const uint4* xr,
                                          const uint4* nw, bool has_x, int c0, int k8,
                                          float inv) {
    constexpr int PER = FP8 ? 2 : 1;  // x chunks per weight unit
    constexpr int NX = PER * CH;
    uint4 g[NX];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int ch = c0 + 4 * c;
        const bool ok = has_x && ch < k8;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            f.x[PER * c + e] = gv_ld_act(xr + PER * ch + e, ok);
            if (NORM) g[PER * c + e] = gv_ld_const(nw + PER * ch + e, ok);
        }
    }
    if (NORM) {
#pragma unroll
        for (int c = 0; c < NX; ++c) f.x[c] = gv_rmsnorm8(f.x[c], g[c], inv);
    }
    if (FP8) {
#pragma unroll
        for (int c = 0; c < NX; ++c) f.x[c] = bf8_to_h8(f.x[c]);
    }
}

template <int RT, int CH, bool FP8>
__device__ __forceinline__ void gv_mma(float (&acc)[RT][4], const GvFrag<RT, CH, FP8>& f) {
    if (FP8) {
        // unit c: bytes 0-7 meet x chunk 2c, bytes 8-15 chunk 2c + 1; each 4 bytes are the
        // elements (0, 1) and (2, 3) of one MMA, as .x and .y of a bf16 chunk are
#pragma unroll
        for (int c = 0; c < CH; ++c) {
#pragma unroll
            for (int j = 0; j < RT; ++j) {
                const unsigned int g4[4] = {f.w[j][0][c].x, f.w[j][0][c].y, f.w[j][0][c].z,
                                            f.w[j][0][c].w};
                const unsigned int h4[4] = {f.w[j][1][c].x, f.w[j][1][c].y, f.w[j][1][c].z,
                                            f.w[j][1][c].w};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    unsigned int glo, ghi, hlo, hhi;
                    e4m3x4_to_f16x4(g4[q], glo, ghi);
                    e4m3x4_to_f16x4(h4[q], hlo, hhi);
                    const unsigned int a[4] = {glo, hlo, ghi, hhi};
                    const uint4 xv = f.x[2 * c + (q >> 1)];
                    if (q & 1) {
                        mma_f16_16816(acc[j], a, xv.z, xv.w);
                    } else {
                        mma_f16_16816(acc[j], a, xv.x, xv.y);
                    }
                }
            }
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < CH; ++c) {
#pragma unroll
        for (int j = 0; j < RT; ++j) {
            const unsigned int a0[4] = {f.w[j][0][c].x, f.w[j][1][c].x, f.w[j][0][c].y,
                                        f.w[j][1][c].y};
            mma_bf16_16816(acc[j], a0, f.x[c].x, f.x[c].y);
            const unsigned int a1[4] = {f.w[j][0][c].z, f.w[j][1][c].z, f.w[j][0][c].w,
                                        f.w[j][1][c].w};
            mma_bf16_16816(acc[j], a1, f.x[c].z, f.x[c].w);
        }
    }
}

// One block: rows base + 16 j + r (mode 0/1), or features f = base + 8 j + r' with gate row f
// and up row inter + f (mode 2); r < 16, r' < 8, j < RT; tokens m < M; the k range of split
// blockIdx.y. With NORM, x is normalised by rmsnorm with weight norm_w and eps. Before
// pdl_wait each warp loads its first step's weights and prefetches the next pf_steps steps'
// into L2.
template <int RT, int CH, bool NORM, bool FP8>
__device__ __forceinline__ void gemv_impl(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                                          const void* __restrict__ w,
                                          const float* __restrict__ wscale,
                                          const bf16_t* __restrict__ norm_w, float eps, int M,
                                          int K, int N, int mode, int splits,
                                          float* __restrict__ ws,
                                          unsigned int* __restrict__ counters, int pf_steps) {
    __shared__ float red[GV_WARPS][RT * 128];
    __shared__ float s_norm[GV_WARPS * GV_MAX_M + GV_MAX_M];
    __shared__ int is_last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x, split = blockIdx.y;
    const bool swiglu = mode == 2;
    const int inter = N >> 1;
    const int base = tile * (swiglu ? 8 : 16) * RT;

    const uint4* wr[RT][2];
#pragma unroll
    for (int j = 0; j < RT; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int r = swiglu ? base + 8 * j + g + h * inter : base + 16 * j + g + 8 * h;
            r = min(r, N - 1);  // rows past the tile's valid ones: loaded, never stored
            wr[j][h] = (const uint4*)((const unsigned char*)w + (size_t)r * K * (FP8 ? 1 : 2));
        }
    }
    const bool has_x = g < M;
    const uint4* xr = (const uint4*)(x + (size_t)min(g, M - 1) * K);
    const uint4* nw = (const uint4*)norm_w;

    const int k8 = FP8 ? K >> 4 : K >> 3;  // 16-byte weight units per row
    const int cps = 4 * CH;                // units per warp step
    const int steps = (k8 + cps - 1) / cps;
    const int parts = splits * GV_WARPS;
    const int p = split * GV_WARPS + warp;
    const int s0 = (int)((long long)steps * p / parts);
    const int s1 = (int)((long long)steps * (p + 1) / parts);

    float acc[RT][4];
#pragma unroll
    for (int j = 0; j < RT; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
    }
    GvFrag<RT, CH, FP8> cur, nxt;
    if (s0 < s1) {
        gv_load_w<RT, CH, FP8>(cur, wr, s0 * cps + t, k8);
        // the next pf_steps steps into L2
        const int pf_end = min(s1, s0 + 1 + min(max(pf_steps, 0), steps)) * cps;
        gv_prefetch_w<RT>(wr, (s0 + 1) * cps, min(pf_end, k8), t);
    }

    pdl_wait();  // from here on: memory that earlier kernels write

    float inv = 1.0f;
    if (NORM) {
        gv_inv_rms(x, M, K, eps, s_norm, s_norm + GV_WARPS * GV_MAX_M);
        inv = s_norm[GV_WARPS * GV_MAX_M + min(g, M - 1)];
    }
    if (s0 < s1) {
        gv_load_x<RT, CH, NORM, FP8>(cur, xr, nw, has_x, s0 * cps + t, k8, inv);
        for (int s = s0; s < s1; ++s) {
            const bool more = s + 1 < s1;
            const int c1 = (s + 1) * cps + t;
            if (more) gv_load_w<RT, CH, FP8>(nxt, wr, c1, k8);
            // With NORM, x is loaded and normalised after the MMAs, once the current step's
            // registers are free: before them, the normalisation's registers would hold the
            // next step's weight loads back behind the x loads' latency.
            if (more && !NORM) gv_load_x<RT, CH, NORM, FP8>(nxt, xr, nw, has_x, c1, k8, inv);
            gv_mma<RT, CH, FP8>(acc, cur);
            if (more && NORM) gv_load_x<RT, CH, NORM, FP8>(nxt, xr, nw, has_x, c1, k8, inv);
            if (more) cur = nxt;
        }
    }
    pdl_launch_dependents();

// acc[j][q]: row g + 8 (q >> 1) of sub-tile j, token 2t + (q & 1)
#pragma unroll
    for (int j = 0; j < RT; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) red[warp][(j * 4 + q) * 32 + lane] = acc[j][q];
    }
    __syncthreads();
    float v[RT];
    const int tid = threadIdx.x;
    if (tid < 128) {
#pragma unroll
        for (int j = 0; j < RT; ++j) {
            float sum = 0.0f;
#pragma unroll
            for (int wi = 0; wi < GV_WARPS; ++wi) sum += red[wi][j * 128 + tid];
            v[j] = sum;
        }
    }
    if (splits > 1) {
        float* part = ws + (size_t)tile * splits * (RT * 128);
        if (tid < 128) {
#pragma unroll
            for (int j = 0; j < RT; ++j) part[split * (RT * 128) + j * 128 + tid] = v[j];
        }
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            const unsigned int prev = atomicAdd(&counters[tile], 1u);
            is_last = prev == (unsigned int)(splits - 1);
        }
        __syncthreads();
        if (!is_last) return;
        __threadfence();
        if (tid < 128) {
#pragma unroll
            for (int j = 0; j < RT; ++j) {
                float sum = 0.0f;
                for (int sp = 0; sp < splits; ++sp) {
                    sum += gv_ld_partial(part + sp * (RT * 128) + j * 128 + tid);
                }
                v[j] = sum;
            }
        }
        if (tid == 0) counters[tile] = 0u;  // ready for the next launch (graph replays too)
    }

    // v[j] of thread tid = q * 32 + lane' (lane' = 4 g' + t'): row g' + 8 (q >> 1) of sub-tile
    // j, token 2 t' + (q & 1)
    if (swiglu) {
        __syncthreads();  // every warp is done reading red
        if (tid < 128) {
#pragma unroll
            for (int j = 0; j < RT; ++j) red[0][j * 128 + tid] = v[j];
        }
        __syncthreads();
        if (tid >= 64) return;
        const int q = tid >> 5, l = tid & 31;  // gate at q, up at q + 2
        const int m = 2 * (l & 3) + q;
        if (m >= M) return;
#pragma unroll
        for (int j = 0; j < RT; ++j) {
            const int f = base + 8 * j + (l >> 2);
            if (f < inter) {
                float gs = red[0][j * 128 + q * 32 + l];
                float us = red[0][j * 128 + (q + 2) * 32 + l];
                if (FP8) {
                    gs *= FP8_F16_UNIT * wscale[f];
                    us *= FP8_F16_UNIT * wscale[inter + f];
                }
                const float gt = rbf(gs);
                const float up = rbf(us);
                y[(size_t)m * inter + f] = f2bf(rbf(silu_f32(gt)) * up);
            }
        }
        return;
    }
    if (tid >= 128) return;
    const int q = tid >> 5, l = tid & 31;
    const int r = (l >> 2) + 8 * (q >> 1);
    const int m = 2 * (l & 3) + (q & 1);
    if (m >= M) return;
#pragma unroll
    for (int j = 0; j < RT; ++j) {
        const int row = base + 16 * j + r;
        if (row < N) {
            bf16_t* dst = y + (size_t)m * N + row;
            float o = v[j];
            if (FP8) o *= FP8_F16_UNIT * wscale[row];
            if (mode == 1) o += bf2f(*dst);
            *dst = f2bf(o);
        }
    }
}

// 16 rows per block, 4 chunks (64 bytes of each row) per lane and step.
extern "C" __global__ void __launch_bounds__(GV_THREADS, 2)
    gemv_bf16_r16(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                  const bf16_t* __restrict__ w, int M, int K, int N, int mode, int splits,
                  float* __restrict__ ws, unsigned int* __restrict__ counters, int pf_steps) {
    gemv_impl<1, 4, false, false>(y, x, w, nullptr, nullptr, 0.0f, M, K, N, mode, splits, ws,
                                  counters, pf_steps);
}

// 32 rows per block (x fetched half as often per weight byte), 2 chunks per lane and step.
extern "C" __global__ void __launch_bounds__(GV_THREADS, 2)
    gemv_bf16_r32(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                  const bf16_t* __restrict__ w, int M, int K, int N, int mode, int splits,
                  float* __restrict__ ws, unsigned int* __restrict__ counters, int pf_steps) {
    gemv_impl<2, 2, false, false>(y, x, w, nullptr, nullptr, 0.0f, M, K, N, mode, splits, ws,
                                  counters, pf_steps);
}

// The same with y = rmsnorm(x) · wᵀ: x is the raw residual stream, norm_w the norm's weight.
extern "C" __global__ void __launch_bounds__(GV_THREADS, 2)
    gemv_rms_bf16_r16(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                      const bf16_t* __restrict__ w, const bf16_t* __restrict__ norm_w, float eps,
                      int M, int K, int N, int mode, int splits, float* __restrict__ ws,
                      unsigned int* __restrict__ counters, int pf_steps) {
    gemv_impl<1, 4, true, false>(y, x, w, nullptr, norm_w, eps, M, K, N, mode, splits, ws,
                                 counters, pf_steps);
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 2)
    gemv_rms_bf16_r32(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                      const bf16_t* __restrict__ w, const bf16_t* __restrict__ norm_w, float eps,
                      int M, int K, int N, int mode, int splits, float* __restrict__ ws,
                      unsigned int* __restrict__ counters, int pf_steps) {
    gemv_impl<2, 2, true, false>(y, x, w, nullptr, norm_w, eps, M, K, N, mode, splits, ws,
                                 counters, pf_steps);
}

// FP8 weights (e4m3 rows with scale[row]); the same row tiles and steps as the bf16 entries
// (half the bytes per step).
extern "C" __global__ void __launch_bounds__(GV_THREADS, 2)
    gemv_fp8_r16(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                 const unsigned char* __restrict__ w, const float* __restrict__ scale, int M,
                 int K, int N, int mode, int splits, float* __restrict__ ws,
                 unsigned int* __restrict__ counters, int pf_steps) {
    gemv_impl<1, 2, false, true>(y, x, w, scale, nullptr, 0.0f, M, K, N, mode, splits, ws,
                                 counters, pf_steps);
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 2)
    gemv_fp8_r32(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                 const unsigned char* __restrict__ w, const float* __restrict__ scale, int M,
                 int K, int N, int mode, int splits, float* __restrict__ ws,
                 unsigned int* __restrict__ counters, int pf_steps) {
    gemv_impl<2, 1, false, true>(y, x, w, scale, nullptr, 0.0f, M, K, N, mode, splits, ws,
                                 counters, pf_steps);
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 2)
    gemv_rms_fp8_r16(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                     const unsigned char* __restrict__ w, const float* __restrict__ scale,
                     const bf16_t* __restrict__ norm_w, float eps, int M, int K, int N, int mode,
                     int splits, float* __restrict__ ws, unsigned int* __restrict__ counters,
                     int pf_steps) {
    gemv_impl<1, 2, true, true>(y, x, w, scale, norm_w, eps, M, K, N, mode, splits, ws,
                                counters, pf_steps);
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 2)
    gemv_rms_fp8_r32(bf16_t* __restrict__ y, const bf16_t* __restrict__ x,
                     const unsigned char* __restrict__ w, const float* __restrict__ scale,
                     const bf16_t* __restrict__ norm_w, float eps, int M, int K, int N, int mode,
                     int splits, float* __restrict__ ws, unsigned int* __restrict__ counters,
                     int pf_steps) {
    gemv_impl<2, 1, true, true>(y, x, w, scale, norm_w, eps, M, K, N, mode, splits, ws,
                                counters, pf_steps);
}
