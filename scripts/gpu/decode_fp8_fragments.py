#!/usr/bin/env python3
"""The streamed FP8 decode attention's fragment orders, checked on the host (no GPU): a
lane-level model of `decode_attn_fp8_impl` (kernels/src/cu/decode_attn_tc.cu) for one 64-key
tile, with mma.sync m16n8k16 and ldmatrix.x4.trans as the PTX manual lays out their fragments:
the cp.async placement with its swizzles, the K fragments read as 16-byte words of a key, the
query fragments in the same order of dims, ldmatrix.trans on the V bytes as 16-bit pairs and the
even/odd-dim MMAs, and where each output lands. S = Q K^T and O = P V must equal the plain
products; every K read and ldmatrix phase must touch 32 distinct banks. Bytes stand for values
through val() (the widening itself is the kernel checks' to test). Needs numpy.
Usage: python3 scripts/gpu/decode_fp8_fragments.py"""
import numpy as np
rng = np.random.default_rng(0)
def val(b): return (b.astype(np.float64) - 128.0) / 7.0
def mma(afr, bfr, cfr):
    # afr[lane] = (a0..a3) each a pair (lo, hi); bfr[lane] = (b0, b1) pairs; cfr[lane] = c0..c3
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
    for l in range(32):
        g, t = l >> 2, l & 3
        a = afr[l]
        A[g, 2*t:2*t+2] = a[0]; A[g+8, 2*t:2*t+2] = a[1]; A[g, 2*t+8:2*t+10] = a[2]; A[g+8, 2*t+8:2*t+10] = a[3]
        b = bfr[l]
        B[2*t:2*t+2, g] = b[0]; B[2*t+8:2*t+10, g] = b[1]
        c = cfr[l]
        C[g, 2*t:2*t+2] = c[0:2]; C[g+8, 2*t:2*t+2] = c[2:4]
    D = A @ B + C
    return [np.array([D[l>>2, 2*(l&3)], D[l>>2, 2*(l&3)+1], D[(l>>2)+8, 2*(l&3)], D[(l>>2)+8, 2*(l&3)+1]]) for l in range(32)]
