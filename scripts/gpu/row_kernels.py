#!/usr/bin/env python3
"""The FP8 prefill's row kernels (`silu_mul_quant_fp8`, `add_rmsnorm_quant_fp8`) timed alone on
a 1024-token pass of the 8B shape, with variants of their source, so one device call can tell
where a kernel's time goes and which form is faster. The kernels are compiled here from
kernels/src/cu (common.cuh + fp8.cu, as the engine concatenates them) by CuPy's NVRTC, with
textual edits per variant; every variant's outputs are compared byte for byte with the source
as it is (a variant that leaves out work says so and is timed only). Times: median of 50
launches (CUDA events), against a plain copy of the same bytes measured in the same run.

Usage: row_kernels.py [ROWS]   (default 1024)."""
import sys
import numpy as np
import cupy as cp

import cupy_kernels
from cupy_kernels import timed

SRC = cupy_kernels.source(["common.cuh", "fp8.cu"])
ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
H, INTER = 4096, 14336
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]

# The SiLU kernel's register form with other vectors a thread, block sizes and register bounds
# (NAME, vectors a thread, threads, blocks a multiprocessor the registers are bounded for).
SILU_NP = r"""
#define SILU_NP(NAME, VEC, THREADS, MINB)                                                        \
extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                     \
    NAME(unsigned char* __restrict__ q, float* qscale, const bf16_t* __restrict__ gate_up,        \
         const float* dxs, const float* __restrict__ dws, int inter, unsigned int rows) {          \
    pdl_wait();                                                                                   \
    pdl_trigger_early();                                                                          \
    __shared__ float scratch[32];                                                                 \
    const int nvec = inter / 8;                                                                   \
    for (unsigned int row = blockIdx.x; row < rows; row += gridDim.x) {                          \
        uint4 cg[VEC], cu[VEC];                                                                   \
        const uint4* gu = (const uint4*)(gate_up + row * 2 * (size_t)inter);                      \
        load_row(cg, gu, nvec, true);                                                             \
        load_row(cu, gu + nvec, nvec, true);                                                      \
        const float sc = dxs[row];                                                                \
        float amax = 0.0f;                                                                        \
        _Pragma("unroll") for (int v = 0; v < VEC; ++v) {                                         \
            const int i = threadIdx.x + v * blockDim.x;                                           \
            if (i < nvec)                                                                         \
                cg[v] = silu_mul8<true>(cg[v], cu[v], sc, dws + (size_t)i * 8,                    \
                                        dws + inter + (size_t)i * 8, amax);                       \
        }                                                                                         \
        const float s = scale_of(block_max(amax, scratch));                                       \
        const float r = row_recip(s);                                                             \
        uint2* qr = (uint2*)(q + row * (size_t)inter);                                            \
        _Pragma("unroll") for (int v = 0; v < VEC; ++v) {                                         \
            const int i = threadIdx.x + v * blockDim.x;                                           \
            if (i < nvec) qr[i] = quant8_kept(cg[v], s, r);                                       \
        }                                                                                         \
        if (threadIdx.x == 0) qscale[row] = s;                                                    \
    }                                                                                             \
    pdl_trigger_end();                                                                            \
}
SILU_NP(silu_np_4_448_2, 4, 448, 2)
SILU_NP(silu_np_4_448_1, 4, 448, 1)
SILU_NP(silu_np_2_896_1, 2, 896, 1)
SILU_NP(silu_np_2_1024_1, 2, 1024, 1)
"""

COPY = r"""
extern "C" __global__ void copy_bytes(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n_in, size_t n_out) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_in; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = a[i];
        if (i < n_out) b[i] = v;
    }
}
"""


def module(edits=()):
    return cupy_kernels.module(SRC, edits, SILU_NP + COPY)


rng = np.random.default_rng(5)


