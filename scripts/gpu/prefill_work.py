#!/usr/bin/env python3
"""Prefill attention's work list (`prefill_work` in kernels/src/launch/attention.rs, re-planned
here with other run lengths) timed with the kernel as it is (`prefill_attn_d128*`, compiled
from kernels/src/cu by CuPy's NVRTC): one prompt with nothing cached at 1024 tokens with 32/8
heads (tp 1) and 16/4 (tp 2), 4096 tokens with 32/8, and one query row after 1023 cached
positions; bf16 and e4m3 pools. A plan cuts every query tile of more than RUN key tiles into
runs of about RUN; RUN is the work per slot (the engine's plan) divided by DIV, at least MIN.
Medians of 30 launches (CUDA events); each plan's output against whole query tiles (largest
difference relative to the largest value).

Usage: prefill_work.py"""
import numpy as np
import cupy as cp

import cupy_kernels
from cupy_kernels import bf16, e4m3

SRC = cupy_kernels.source(["common.cuh", "fp8.cu", "kv.cuh", "prefill_attn.cu"])
D, MAX_SPLITS, PARTS = 128, 16, 4096
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]


def plan(q_len, prefix, nh, slots, div, min_run):
    """Entries (4 ints each) as prefill_work builds them, with run = ceil(work / (div slots))."""
    tiles = [((prefix + min(q_len, off + 64) + 63) // 64, off) for off in range(0, q_len, 64)]
    work = sum(t[0] for t in tiles) * nh
    if div == 0:
        run = 1 << 30  # whole query tiles
    else:
        run = max(-(-work // (div * slots)), min_run)
    entries, part = [], 0
    for units, off in tiles:
        if units <= run:
            entries.append((units, [0, off, 1 << 16, 0]))
            continue
        r = max(run, -(-units // MAX_SPLITS))
        n = -(-units // r)
        per = -(-units // n)
        for s in range(n):
            entries.append((min(per, units - s * per), [0, off, s | n << 16, part]))
        part += n
    entries.sort(key=lambda e: e[0])
    return np.array([e[1] for e in entries], np.int32).reshape(-1), len(entries), run


def main():
    mod = cupy_kernels.module(SRC)
    slots = SMS * 2  # blocks a multiprocessor holds (254 registers a thread): prefill_slots
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {SMS} SMs, {slots} slots")
    print()
    print("| queries | after | heads | pool | plan | run | blocks | µs | vs whole | output vs whole |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    plans = [("whole", 0, 0), ("work per slot (engine)", 1, 2), ("/2", 2, 2), ("/4", 4, 2),
             ("/2, min 1", 2, 1), ("fixed 4", 1 << 20, 4), ("fixed 2", 1 << 20, 2)]
    for q_len, prefix, nh in [(1024, 0, 32), (1024, 0, 16), (4096, 0, 32), (1, 1023, 32)]:
        nkv = nh // 4
        n = prefix + q_len
        cp.random.seed(5)
        q_stride = (nh + 2 * nkv) * D
        qkv = bf16(cp.random.standard_normal((q_len, q_stride), dtype=cp.float32))
        i32 = lambda v: cp.asarray(np.array(v, np.int32))
        q_indptr, kv_indptr, idx, pre = i32([0, q_len]), i32([0, n]), i32(np.arange(n)), i32([prefix])
        po = cp.zeros(PARTS * nh * 64 * D, cp.float32)
        pml = cp.zeros(PARTS * nh * 64 * 2, cp.float32)
        cnt = cp.zeros(PARTS * nh, cp.uint32)
        for fp8 in (False, True):
            if fp8:
                kc, vc = e4m3((n, nkv * D)), e4m3((n, nkv * D))
            else:
                kc = bf16(cp.random.standard_normal((n, nkv * D), dtype=cp.float32) * 0.5)
                vc = bf16(cp.random.standard_normal((n, nkv * D), dtype=cp.float32))
            f = mod.get_function("prefill_attn_d128" + ("_e4m3" if fp8 else ""))
            ref, base = None, None
            for name, div, min_run in plans:
                t, blocks, run = plan(q_len, prefix, nh, slots, div, min_run)
                tiles = cp.asarray(t)
                out = cp.zeros((q_len, nh * D), dtype=cp.uint16)
                args = (out, np.int32(nh * D), qkv, np.int32(q_stride), kc, vc, np.int32(nkv * D),
                        tiles, q_indptr, kv_indptr, idx, pre, np.int32(4), np.float32(0.088 * 1.4427),
                        np.float32(1.0), po, pml, cnt)
                us = cupy_kernels.timed(lambda: f((blocks, nh), (128,), args), 30)
                o = out.get()
                if ref is None:
                    ref, base = o, us
                fa = (ref.astype(np.uint32) << 16).view(np.float32)
                fb = (o.astype(np.uint32) << 16).view(np.float32)
                d = float(np.max(np.abs(fa - fb)) / max(np.max(np.abs(fa)), 1e-30))
                print(f"| {q_len} | {prefix} | {nh}/{nkv} | {'e4m3' if fp8 else 'bf16'} | {name} | "
                      f"{run if div else '-'} | {blocks * nh} | {us:.1f} | {base / us:.2f}x | {d:.1e} |",
                      flush=True)
            assert int(cnt.max().get()) == 0, "arrival counters left non-zero"


if __name__ == "__main__":
    main()
