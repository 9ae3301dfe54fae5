#!/usr/bin/env python3
"""The tensor-core decode attention (`decode_attn_tc_d128_g4*`, cu/decode_attn_tc.cu) alone at a
large batch, as the offline run's decode passes use it: BATCH sequences of LEN cached keys, 32
query heads over 8 KV heads of 128 dims, an FP8 (e4m3) pool and a bf16 one, with the sequences'
pool slots laid out three ways (each sequence's keys contiguous; keys interleaved across the
sequences, as decode steps that add one slot to every sequence at once lay them out; a random
permutation), and with variants of the kernel's source. Compiled here from kernels/src/cu by
CuPy's NVRTC; times are medians of 30 launches (CUDA events) against a device copy of the same
bytes measured in the same run; each variant's output against the source as it is (largest
difference, in bf16 units of the output).

Usage: decode_attn_tc.py [BATCH] [LEN]   (default 256 1000)."""
import sys
import numpy as np
import cupy as cp

import cupy_kernels
from cupy_kernels import bf16, e4m3

SRC = cupy_kernels.source(["common.cuh", "fp8.cu", "kv.cuh", "prefill_attn.cu", "decode_attn_tc.cu"])
B = int(sys.argv[1]) if len(sys.argv) > 1 else 256
L = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
H, KVH, D = 32, 8, 128
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
rng = np.random.default_rng(9)


def module(edits=()):
    return cupy_kernels.module(SRC, edits)


def timed(fn):
    return cupy_kernels.timed(fn, 30)


cp.random.seed(9)
cap = B * L
q = bf16(cp.random.standard_normal((B, H * D), dtype=cp.float32))
k8, v8 = e4m3((cap, KVH * D)), e4m3((cap, KVH * D))
kb = bf16(cp.random.standard_normal((cap, KVH * D), dtype=cp.float32) * 0.5)
vb = bf16(cp.random.standard_normal((cap, KVH * D), dtype=cp.float32))
indptr = cp.asarray((np.arange(B + 1) * L).astype(np.int32))
layouts = {
    "contiguous": (np.arange(B)[:, None] * L + np.arange(L)[None, :]),
    "interleaved": (np.arange(L)[None, :] * B + np.arange(B)[:, None]),
    "random": rng.permutation(cap).reshape(B, L),
}
layouts = {k: cp.asarray(v.reshape(-1).astype(np.int32)) for k, v in layouts.items()}


def run(mod, fp8, layout, warps=4):
    name = "decode_attn_tc_d128_g4" + ("_e4m3" if fp8 else "")
    f = mod.get_function(name)
    out = cp.zeros((B, H * D), dtype=np.uint16)
    kc, vc = (k8, v8) if fp8 else (kb, vb)
    args = (out, np.int32(H * D), q, np.int32(H * D), kc, vc, np.int32(KVH * D), indptr,
            layouts[layout], np.float32(0.088 * 1.4427), np.float32(1.0))
    go = lambda: f((KVH, B), (32 * warps,), args)
    us = timed(go)
    return out.get(), us, f.num_regs


def diff(a, b):
    fa = (a.astype(np.uint32) << 16).view(np.float32)
    fb = (b.astype(np.uint32) << 16).view(np.float32)
    return float(np.max(np.abs(fa - fb)) / max(np.max(np.abs(fa)), 1e-30))


def main():
    base = module()
    nbytes = {True: B * L * KVH * D * 2, False: B * L * KVH * D * 4}
    src = cp.zeros(nbytes[False] // 4, dtype=np.uint32)
    dst = cp.zeros_like(src)
    copy = timed(lambda: cp.copyto(dst, src))
    bw = 2 * src.nbytes / copy / 1e3
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {SMS} SMs; batch {B} x {L} keys; "
          f"device copy {bw:.0f} GB/s (read + write)")
    print()
    print("| kernel form | pool | slots | regs | µs | GB/s read | of copy | output vs as it is |")
    print("|---|---|---|---|---|---|---|---|")
    ref = {}
    for fp8 in (True, False):
        for lay in layouts:
            out, us, regs = run(base, fp8, lay)
            ref[(fp8, lay)] = out
            print(f"| as it is | {'e4m3' if fp8 else 'bf16'} | {lay} | {regs} | {us:.0f} | "
                  f"{nbytes[fp8] / us / 1e3:.0f} | {nbytes[fp8] / us / 1e3 / bw:.2f} | |", flush=True)
    variants = [
        ("8 warps (128-key tiles)", (("#define DTC_WARPS 4", "#define DTC_WARPS 8"),), 8),
        ("2 warps (32-key tiles)", (("#define DTC_WARPS 4", "#define DTC_WARPS 2"),), 2),
        ("registers bounded for 6 blocks/SM",
         (("__launch_bounds__(DTC_THREADS) decode_attn_tc", "__launch_bounds__(DTC_THREADS, 6) decode_attn_tc"),), 4),
    ]
    for name, edits, warps in variants:
        try:
            mod = module(edits)
        except Exception as e:
            print(f"| {name} | failed: {str(e)[:300]} |")
            continue
        for fp8 in (True, False):
            for lay in ("contiguous", "interleaved"):
                try:
                    out, us, regs = run(mod, fp8, lay, warps)
                except Exception as e:
                    print(f"| {name} | failed: {str(e)[:300]} |")
                    continue
                print(f"| {name} | {'e4m3' if fp8 else 'bf16'} | {lay} | {regs} | {us:.0f} | "
                      f"{nbytes[fp8] / us / 1e3:.0f} | {nbytes[fp8] / us / 1e3 / bw:.2f} | "
                      f"{diff(ref[(fp8, lay)], out):.1e} |", flush=True)


if __name__ == "__main__":
    main()
