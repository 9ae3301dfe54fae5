// One-shot all-reduce (sum) of bf16 for tensor parallelism among the GPUs of one process, with
// peer access on between every pair, for the small messages of decode steps (NCCL takes the
// large ones). Each rank's kernel writes its input into every rank's receive buffer (its own
// slot there; remote stores over NVLink are posted, nothing waits for them), tells every peer
// (a flag store after the data), waits for every peer's flag in its own memory, then sums the
// slots of its receive buffer, all local reads, in rank order in f32 into its input, so every
// rank gets the same bits.
//
// Every launch on the same buffers uses the same number of blocks whatever the size (the
// engine keeps one set of buffers with 16 blocks for decode messages, and at tp 2 another with
// 128 for prefill's megabytes), and block b always handles the same 16-byte units, so block b
// of each rank only ever meets block b of the others. The flags
// carry an epoch (each block's own counter, kept on the device so the kernel can be replayed
// from a CUDA graph). Receive buffers are double-buffered by the epoch's parity: a rank can
// write call N + 2's data only after every peer flagged call N + 1, which each does after it
// finished reading call N, so one barrier per call is enough.

#define AR_MAX_RANKS 8

struct ArPeers {
    unsigned long long recv[AR_MAX_RANKS];   // bf16 [2 parities][ranks][half_elems]
    unsigned long long flags[AR_MAX_RANKS];  // u32 [blocks][AR_MAX_RANKS]
};

__device__ __forceinline__ void st_release_sys(unsigned int* p, unsigned int v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned int ld_acquire_sys(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// 16 bytes from global memory, cached in L2 only (peers rewrite the receive buffer each call).
__device__ __forceinline__ uint4 ld_cg_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// x: n bf16 (n % 8 == 0, n <= half_elems); epochs: this rank's counters, one per block.
extern "C" __global__ void __launch_bounds__(512)
    allreduce_oneshot_bf16(ArPeers peers, bf16_t* __restrict__ x, unsigned int* __restrict__ epochs,
                           int n, int rank, int ranks, int half_elems) {
    pdl_wait();
    __shared__ unsigned int epoch_s;
    const int b = blockIdx.x, tid = threadIdx.x;
    if (tid == 0) epoch_s = epochs[b] + 1;
    __syncthreads();
    const unsigned int e = epoch_s;
    // this call's receive area: parity (e & 1), then one slot of half_elems per source rank
    const size_t area = (size_t)(e & 1u) * (size_t)ranks * (size_t)half_elems;
    const int units = n >> 3;
    const int stride = gridDim.x * blockDim.x;
    for (int i = b * blockDim.x + tid; i < units; i += stride) {
        const uint4 v = ((const uint4*)x)[i];
        for (int r = 0; r < ranks; ++r) {
            uint4* slot = (uint4*)((bf16_t*)peers.recv[r] + area + (size_t)rank * half_elems);
            slot[i] = v;
        }
    }
    // The block's stores are ordered before thread t's release (bar.sync, then a release at
    // system scope, which is cumulative).
    __syncthreads();
    if (tid < ranks) {
        st_release_sys((unsigned int*)peers.flags[tid] + b * AR_MAX_RANKS + rank, e);
        const unsigned int* f = (const unsigned int*)peers.flags[rank] + b * AR_MAX_RANKS + tid;
        // A peer may already be one call further (epoch e + 1): wait until at least e.
        while ((int)(ld_acquire_sys(f) - e) < 0) {
        }
    }
    __syncthreads();
    const bf16_t* mine = (const bf16_t*)peers.recv[rank] + area;
    for (int i = b * blockDim.x + tid; i < units; i += stride) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int r = 0; r < ranks; ++r) {
            const uint4 v = ld_cg_v4((const uint4*)(mine + (size_t)r * half_elems) + i);
            float f[8];
            unpack8(v, f);
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[k] += f[k];
        }
        ((uint4*)x)[i] = pack8(acc);
    }
    if (tid == 0) epochs[b] = e;
    pdl_trigger_end();
}

