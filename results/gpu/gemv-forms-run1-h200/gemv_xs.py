"""Decode GEMV: x staged in shared memory, the FP8 weights' conversion forms, FP8 steps of twice
the units; same bits as the form in place, and µs per launch (graph of 20, weights rotated)."""
import os, sys
import numpy as np
import cupy as cp
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu"))
import cupy_kernels

HERE = os.path.dirname(os.path.abspath(__file__))
PRE = cupy_kernels.source(["common.cuh", "fp8.cu"])
BASE = PRE + open(os.path.join(HERE, "gemv_base.cu")).read()
NEW = cupy_kernels.source(["gemv.cu"])  # the tree as it is
rng = np.random.default_rng(1)
SHAPES = [
    ("fp8 qkv", True, True, 2, 4096, 6144, 0),
    ("fp8 qkv", True, True, 1, 4096, 6144, 0),
    ("fp8 o", True, False, 1, 4096, 4096, 1),
    ("fp8 o", True, False, 2, 4096, 4096, 1),
    ("fp8 gate_up", True, True, 1, 4096, 28672, 2),
    ("fp8 gate_up", True, True, 2, 4096, 28672, 2),
    ("fp8 down", True, False, 1, 14336, 4096, 1),
    ("fp8 down", True, False, 2, 14336, 4096, 1),
    ("bf16 gate_up", False, True, 1, 4096, 28672, 2),
    ("bf16 gate_up", False, True, 2, 4096, 28672, 2),
    ("bf16 tp2 gate_up", False, True, 1, 4096, 14336, 2),
    ("bf16 tp2 gate_up", False, True, 2, 4096, 14336, 2),
    ("bf16 tp2 down", False, False, 1, 7168, 4096, 1),
    ("bf16 tp2 down", False, False, 2, 7168, 4096, 1),
]
CH2 = [("gemv_entry<1, 2, false, true>", "gemv_entry<1, 4, false, true>"),
       ("gemv_entry<2, 1, false, true>", "gemv_entry<2, 2, false, true>"),
       ("gemv_entry<1, 2, true, true>", "gemv_entry<1, 4, true, true>"),
       ("gemv_entry<2, 1, true, true>", "gemv_entry<2, 2, true, true>")]


def bf16(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def data(fp8, K, N):
    wbytes = K * N * (1 if fp8 else 2)
    copies = max(2, -(-200_000_000 // wbytes))
    if fp8:
        r = cp.random.randint(0, 1 << 30, (copies, N, K), dtype=cp.int32)
        w = ((r & 0x80) | ((3 + (r >> 8) % 7) << 3) | ((r >> 12) & 7)).astype(cp.uint8)
    else:
        w = cp.asarray(bf16(rng.standard_normal((N, K)).astype(np.float32) * 0.02))
        w = cp.stack([w] * copies)
    x = cp.asarray(bf16(rng.standard_normal((8, K)).astype(np.float32)))
    scale = cp.asarray(rng.uniform(0.001, 0.01, N).astype(np.float32))
    nw = cp.asarray(bf16(rng.uniform(0.5, 1.5, K).astype(np.float32)))
    y0 = cp.asarray(bf16(rng.standard_normal((8, N)).astype(np.float32)))
    return w, x, scale, nw, y0


def launch(f, fp8, rms, rt, M, K, N, mode, w, x, scale, nw, y, smem, ws, cnt):
    tiles = (N // 2) // (8 * rt) if mode == 2 else N // (16 * rt)
    args = [y, x, w]
    if fp8:
        args.append(scale)
    if rms:
        args += [nw, np.float32(1e-5)]
    args += [np.int32(M), np.int32(K), np.int32(N), np.int32(mode), np.int32(1), ws, cnt, np.int32(1)]
    f((tiles, 1), (256,), tuple(args), shared_mem=smem)


def kname(fp8, rms, rt):
    return f"gemv_{'rms_' if rms else ''}{'fp8' if fp8 else 'bf16'}_r{16 * rt}"


def main():
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    forms = [("as it is", cupy_kernels.module(PRE + NEW), False)]
    ws = cp.zeros(1 << 20, cp.float32)
    cnt = cp.zeros(4096, cp.uint32)
    print("| shape | M | form | regs | µs | GB/s | same bits |")
    print("|---|---|---|---|---|---|---|")
    for name, fp8, rms, rt, K, N, mode in SHAPES:
        w, x, scale, nw, y0 = data(fp8, K, N)
        nout = N // 2 if mode == 2 else N
        for M in (1, 8):
            if M > 1 and not name.startswith("fp8"):
                continue
            need = M * ((K // 8) + (1 if fp8 else 4)) * 16
            ref = None
            for form, mod, staged in forms * 2:
                if not fp8 and "2x" in form:
                    continue
                f = mod.get_function(kname(fp8, rms, rt))
                smem = need if staged else 0
                if staged and need > 100 * 1024:
                    continue
                if smem:
                    f.max_dynamic_shared_size_bytes = smem
                y = cp.zeros((8, nout), cp.uint16)
                y[...] = y0[:, :nout]
                try:
                    launch(f, fp8, rms, rt, M, K, N, mode, w[0], x, scale, nw, y, smem, ws, cnt)
                except Exception as e:
                    print(f"| {name} | {M} | {form} | static {f.shared_size_bytes} dyn {smem}: {e} |")
                    continue
                out = y[:M].get()
                same = "" if ref is None else ("yes" if np.array_equal(out, ref) else "NO")
                if ref is None:
                    ref = out
                for i in range(3):
                    launch(f, fp8, rms, rt, M, K, N, mode, w[i % len(w)], x, scale, nw, y, smem, ws, cnt)
                stream = cp.cuda.Stream(non_blocking=True)
                with stream:
                    stream.begin_capture()
                    for i in range(20):
                        launch(f, fp8, rms, rt, M, K, N, mode, w[i % len(w)], x, scale, nw, y, smem, ws, cnt)
                    graph = stream.end_capture()
                    graph.launch(stream)
                    stream.synchronize()
                    ts = []
                    for rep in range(15):
                        a, b = cp.cuda.Event(), cp.cuda.Event()
                        a.record(stream)
                        graph.launch(stream)
                        b.record(stream)
                        b.synchronize()
                        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / 20)
                us = float(np.median(ts))
                gb = K * N * (1 if fp8 else 2) / us / 1e3
                print(f"| {name} r{16 * rt} | {M} | {form} | {f.num_regs} | {us:.1f} | {gb:.0f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