def kchunk(D, row, c): return c ^ ((row & 1) << 2) if D == 128 else c
def vchunk(D, row, c): return c ^ (row & 7) if D == 128 else c ^ ((row >> 1) & 3)
def run(D, G):
    BK = 64; CH = D // 16; RPP = 128 // CH; NP = BK // RPP
    K = rng.integers(0, 256, (BK, D)); V = rng.integers(0, 256, (BK, D))
    Q = rng.standard_normal((G, D))
    tk = np.full(BK * D, -1); tv = np.full(BK * D, -1)
    for tid in range(128):
        c = tid % CH
        for i in range(NP):
            r = tid // CH + i * RPP
            o = r * D + kchunk(D, r, c) * 16; assert (tk[o:o+16] == -1).all(); tk[o:o+16] = K[r, c*16:c*16+16]
            o = r * D + vchunk(D, r, c) * 16; assert (tv[o:o+16] == -1).all(); tv[o:o+16] = V[r, c*16:c*16+16]
    assert (tk >= 0).all() and (tv >= 0).all()
    S_all = np.zeros((G, BK)); O_all = np.zeros((G, D)); P = rng.standard_normal((G, BK))
    for warp in range(4):
        # Q fragments per lane
        qf = {}
        for l in range(32):
            g, t = l >> 2, l & 3
            for kb in range(D // 16):
                col = (kb >> 2) * 64 + t * 16 + (kb & 3) * 4
                lo = Q[g, col:col+2] if g < G else np.zeros(2); hi = Q[g, col+2:col+4] if g < G else np.zeros(2)
                qf[l, kb] = (lo, np.zeros(2), hi, np.zeros(2))
        for nb in range(2):
            acc = [np.zeros(4) for _ in range(32)]
            words = {}
            for l in range(32):
                g, t = l >> 2, l & 3; key = warp * 16 + nb * 8 + g
                for m in range(D // 64):
                    o = key * D + kchunk(D, key, m * 4 + t) * 16
                    w = tk[o:o+16]
                    for e in range(4): words[l, m*4+e] = w[4*e:4*e+4]
            for kb in range(D // 16):
                afr = [qf[l, kb] for l in range(32)]
                bfr = [(val(words[l, kb][0:2]), val(words[l, kb][2:4])) for l in range(32)]
                acc = mma(afr, bfr, acc)
            for l in range(32):
                g, t = l >> 2, l & 3
                if g < G:
                    for e in range(2): S_all[g, warp*16 + nb*8 + 2*t + e] = acc[l][e]
        # P V
        pa = []
        for l in range(32):
            g, t = l >> 2, l & 3
            p = P[g] if g < G else np.zeros(BK)
            pa.append((p[warp*16 + 2*t: warp*16 + 2*t+2], np.zeros(2), p[warp*16 + 8 + 2*t: warp*16+8+2*t+2], np.zeros(2)))
        o = {l: np.zeros((D // 16, 4)) for l in range(32)}
        for qb in range(0, D // 16, 2):
            # ldmatrix.x4.trans: lane l supplies row address of matrix l>>3, row l&7
            rows = {}
            for l in range(32):
                vkey = warp * 16 + ((l >> 3) & 1) * 8 + (l & 7); chunk = qb + (l >> 4)
                a = vkey * D + vchunk(D, vkey, chunk) * 16
                rows[l >> 3, l & 7] = tv[a:a+16]
            regs = {}
            for l in range(32):
                t, g = l & 3, l >> 2
                for i in range(4):
                    r0 = rows[i, 2*t]; r1 = rows[i, 2*t+1]
                    regs[l, i] = np.array([r0[2*g], r0[2*g+1], r1[2*g], r1[2*g+1]])
            for h in range(2):
                even_in = [np.array([o[l][qb+h][0], o[l][qb+h][2], 0, 0]) for l in range(32)]
                odd_in = [np.array([o[l][qb+h][1], o[l][qb+h][3], 0, 0]) for l in range(32)]
                be = [(val(regs[l, 2*h][[0, 2]]), val(regs[l, 2*h+1][[0, 2]])) for l in range(32)]
                bo = [(val(regs[l, 2*h][[1, 3]]), val(regs[l, 2*h+1][[1, 3]])) for l in range(32)]
                ev = mma(pa, be, even_in); od = mma(pa, bo, odd_in)
                for l in range(32):
                    o[l][qb+h] = [ev[l][0], od[l][0], ev[l][1], od[l][1]]
        for l in range(32):
            g, t = l >> 2, l & 3
            if g < G:
                for qb in range(D // 16):
                    O_all[g, qb*16 + t*4: qb*16 + t*4 + 4] += o[l][qb]
    S_ref = Q @ val(K).T; O_ref = P @ val(V)
    print(f"D {D} G {G}:", "S err", np.abs(S_all - S_ref).max(), "O err", np.abs(O_all - O_ref).max())
    # bank conflicts of the K reads (lds.128, phases of 8 lanes) and the ldmatrix rows
    for nb in range(2):
        for m in range(D // 64):
            for ph in range(4):
                banks = set()
                for l in range(ph*8, ph*8+8):
                    g, t = l >> 2, l & 3; key = nb*8 + g
                    a = key * D + kchunk(D, key, m*4+t) * 16
                    for wd in range(4): 
                        b = (a // 4 + wd) % 32; assert b not in banks, ("K conflict", D, nb, m, ph); banks.add(b)
    for qb in range(0, D // 16, 2):
        for i in range(4):
            banks = set()
            for r in range(8):
                vkey = (i & 1) * 8 + r; a = vkey * D + vchunk(D, vkey, qb + (i >> 1)) * 16
                for wd in range(4):
                    b = (a // 4 + wd) % 32; assert b not in banks, ("V conflict", D, qb, i); banks.add(b)
for D in (64, 128):
    for G in (1, 4, 8):
        run(D, G)
print("ok")