__device__ __forceinline__ void st_volatile_v4(uint4* p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ uint4 ld_volatile_v4(const uint4* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// The one-shot all-reduce for small messages without its flags: each 16-byte line a rank
// stores into a peer's slot carries 8 bytes of data, each 4-byte half with the call's epoch
// beside it ({d0, e, d1, e}; each 8-byte half is written whole), so a reader spins on its lines
// until both epochs are this call's and needs no flag, fence or second trip over the link. The
// sum runs in rank order in f32 and is rounded once: the bits of allreduce_oneshot_bf16.
// Slots as there, each holding n / 4 lines (4 n bytes <= 2 half_elems). These buffers take only
// these calls, always with the same grid (a line is always one block's, whose counter in
// `epochs` numbers its calls), so a line's epoch equals e only once this call wrote it: the
// last write before it, in the same parity, was call e - 2's. And a rank writes a slot again
// (call e + 2) only after finishing call e + 1, which needs every peer's lines of e + 1, which
// a peer sends only once its own call e, its reads of that slot included, has completed.
// x: n bf16 (n % 4 == 0); epochs: this rank's counters, one per block.
extern "C" __global__ void __launch_bounds__(512)
    allreduce_ll_bf16(ArPeers peers, bf16_t* __restrict__ x, unsigned int* __restrict__ epochs,
                      int n, int rank, int ranks, int half_elems) {
    pdl_wait();
    __shared__ unsigned int epoch_s;
    const int b = blockIdx.x, tid = threadIdx.x;
    if (tid == 0) epoch_s = epochs[b] + 1;
    __syncthreads();
    const unsigned int e = epoch_s;
    const size_t area = (size_t)(e & 1u) * (size_t)ranks * (size_t)half_elems;
    const int lines = n >> 2;
    const int stride = gridDim.x * blockDim.x;
    for (int i = b * blockDim.x + tid; i < lines; i += stride) {
        const uint2 v = ((const uint2*)x)[i];
        const uint4 line = make_uint4(v.x, e, v.y, e);
        for (int r = 0; r < ranks; ++r) {
            if (r == rank) continue;
            bf16_t* slot = (bf16_t*)peers.recv[r] + area + (size_t)rank * half_elems;
            st_volatile_v4((uint4*)slot + i, line);
        }
    }
    const bf16_t* mine = (const bf16_t*)peers.recv[rank] + area;
    for (int i = b * blockDim.x + tid; i < lines; i += stride) {
        const uint2 own = ((const uint2*)x)[i];
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int r = 0; r < ranks; ++r) {
            uint2 d = own;
            if (r != rank) {
                const uint4* p = (const uint4*)(mine + (size_t)r * half_elems) + i;
                uint4 l = ld_volatile_v4(p);
                while (l.y != e || l.w != e) l = ld_volatile_v4(p);
                d = make_uint2(l.x, l.z);
            }
            acc[0] += __uint_as_float(d.x << 16);
            acc[1] += __uint_as_float(d.x & 0xffff0000u);
            acc[2] += __uint_as_float(d.y << 16);
            acc[3] += __uint_as_float(d.y & 0xffff0000u);
        }
        const unsigned int lo = (unsigned int)f2bf(acc[0]) | ((unsigned int)f2bf(acc[1]) << 16);
        const unsigned int hi = (unsigned int)f2bf(acc[2]) | ((unsigned int)f2bf(acc[3]) << 16);
        ((uint2*)x)[i] = make_uint2(lo, hi);
    }
    if (tid == 0) epochs[b] = e;
    pdl_trigger_end();
}

// Rows the fused all-reduce and norm below finish together (two rows' loads in flight per
// thread, few enough registers for two blocks of 512 threads on a multiprocessor), and the most
// ranks it takes (the pull set exists at tp 2 only).
#define AR_NORM_ROWS 2
#define AR_PULL_MAX_RANKS 2

// block_sum (MAX false) or block_max (MAX true; common.cuh) of N values at once, each reduced
// in that function's order, with one pair of barriers for all; scratch holds N x 32.
template <int N, bool MAX>
__device__ __forceinline__ void block_reduce_n(float* v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    auto warp_red = [](float x) { return MAX ? warp_max(x) : warp_sum(x); };
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = warp_red(v[k]);
    __syncthreads();
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < N; ++k) scratch[k * 32 + warp] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = warp_red(lane < nwarps ? scratch[k * 32 + lane] : 0.0f);
}

