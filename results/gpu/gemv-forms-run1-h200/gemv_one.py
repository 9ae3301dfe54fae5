"""One launch each of the FP8 and bf16 gate_up GEMVs (batch 1, r16), for a profiler."""
import os, sys
import numpy as np
import cupy as cp
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemv_xs as g

mod = g.cupy_kernels.module(g.PRE + g.NEW)
ws = cp.zeros(1 << 20, cp.float32)
cnt = cp.zeros(4096, cp.uint32)
for name, fp8, rms, rt, K, N, mode in [("fp8 gate_up", True, True, 1, 4096, 28672, 2),
                                       ("bf16 gate_up", False, True, 1, 4096, 28672, 2),
                                       ("fp8 down", True, False, 1, 14336, 4096, 1)]:
    w, x, scale, nw, y0 = g.data(fp8, K, N)
    f = mod.get_function(g.kname(fp8, rms, rt))
    y = cp.zeros((8, N), cp.uint16)
    for i in range(3):
        g.launch(f, fp8, rms, rt, 1, K, N, mode, w[i % len(w)], x, scale, nw, y, 0, ws, cnt)
    cp.cuda.Device().synchronize()
print("done")
