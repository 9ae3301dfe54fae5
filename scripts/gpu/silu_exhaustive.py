#!/usr/bin/env python3
"""SiLU over every bf16 gate: the kernels' silu_f32 (cu/common.cuh: ex2.approx and rcp.approx)
and the IEEE expression g / (1 + expf(-g)), each rounded to bf16 as the kernels round it, against
the exact value (float64) rounded to bf16. Compiled here by CuPy's NVRTC; ~10 s.

Usage: silu_exhaustive.py"""
import numpy as np
import cupy as cp

import cupy_kernels

KERNEL = r'''
extern "C" __global__ void silu_all(const float* g, float* fast, float* ieee, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        fast[i] = rbf(silu_f32(g[i]));
        ieee[i] = rbf(g[i] / (1.0f + expf(-g[i])));
    }
}
'''


def bf16_round(x):
    """float64 -> nearest bf16 (ties to the even mantissa), as float32: of the three bf16 values
    of the same sign around x's float32 rounding, the nearest to x in float64."""
    u = x.astype(np.float32).view(np.uint32).astype(np.int64)
    sign, mag = u & 0x80000000, (u & 0x7FFF0000)
    best, best_d = None, None
    for step in (-0x10000, 0, 0x10000):
        m = np.clip(mag + step, 0, 0x7F800000)
        c = (sign | m).astype(np.uint32).view(np.float32)
        d = np.abs(c.astype(np.float64) - x)
        if best is None:
            best, best_d = c.copy(), d
            continue
        even = ((m >> 16) & 1) == 0
        take = (d < best_d) | ((d == best_d) & even)
        best = np.where(take, c, best)
        best_d = np.where(take, d, best_d)
    return best


def main():
    bits = np.arange(1 << 16, dtype=np.uint32)
    g = (bits << 16).view(np.float32)
    finite = np.isfinite(g)
    g = g[finite]
    mod = cupy_kernels.module(cupy_kernels.source(["common.cuh"]), extra=KERNEL)
    f = mod.get_function("silu_all")
    dg = cp.asarray(g)
    fast, ieee = cp.zeros_like(dg), cp.zeros_like(dg)
    f(((len(g) + 255) // 256,), (256,), (dg, fast, ieee, np.int32(len(g))))
    fast, ieee = fast.get(), ieee.get()
    with np.errstate(over="ignore"):
        exact = bf16_round(g.astype(np.float64) / (1.0 + np.exp(-g.astype(np.float64))))
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: {len(g)} finite bf16 gates")
    tiny = np.float32(np.finfo(np.float32).tiny)
    normal = (np.abs(g) >= tiny) & (np.abs(exact) >= tiny)
    for part, sel in [("gates and SiLUs normal", normal), ("a subnormal gate or SiLU", ~normal)]:
        for name, v in [("silu_f32 (ex2.approx, rcp.approx)", fast), ("IEEE g / (1 + expf(-g))", ieee)]:
            vv, ee, gg = v[sel], exact[sel], g[sel]
            wrong = vv.view(np.uint32) != ee.view(np.uint32)
            ulps = np.abs(vv.view(np.int32).astype(np.int64) - ee.view(np.int32).astype(np.int64)) >> 16
            where = gg[wrong]
            print(f"| {part} ({int(sel.sum())}) | {name} | {int(wrong.sum())} differ from the exact value "
                  f"rounded to bf16 | largest difference {int(ulps.max()) if len(ulps) else 0} bf16 unit(s) | "
                  f"{', '.join(f'{x:.4g}' for x in where[:6])}{' ...' if len(where) > 6 else ''} |")


if __name__ == "__main__":
    main()
