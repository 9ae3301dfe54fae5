#!/usr/bin/env python3
"""Causal prefill attention (`prefill_attn_d128*`, cu/prefill_attn.cu) alone, one prompt with
nothing cached, with variants of the kernel's source: Llama-3.1-8B's 32 query heads over 8 KV
heads at 1024 and 4096 tokens, and tp 2's 16 over 4 at 1024; bf16 and FP8 (e4m3) pools, keys in
consecutive pool slots, whole query tiles in the order the engine lists them. Compiled here from
kernels/src/cu by CuPy's NVRTC; times are medians of 30 launches (CUDA events); each variant's
output against the source as it is (largest difference relative to the largest value).

Usage: prefill_attn.py"""
import numpy as np
import cupy as cp

import cupy_kernels
from cupy_kernels import bf16, e4m3

SRC = cupy_kernels.source(["common.cuh", "fp8.cu", "kv.cuh", "prefill_attn.cu"])
D = 128
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]


def run(mod, n, nh, fp8):
    nkv = nh // 4
    cp.random.seed(5)
    q_stride = (nh + 2 * nkv) * D
    qkv = bf16(cp.random.standard_normal((n, q_stride), dtype=cp.float32))
    if fp8:
        kc, vc = e4m3((n, nkv * D)), e4m3((n, nkv * D))
    else:
        kc = bf16(cp.random.standard_normal((n, nkv * D), dtype=cp.float32) * 0.5)
        vc = bf16(cp.random.standard_normal((n, nkv * D), dtype=cp.float32))
    tiles = cp.asarray(np.array([[0, off, 1 << 16, 0] for off in range(0, n, 64)], np.int32).reshape(-1))
    i32 = lambda v: cp.asarray(np.array(v, np.int32))
    q_indptr, kv_indptr, idx, prefix = i32([0, n]), i32([0, n]), i32(np.arange(n)), i32([0])
    out = cp.zeros((n, nh * D), dtype=cp.uint16)
    po, pml, cnt = cp.zeros(1, cp.float32), cp.zeros(1, cp.float32), cp.zeros(1, cp.uint32)
    f = mod.get_function("prefill_attn_d128" + ("_e4m3" if fp8 else ""))
    args = (out, np.int32(nh * D), qkv, np.int32(q_stride), kc, vc, np.int32(nkv * D), tiles,
            q_indptr, kv_indptr, idx, prefix, np.int32(4), np.float32(0.088 * 1.4427),
            np.float32(1.0), po, pml, cnt)
    us = cupy_kernels.timed(lambda: f((len(tiles) // 4, nh), (128,), args), 30)
    return out.get(), us, f.num_regs


def diff(a, b):
    fa = (a.astype(np.uint32) << 16).view(np.float32)
    fb = (b.astype(np.uint32) << 16).view(np.float32)
    return float(np.max(np.abs(fa - fb)) / max(np.max(np.abs(fa)), 1e-30))


def main():
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {SMS} SMs")
    print()
    print("| kernel form | tokens | heads | pool | regs | µs | causal TFLOP/s | output vs as it is |")
    print("|---|---|---|---|---|---|---|---|")
    cases = [(1024, 32), (1024, 16), (4096, 32)]
    base = cupy_kernels.module(SRC)
    ref = {}
    lb = "extern \"C\" __global__ void __launch_bounds__(PF_THREADS) prefill_attn_d##D##SUF("
    variants = [
        ("as it is", ()),
        ("registers bounded for 3 blocks/SM",
         ((lb, lb.replace("(PF_THREADS)", "(PF_THREADS, 3)")),)),
    ]
    for name, edits in variants:
        try:
            mod = base if not edits else cupy_kernels.module(SRC, edits)
        except Exception as e:
            print(f"| {name} | failed: {str(e)[:300]} |")
            continue
        for n, nh in cases:
            for fp8 in (False, True):
                try:
                    out, us, regs = run(mod, n, nh, fp8)
                except Exception as e:
                    print(f"| {name} | failed: {str(e)[:300]} |")
                    continue
                flops = 4.0 * n * (n + 1) / 2 * D * nh
                key = (n, nh, fp8)
                if name == "as it is":
                    ref[key] = out
                d = diff(ref[key], out) if key in ref else float("nan")
                print(f"| {name} | {n} | {nh}/{nh // 4} | {'e4m3' if fp8 else 'bf16'} | {regs} | "
                      f"{us:.1f} | {flops / us / 1e6:.0f} | {d:.1e} |", flush=True)


if __name__ == "__main__":
    main()