def bf16(shape, scale):
    x = (rng.standard_normal(shape).astype(np.float32) * scale).view(np.uint32)
    return cp.asarray(((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16))


def copy_us(mod, in_bytes, out_bytes):
    a = cp.zeros(in_bytes // 16 * 4, dtype=np.uint32)
    b = cp.zeros(max(out_bytes, 16) // 16 * 4, dtype=np.uint32)
    f = mod.get_function("copy_bytes")
    return timed(lambda: f((SMS * 8,), (256,), (a, b, np.uint64(in_bytes // 16), np.uint64(out_bytes // 16))))


def occupancy_grid(f, threads):
    """Blocks resident at once (as the engine's row_grid sizes these kernels), from the
    kernel's registers: 256-register units per warp, 64K registers and 2048 threads a
    multiprocessor."""
    warp_regs = -(-f.num_regs * 32 // 256) * 256
    per = max(1, min(65536 // (warp_regs * -(-threads // 32)), 2048 // threads, 32))
    return max(1, min(SMS * per, ROWS)), per


# ---- silu_mul_quant_fp8: gate_up (rows x 2 inter, an FP8 GEMM's unscaled product) -> e4m3 + scales
gate_up = bf16((ROWS, 2 * INTER), 40.0)
dxs0 = cp.asarray(rng.uniform(0.001, 0.01, ROWS).astype(np.float32))
dws = cp.asarray(rng.uniform(0.0005, 0.002, 2 * INTER).astype(np.float32))


def run_silu(mod, threads=None, grid=None, name="silu_mul_quant_fp8"):
    f = mod.get_function(name)
    nvec = INTER // 8
    if threads is None:
        threads = min(max(-(-nvec // 2), 32), 1024)
        threads = -(-threads // 32) * 32
    g, per = occupancy_grid(f, threads)
    grid = grid or g
    q = cp.zeros((ROWS, INTER), dtype=np.uint8)
    qs = cp.zeros(ROWS, dtype=np.float32)
    xs = cp.zeros(ROWS, dtype=np.float32)

    def go():
        xs[...] = dxs0  # the kernel overwrites its row scales (`dxs` is `qscale`)
        f((grid,), (threads,), (q, xs, gate_up, xs, dws, np.int32(INTER), np.uint32(ROWS)))

    go()
    cp.cuda.Device().synchronize()
    out = (q.get().tobytes(), xs.get().tobytes())
    reset = timed(lambda: xs.__setitem__(Ellipsis, dxs0))
    return out, timed(go) - reset, threads, grid, per, f.num_regs


# ---- add_rmsnorm_quant_fp8, mode 2: residual += rescaled delta, RMSNorm, e4m3 rows + scales
res0 = bf16((ROWS, H), 1.0)
delta = bf16((ROWS, H), 300.0)
nw = bf16((H,), 1.0)
dws_h = cp.asarray(rng.uniform(0.0005, 0.002, H).astype(np.float32))


def run_norm(mod, threads=None, grid=None):
    f = mod.get_function("add_rmsnorm_quant_fp8")
    threads = threads or min(max(H // 8, 32), 1024)
    g, per = occupancy_grid(f, threads)
    grid = grid or g
    q = cp.zeros((ROWS, H), dtype=np.uint8)
    xs = cp.zeros(ROWS, dtype=np.float32)
    res = cp.zeros_like(res0)

    def go():
        res[...] = res0
        xs[...] = dxs0
        f((grid,), (threads,), (q, xs, res, delta, xs, dws_h, nw, np.int32(H), np.float32(1e-5), np.uint32(ROWS)))

    go()
    cp.cuda.Device().synchronize()
    out = (q.get().tobytes(), xs.get().tobytes(), res.get().tobytes())

    def reset():
        res[...] = res0
        xs[...] = dxs0

    return out, timed(go) - timed(reset), threads, grid, per, f.num_regs


def report(name, base, r, nbytes, copy):
    out, us, threads, grid, per, regs = r
    same = "same bytes" if base is None or out == base else "DIFFERENT"
    print(f"| {name} | {threads} x {grid} ({per}/SM, {regs} regs) | {us:.1f} | "
          f"{nbytes / us / 1e3:.0f} | {copy / us:.2f} | {same} |", flush=True)
    return out


def main():
    base_mod = module()
    silu_bytes = ROWS * 2 * INTER * 2 + ROWS * INTER
    norm_bytes = ROWS * H * 2 * 3 + ROWS * H
    c_silu = copy_us(base_mod, ROWS * 2 * INTER * 2, ROWS * INTER)
    c_norm = copy_us(base_mod, ROWS * H * 2 * 2, ROWS * H * 2 + ROWS * H)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {SMS} SMs, {ROWS} rows")
    print(f"copy of the silu kernel's bytes ({silu_bytes / 1e6:.1f} MB): {c_silu:.1f} µs "
          f"({silu_bytes / c_silu / 1e3:.0f} GB/s); of the norm's ({norm_bytes / 1e6:.1f} MB): {c_norm:.1f} µs")
    print()
    print("| silu_mul_quant_fp8 variant | block x grid | µs | GB/s | copy / it | output |")
    print("|---|---|---|---|---|---|")
    base = report("as it is", None, run_silu(base_mod), silu_bytes, c_silu)
    variants = [
        ("no SiLU (timing only)", (("    silu8(g);\n    round8_bf16(g);", "    round8_bf16(g);"),), {}),
        ("4 vectors a thread (448 threads)", (("#define SILU_Q_VEC 2", "#define SILU_Q_VEC 4"),
                                              ("#define SILU_Q_THREADS 1024", "#define SILU_Q_THREADS 512")),
         dict(threads=448)),
        ("as it is, one row a block", (), dict(grid=ROWS)),
        ("4 vectors, 448 threads, registers bounded for 2 blocks/SM", (), dict(name="silu_np_4_448_2", threads=448)),
        ("4 vectors, 448 threads", (), dict(name="silu_np_4_448_1", threads=448)),
        ("2 vectors, 896 threads, registers bounded for 896", (), dict(name="silu_np_2_896_1", threads=896)),
        ("2 vectors, 1024 threads", (), dict(name="silu_np_2_1024_1", threads=1024)),
    ]
    for name, edits, kw in variants:
        try:
            report(name, None if "timing only" in name else base, run_silu(module(edits), **kw), silu_bytes, c_silu)
        except Exception as e:
            print(f"| {name} | failed: {str(e)[:200]} |")
    print()
    print("| add_rmsnorm_quant_fp8 (FP8 GEMM delta) variant | block x grid | µs | GB/s | copy / it | output |")
    print("|---|---|---|---|---|---|")
    nbase = report("as it is", None, run_norm(base_mod), norm_bytes, c_norm)
    for name, edits, kw in [
        ("one row a block", (), dict(grid=ROWS)),
        ("grid = SMs", (), dict(grid=SMS)),
        ("grid = 2 SMs", (), dict(grid=2 * SMS)),
    ]:
        try:
            report(name, nbase, run_norm(module(edits), **kw), norm_bytes, c_norm)
        except Exception as e:
            print(f"| {name} | failed: {str(e)[:200]} |")


if __name__ == "__main__":
    main()
