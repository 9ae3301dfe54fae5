"""Helpers of the CuPy harnesses that time kernels of kernels/src/cu alone (row_kernels.py,
decode_attn_tc.py, decode_attn_b1.py, prefill_attn.py, prefill_work.py, silu_exhaustive.py): the
sources as the engine concatenates them, compiled by NVRTC with textual edits per variant, a
CUDA-event timer, and bf16 / e4m3 test data."""
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


def bf16(x):
    """float32 (CuPy) to bf16 bits, nearest even."""
    u = x.astype(cp.float32).view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


def e4m3(shape):
    """e4m3 bytes of moderate values (any sign, exponent field 3..9, any mantissa): no NaNs."""
    r = cp.random.randint(0, 1 << 30, shape, dtype=cp.int32)
    return ((r & 0x80) | ((3 + (r >> 8) % 7) << 3) | ((r >> 12) & 7)).astype(cp.uint8)
