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