// The flag handshake of block b with block b of every peer: thread t < ranks (t != rank) tells
// peer t that this rank reached epoch e (word `slot` of its flags for this rank) and waits for
// peer t's word for this rank here; the caller's barrier then holds the block.
__device__ __forceinline__ void ar_handshake(const ArPeers& peers, int slot, int rank, int ranks,
                                             unsigned int e) {
    const int t = threadIdx.x;
    if (t < ranks && t != rank) {
        st_release_sys((unsigned int*)peers.flags[t] + slot * AR_MAX_RANKS + rank, e);
        const unsigned int* f = (const unsigned int*)peers.flags[rank] + slot * AR_MAX_RANKS + t;
        while ((int)(ld_acquire_sys(f) - e) < 0) {
        }
    }
}

// The all-reduce of a row-parallel GEMM's product fused with the residual add and the next
// RMSNorm, reading every rank's product where its GEMM wrote it: each rank's GEMM writes into
// its own area of peer memory, `peers.recv[rank]` (rows x hidden bf16), and this kernel reads
// the peers' areas over the link while it adds and normalises. For each row: s = bf16(sum over
// ranks in rank order, in f32), residual = bf16(residual + s), and the normalised row goes to
// `out` (bf16) or, when `q` is set, to `q` as e4m3 with its scale in `qscale`: the bits of
// allreduce_oneshot_bf16 followed by add_rmsnorm_bf16 or add_rmsnorm_quant_fp8.
//
// One handshake per call between block b of every rank (flags: [blocks][AR_MAX_RANKS] words,
// each carrying the block's call count, kept in `epochs` so graphs can replay it), after
// pdl_wait (the GEMM before it has finished, so this rank's area is complete): "my area is
// ready". Nothing tells a rank when the others have finished reading its area: the engine
// alternates two areas (o_proj's, down_proj's), and before a GEMM writes an area again the
// rank has passed the handshake of a call on the other area, which each peer raises only after
// its previous kernels, these reads included, have completed.
// Block b takes rows b, b + gridDim.x, ..., AR_NORM_ROWS at a time. One vector of 8 per
// thread: the block size is add_rmsnorm_bf16's (hidden / 8 rounded up to whole warps), so the
// sum of squares adds in the same order, and at most 512 threads: hidden <= 4096, hidden % 8 ==
// 0; ranks <= AR_PULL_MAX_RANKS.
extern "C" __global__ void __launch_bounds__(512, 2)
    allreduce_pull_add_rmsnorm(ArPeers peers, bf16_t* __restrict__ residual,
                               bf16_t* __restrict__ out, unsigned char* __restrict__ q,
                               float* __restrict__ qscale, const bf16_t* __restrict__ weight,
                               unsigned int* __restrict__ epochs, int hidden, unsigned int rows,
                               int rank, int ranks, float eps) {
    pdl_wait();
    __shared__ unsigned int epoch_s;
    __shared__ float scratch[AR_NORM_ROWS * 32];
    const int b = blockIdx.x, i = threadIdx.x;
    if (i == 0) epoch_s = epochs[b] + 1;
    __syncthreads();
    const unsigned int e = epoch_s;
    const size_t h = hidden;
    const bool active = i < hidden / 8;
    const unsigned int step = gridDim.x;
    ar_handshake(peers, b, rank, ranks, e);
    __syncthreads();
    float g[8];
    unpack8(active ? ((const uint4*)weight)[i] : make_uint4(0u, 0u, 0u, 0u), g);
    for (unsigned int r0 = b; r0 < rows; r0 += AR_NORM_ROWS * step) {
        // every load of the rows first (the stores below may alias them for the compiler)
        uint4 res[AR_NORM_ROWS], pv[AR_NORM_ROWS][AR_PULL_MAX_RANKS];
#pragma unroll
        for (int k = 0; k < AR_NORM_ROWS; ++k) {
            const unsigned int row = r0 + k * step;
            const bool on = active && row < rows;
            const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
            res[k] = on ? ((const uint4*)(residual + row * h))[i] : zero;
#pragma unroll
            for (int p = 0; p < AR_PULL_MAX_RANKS; ++p)
                pv[k][p] = (on && p < ranks)
                               ? ld_cg_v4((const uint4*)((const bf16_t*)peers.recv[p] + row * h) + i)
                               : zero;
        }
        float x[AR_NORM_ROWS][8], ss[AR_NORM_ROWS];
#pragma unroll
        for (int k = 0; k < AR_NORM_ROWS; ++k) {
            const unsigned int row = r0 + k * step;
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int p = 0; p < AR_PULL_MAX_RANKS; ++p) {
                if (p < ranks) {
                    float f[8];
                    unpack8(pv[k][p], f);
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[j] += f[j];
                }
            }
            // the all-reduce's bf16 sum, added into the residual stream and rounded
            round8_bf16(acc);
            unpack8(res[k], x[k]);
            ss[k] = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) x[k][j] = x[k][j] + acc[j];
            round8_bf16(x[k]);
#pragma unroll
            for (int j = 0; j < 8; ++j) ss[k] += x[k][j] * x[k][j];
            if (active && row < rows) ((uint4*)(residual + row * h))[i] = pack8_exact(x[k]);
        }
        block_reduce_n<AR_NORM_ROWS, false>(ss, scratch);
        if (q == nullptr) {
            // add_rmsnorm_bf16's output
#pragma unroll
            for (int k = 0; k < AR_NORM_ROWS; ++k) {
                const unsigned int row = r0 + k * step;
                const float inv = rsqrtf(ss[k] / (float)hidden + eps);
                float y[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) y[j] = g[j] * rbf(x[k][j] * inv);
                if (active && row < rows) ((uint4*)(out + row * h))[i] = pack8(y);
            }
        } else {
            // add_rmsnorm_quant_fp8's (norm_quant_row's arithmetic)
            float amax[AR_NORM_ROWS];
#pragma unroll
            for (int k = 0; k < AR_NORM_ROWS; ++k) {
                const float inv = rsqrtf(ss[k] / (float)hidden + eps);
#pragma unroll
                for (int j = 0; j < 8; ++j) x[k][j] = x[k][j] * inv;
                round8_bf16(x[k]);
                amax[k] = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    x[k][j] = g[j] * x[k][j];
                    amax[k] = fmaxf(amax[k], fabsf(x[k][j]));
                }
                round8_bf16(x[k]);
            }
            block_reduce_n<AR_NORM_ROWS, true>(amax, scratch);
#pragma unroll
            for (int k = 0; k < AR_NORM_ROWS; ++k) {
                const unsigned int row = r0 + k * step;
                const float s = scale_of(amax[k]);
                const float r = row_recip(s);
                if (active && row < rows)
                    ((uint2*)(q + row * h))[i] =
                        r != 0.0f ? quant8_e4m3_recip(x[k], s, r) : quant8_e4m3(x[k], s);
                if (i == 0 && row < rows) qscale[row] = s;
            }
        }
    }
    if (i == 0) epochs[b] = e;
    pdl_trigger_end();
}
