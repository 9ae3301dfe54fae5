#!/usr/bin/env python3
"""The fused decode attention of a batch-1 decode step (`decode_attn_rope_d128_g4*`,
cu/decode_attn.cu: RoPE, the new token's K/V store, attention over the cached keys, the merge of
the splits) alone, at Llama-3.1-8B's shape (32 query heads over 8 KV heads of 128), one sequence
of LEN keys, bf16 and e4m3 pools, with the grid's split count of the engine (32) and others.
Compiled here from kernels/src/cu by CuPy's NVRTC; each time is the mean of 200 launches in a
row between two CUDA events (no programmatic dependent launch: each launch's whole latency).

With BASE=FILE, an earlier decode_attn.cu is compiled beside the source as it is, both are
timed in turn, and their outputs and stored K/V rows compared bit for bit.

Usage: [BASE=FILE] decode_attn_b1.py [LEN ...]   (default 128 256 384 1024)."""
import os
import sys
import numpy as np
import cupy as cp

import cupy_kernels
from cupy_kernels import bf16, e4m3

SRC = cupy_kernels.source(["common.cuh", "fp8.cu", "kv.cuh", "decode_attn.cu"])
H, KVH, D = 32, 8, 128


def main():
    lens = [int(a) for a in sys.argv[1:]] or [128, 256, 384, 1024]
    mods = [("as it is", cupy_kernels.module(SRC))]
    if os.environ.get("BASE"):
        base = SRC.replace(cupy_kernels.source(["decode_attn.cu"]), open(os.environ["BASE"]).read())
        mods.insert(0, ("BASE", cupy_kernels.module(base)))
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    print()
    print("| source | keys | pool | splits in the grid | µs a launch | bits vs the first source |")
    print("|---|---|---|---|---|---|")
    cp.random.seed(3)
    q_stride = (H + 2 * KVH) * D
    qkv = bf16(cp.random.standard_normal((1, q_stride), dtype=cp.float32))
    inv_freq = cp.asarray((500000.0 ** (-np.arange(0, D, 2) / D)).astype(np.float32))
    po = cp.zeros(32 * H * D, cp.float32)
    pml = cp.zeros(32 * H * 2, cp.float32)
    cnt = cp.zeros(KVH, cp.uint32)
    out = cp.zeros(H * D, cp.uint16)
    for n in lens:
        i32 = lambda v: cp.asarray(np.array(v, np.int32))
        indptr, idx, pos = i32([0, n]), i32(np.arange(n)), i32([n - 1])
        for fp8 in (False, True):
            if fp8:
                k0, v0 = e4m3((n, KVH * D)), e4m3((n, KVH * D))
            else:
                k0 = bf16(cp.random.standard_normal((n, KVH * D), dtype=cp.float32) * 0.5)
                v0 = bf16(cp.random.standard_normal((n, KVH * D), dtype=cp.float32))
            for splits in (32, 8, 1):
                first = None
                for name, mod in mods:
                    kc, vc = k0.copy(), v0.copy()
                    out[:] = 0
                    f = mod.get_function("decode_attn_rope_d128_g4" + ("_e4m3" if fp8 else ""))
                    args = (out, np.int32(H * D), po, pml, cnt, qkv, np.int32(q_stride), kc, vc,
                            np.int32(KVH * D), indptr, idx, pos, inv_freq, np.int32(H),
                            np.float32(0.088 * 1.4427), np.float32(1.0), np.float32(1.0),
                            np.float32(1.0))

                    def go():
                        for _ in range(200):
                            f((1, KVH, splits), (128,), args)
                    us = cupy_kernels.timed(go, 5) / 200
                    got = (out.get().tobytes(), kc.get().tobytes(), vc.get().tobytes())
                    if first is None:
                        first, same = got, "-"
                    else:
                        same = "same" if got == first else "DIFFER"
                    print(f"| {name} | {n} | {'e4m3' if fp8 else 'bf16'} | {splits} | {us:.2f} | {same} |",
                          flush=True)
    # an empty kernel's launch, for scale
    nop = cp.RawKernel('extern "C" __global__ void nop() {}', "nop")
    def go():
        for _ in range(200):
            nop((1, KVH, 32), (128,), ())
    print(f"| - | - | - | an empty kernel of the same grid | {cupy_kernels.timed(go, 5) / 200:.2f} | |")


if __name__ == "__main__":
    main()
