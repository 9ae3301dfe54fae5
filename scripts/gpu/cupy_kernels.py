"""Helpers of the CuPy harnesses that time kernels of kernels/src/cu alone (row_kernels.py,
decode_attn_tc.py): the sources as the engine concatenates them, compiled by NVRTC with textual
edits per variant, and a CUDA-event timer."""
import os
import numpy as np
import cupy as cp

CU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "kernels", "src", "cu")


def source(files):
    """The named files of kernels/src/cu, concatenated in the given order."""
    return "".join(open(os.path.join(CU, f)).read() for f in files)


def module(src, edits=(), extra=""):
    """`src` with each (old, new) edit applied (every `old` must occur), plus `extra`, compiled."""
    for old, new in edits:
        if old not in src:
            raise ValueError(f"variant edit not found: {old[:60]!r}")
        src = src.replace(old, new)
    return cp.RawModule(code=src + extra, options=("--std=c++17",))


def timed(fn, n=50):
    """Median µs of `n` calls of `fn` (after one), each between two CUDA events."""
    fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(n):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
    return float(np.median(ts))
