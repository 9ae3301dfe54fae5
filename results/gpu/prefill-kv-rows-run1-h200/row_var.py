"""Row kernels' variants: one barrier a block reduction (two scratch buffers in turn), and the
norm kernel's registers bounded for three blocks a multiprocessor."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu"))
sys.argv = [sys.argv[0]]
import row_kernels as rk

NB = ("__device__ __forceinline__ unsigned int smem_addr(", """
__device__ __forceinline__ float block_sum1(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}
__device__ __forceinline__ float block_max1(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_max(t);
}
__device__ __forceinline__ unsigned int smem_addr(""")
NORM1 = [NB,
         ("block_sum(ss, scratch)", "block_sum1(ss, scratch)"),
         ("scale_of(block_max(amax, scratch));\n    const float r = row_recip(s);\n    if (active)",
          "scale_of(block_max1(amax, scratch + 32));\n    const float r = row_recip(s);\n    if (active)"),
         ("pdl_trigger_early();\n    __shared__ float scratch[32];\n    const int nvec = hidden / 8;",
          "pdl_trigger_early();\n    __shared__ float scratch[64];\n    const int nvec = hidden / 8;")]
B3 = [("extern \"C\" __global__ void __launch_bounds__(1024)\n    add_rmsnorm_quant_fp8(",
       "extern \"C\" __global__ void __launch_bounds__(512, 3)\n    add_rmsnorm_quant_fp8(")]
SILU1 = [NB,
         ("__shared__ float scratch[32];\n    const int nvec = inter / 8;",
          "__shared__ float scratch[64];\n    const int nvec = inter / 8;"),
         ("const float s = scale_of(block_max(amax, scratch));\n        const float r = row_recip(s);\n        uint2* qr",
          "const float s = scale_of(block_max1(amax, scratch + 32 * ((row / gridDim.x) & 1)));\n        const float r = row_recip(s);\n        uint2* qr")]


def main():
    base = rk.module()
    silu_bytes = rk.ROWS * 2 * rk.INTER * 2 + rk.ROWS * rk.INTER
    norm_bytes = rk.ROWS * rk.H * 2 * 3 + rk.ROWS * rk.H
    c_silu = rk.copy_us(base, rk.ROWS * 2 * rk.INTER * 2, rk.ROWS * rk.INTER)
    c_norm = rk.copy_us(base, rk.ROWS * rk.H * 2 * 2, rk.ROWS * rk.H * 2 + rk.ROWS * rk.H)
    print(f"copy of the silu kernel's bytes: {c_silu:.1f} µs; of the norm's: {c_norm:.1f} µs")
    print("| variant | block x grid | µs | GB/s | copy / it | output |")
    print("|---|---|---|---|---|---|")
    for rnd in range(2):
        sb = rk.report("silu as it is", None, rk.run_silu(base), silu_bytes, c_silu)
        rk.report("silu, one barrier a reduction", sb, rk.run_silu(rk.module(SILU1)), silu_bytes, c_silu)
        nb = rk.report("norm as it is", None, rk.run_norm(base), norm_bytes, c_norm)
        rk.report("norm, one barrier a reduction", nb, rk.run_norm(rk.module(NORM1)), norm_bytes, c_norm)
        rk.report("norm, 3 blocks/SM", nb, rk.run_norm(rk.module(B3)), norm_bytes, c_norm)
        rk.report("norm, both", nb, rk.run_norm(rk.module(NORM1 + B3)), norm_bytes, c_norm)


if __name__ == "__main__":
    main()
