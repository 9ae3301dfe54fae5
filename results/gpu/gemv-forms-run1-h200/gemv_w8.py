"""FP8 decode GEMV: W8A8 (x quantized per token row, e4m3 MMA) against the W8A16 form in place
before; error against a float64 reference of each one's arithmetic; µs per launch."""
import os, sys
import numpy as np
import cupy as cp
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemv_xs as g

SHAPES = [("qkv", True, 2, 4096, 6144, 0), ("o", False, 1, 4096, 4096, 1),
          ("gate_up", True, 1, 4096, 28672, 2), ("down", False, 1, 14336, 4096, 1),
          ("tp2 qkv", True, 1, 4096, 3072, 0), ("tp2 o", False, 1, 2048, 4096, 1),
          ("tp2 gate_up", True, 1, 4096, 14336, 2), ("tp2 down", False, 1, 7168, 4096, 1)]
CH2 = [("gemv_impl<1, 2, false, true>", "gemv_impl<1, 4, false, true>"),
       ("gemv_impl<2, 1, false, true>", "gemv_impl<2, 2, false, true>"),
       ("gemv_impl<1, 2, true, true>", "gemv_impl<1, 4, true, true>"),
       ("gemv_impl<2, 1, true, true>", "gemv_impl<2, 2, true, true>")]


def tb(u16):  # bf16 bits (numpy uint16) -> float32 torch
    return torch.from_numpy((u16.astype(np.uint32) << 16).view(np.float32).copy())


def rbf(t):
    return t.to(torch.bfloat16).to(torch.float32)


def reference(w8, wscale, x, nw, y0, M, K, N, mode, rms, a8):
    w = torch.from_numpy(w8).view(torch.float8_e4m3fn).to(torch.float64)
    xs = tb(x[:M])
    if rms:
        inv = torch.rsqrt((xs.double() ** 2).mean(1, keepdim=True) + 1e-5).float()
        xs = rbf(tb(nw)[None, :] * rbf(xs * inv))
    if a8:
        amax = xs.abs().amax(1, keepdim=True)
        s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        xq = (xs / s).to(torch.float8_e4m3fn).to(torch.float64) * s.double()
    else:
        xq = xs.double()
    acc = (xq @ w.T) * torch.from_numpy(wscale).double()[None, :]
    if mode == 0:
        return acc
    if mode == 1:
        return acc + tb(y0[:M, :N]).double()
    inter = N // 2
    gt, up = rbf(acc[:, :inter].float()), rbf(acc[:, inter:].float())
    return (rbf(torch.nn.functional.silu(gt)) * up).double()


def main():
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    W8 = open(os.path.join(g.HERE, "gemv_w8a8.cu")).read()
    NOQ = [("gv_quantize_x<NORM>(x, nw, s_norm + GV_WARPS * GV_MAX_M, M, K, s_norm, s_xsc);",
            "if (threadIdx.x < GV_MAX_M) s_xsc[threadIdx.x] = 1.0f; __syncthreads();")]
    forms = [("w8a16 (before)", g.cupy_kernels.module(g.BASE), False),
             ("w8a8", g.cupy_kernels.module(g.PRE + W8), True),
             ("w8a8 loop alone (x not quantized)", g.cupy_kernels.module(g.PRE + W8, NOQ), True),
             ("w8a8 loop alone, 2x units", g.cupy_kernels.module(g.PRE + W8, NOQ + CH2), True)]
    ws = cp.zeros(1 << 20, cp.float32)
    cnt = cp.zeros(4096, cp.uint32)
    print("| shape | M | form | regs | µs | GB/s | rel err vs its f64 reference |")
    print("|---|---|---|---|---|---|---|")
    for name, rms, rt, K, N, mode in SHAPES:
        w, x, scale, nw, y0 = g.data(True, K, N)
        nout = N // 2 if mode == 2 else N
        w8 = w[0].get()
        for M in (1, 8):
            for form, mod, a8 in forms * 2:
                f = mod.get_function(g.kname(True, rms, rt))
                smem = M * (K + 64) if a8 else 0
                if smem > 48 * 1024:
                    f.max_dynamic_shared_size_bytes = smem
                y = cp.zeros((8, nout), cp.uint16)
                y[...] = y0[:, :nout]
                g.launch(f, True, rms, rt, M, K, N, mode, w[0], x, scale, nw, y, smem, ws, cnt)
                got = tb(y[:M].get()).double()
                ref = reference(w8, scale.get(), x.get(), nw.get(), y0.get(), M, K, N, mode, rms, a8)
                err = float((got - ref).norm() / ref.norm())
                stream = cp.cuda.Stream(non_blocking=True)
                with stream:
                    stream.begin_capture()
                    for i in range(20):
                        g.launch(f, True, rms, rt, M, K, N, mode, w[i % len(w)], x, scale, nw, y, smem, ws, cnt)
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
                print(f"| fp8 {name} r{16 * rt} | {M} | {form} | {f.num_regs} | {us:.1f} | {K * N / us / 1e3:.0f} | {err:.2e} |", flush=True)


if __name__ == "__main__":
    main()
