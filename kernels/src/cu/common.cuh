// Shared helpers for every kernel. Compiled by NVRTC without any system header, so bf16 is a
// 16-bit pattern and conversions are written out (round to nearest even, like PyTorch).

typedef unsigned short bf16_t;

#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float bf2f(bf16_t x) {
    return __uint_as_float(((unsigned int)x) << 16);
}

// f32 -> bf16, round to nearest even; NaN becomes 0x7fc0 (PyTorch's). From sm_80 one cvt
// instruction rounds (the same bits as the integer steps below for every other input).
__device__ __forceinline__ bf16_t f2bf(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return f != f ? (bf16_t)0x7fc0 : (bf16_t)r;
#else
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_t)0x7fc0;  // NaN stays NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
#endif
}

// Programmatic dependent launch (sm_90+). A kernel launched with programmatic stream
// serialization may start while the kernel before it on the stream is still running; it must
// call pdl_wait() before it reads anything an earlier kernel writes, or writes anything an
// earlier kernel may still read. The wait returns once every earlier kernel has completed and
// its memory operations are visible; without the launch attribute (or before sm_90) it returns
// at once. pdl_launch_dependents() lets the next kernel start launching once every block of
// this one has called it (or exited); the next kernel still waits for this one to finish
// before it touches shared data, so the call only decides how early its prologue may run.
//
// Kernels call it through pdl_trigger_end() once a block's work is done: a dependent launched
// earlier would park resident blocks in griddepcontrol.wait, holding multiprocessor slots
// (registers, shared memory) that this kernel's own blocks or a neighbour could use.
// `sgl_pdl_early_trigger` (set by the host, zero by default) moves the trigger to right
// after each kernel's wait instead (pdl_trigger_early()), for comparison.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ int sgl_pdl_early_trigger;

__device__ __forceinline__ void pdl_trigger_early() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (sgl_pdl_early_trigger) pdl_launch_dependents();
#endif
}

__device__ __forceinline__ void pdl_trigger_end() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!sgl_pdl_early_trigger) pdl_launch_dependents();
#endif
}

// L2-coherent loads (never from a stale L1 line): partials written by other blocks of the
// same launch.
__device__ __forceinline__ float ld_cg_f32(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float4 ld_cg_f32x4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}

// SiLU of a gate, g / (1 + exp(-g)), with the exponential through ex2.approx (__expf) and the
// quotient through the approximate reciprocal: within a few f32 units in the last place of the
// IEEE expression (gates below about -87 give a signed zero, as the IEEE quotient does below
// -88.7), which the kernels round to bf16 next. Every kernel with a SiLU uses it
// (silu_mul_bf16, silu_mul_quant_fp8, the decode GEMV's SwiGLU epilogue), so the fused and
// unfused forms agree bit for bit.
__device__ __forceinline__ float silu_f32(float g) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + __expf(-g)));
    return g * r;
}

// Round a float to the nearest bf16 and back: emulates a PyTorch bf16 op's output.
__device__ __forceinline__ float rbf(float f) { return bf2f(f2bf(f)); }

// Two floats into one bf16x2 register: `lo` in the low half (lower address).
__device__ __forceinline__ unsigned int pack_bf2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void unpack8(const uint4 v, float* f) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack8(const float* f) {
    uint4 v;
    v.x = (unsigned int)f2bf(f[0]) | ((unsigned int)f2bf(f[1]) << 16);
    v.y = (unsigned int)f2bf(f[2]) | ((unsigned int)f2bf(f[3]) << 16);
    v.z = (unsigned int)f2bf(f[4]) | ((unsigned int)f2bf(f[5]) << 16);
    v.w = (unsigned int)f2bf(f[6]) | ((unsigned int)f2bf(f[7]) << 16);
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of at most 1024 threads; every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch /* [32] */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

// Maximum over a block of at most 1024 threads; every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* scratch /* [32] */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_max(t);
}

__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes from global to shared memory without a register round trip (cached in L2 only);
// zero-filled when !valid. The copies a thread has committed as a group are visible to that
// thread once cp_wait leaves at most N of its groups pending; other threads see them after a
// barrier that follows that wait.
template <typename T>
__device__ __forceinline__ void cp_async16(T* smem, const T* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)),
                 "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// D = A(16x16, row) * B(16x8, col) + D, f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_f16_16816(float* d, const unsigned int* a, unsigned int b0,
                                              unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A(16x16, row) * B(16x8, col) + D, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float* d, const unsigned int* a, unsigned int b0,
                                               unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
