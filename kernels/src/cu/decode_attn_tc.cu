// Decode attention on tensor cores, for batches large enough that every (sequence, KV head) pair
// gets a block of its own (one split: no partials, no merge).
//
// At such batches the per-key work of decode_attn (a dot product per query head of the group on
// the FP32 units, its reduction across the lanes of a key by shuffles, FP8 bytes widened value by
// value) made it compute-bound: with an FP8 pool at batch 256 and 1000 cached keys it read the
// pool at under half the copy bandwidth. Here the GQA group's G query heads are the rows of an
// MMA A operand (mma.sync m16n8k16, bf16, f32 accumulators; rows G..15 are zero), so the scores
// of 16 keys against every head of the group are one MMA per 16 dims, and P V is one MMA per 8
// dims, the work of prefill_attn with a 16-row query tile.
//
// Grid (kv_heads, batch), DTC_THREADS threads: the KV heads of a sequence are neighbouring blocks,
// so the blocks running at once read every head of the same pool rows (a slot's heads are
// adjacent in memory) instead of one head's slice of many sequences' rows. Each tile of DTC_BK
// keys is copied by the whole block into shared memory through cp.async and each warp takes 16
// of its keys: scores, an online softmax of its own, P V. At the end the warps' (max, sum,
// output) are combined in shared memory in warp order. A bf16 pool takes decode_attn_tc_impl;
// an FP8 pool decode_attn_fp8_impl (below), whose tiles stay bytes in shared memory and are
// widened to f16 in the MMA fragments.
//
// Loads in flight: the next tile's pool indices are read while a tile's rows are, and the
// blocks resident on a multiprocessor overlap one another's loads and arithmetic.
//
// KV scales as in decode_attn: the K scale folded into scale_log2 by the host, the V scale on the
// output (o * v_scale / l). Layouts as decode_attn's: q row of sequence b at q + b * q_stride,
// head h at + h * D; pool rows of kv_stride elements per slot.

#define DTC_WARPS 4
#define DTC_THREADS (DTC_WARPS * 32)
// keys per tile: 16 per warp (one MMA k-step of P V)
#define DTC_BK (DTC_WARPS * 16)

// two floats as two f16 (lo in the low half)
__device__ __forceinline__ unsigned int dtc_pack_h2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// two bf16 (a word, lowest first) as two f16
__device__ __forceinline__ unsigned int dtc_bf2_to_h2(unsigned int w) {
    return dtc_pack_h2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// Pool slots of this thread's rows (tid / CH + i * RPP, i < NP) of the tile starting at key
// kt of a sequence of `len` keys whose indices start at kv_indices[beg]; -1 past its end.
template <int NP, int RPP, int CH>
__device__ __forceinline__ void dtc_slots(int (&slot)[NP], const int* __restrict__ kv_indices,
                                          int beg, int kt, int len, int tid) {
#pragma unroll
    for (int i = 0; i < NP; ++i) {
        const int r = kt + tid / CH + i * RPP;
        slot[i] = r < len ? kv_indices[beg + r] : -1;
    }
}

// One warp's online softmax step over its 16 keys (first key `key0`): row g's scores s (two
// n-blocks of 8; elements 0 and 1 are keys nb * 8 + 2 tig + e) are masked past the sequence,
// scaled (log2 domain) and replaced by their exponentials; (m0, l0) move on; returns the factor
// the outputs so far are scaled by.
__device__ __forceinline__ float dtc_softmax(float (&s)[2][4], int key0, int len, float sl2,
                                             float& m0, float& l0) {
    const int tig = threadIdx.x & 3;
    float mx = NEG_INF;
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int key = key0 + nb * 8 + tig * 2 + e;
            const float v = key < len ? s[nb][e] * sl2 : NEG_INF;
            s[nb][e] = v;
            mx = fmaxf(mx, v);
        }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m0, mx);
    // a warp with no key so far keeps m = -inf; guard the subtraction
    const float base = mn == NEG_INF ? 0.0f : mn;
    const float alpha = exp2f(m0 - base);
    m0 = mn;
    float rs = 0.0f;
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
        s[nb][0] = exp2f(s[nb][0] - base);
        s[nb][1] = exp2f(s[nb][1] - base);
        rs += s[nb][0] + s[nb][1];
    }
    l0 = l0 * alpha + rs;
    return alpha;
}

// The warps' results combined in warp order: s_o holds warp w's unnormalised output of head gg
// at (w G + gg) D, s_m / s_l its (max, sum); out row gets (sum over w of o e_w) v_scale / (sum
// of l e_w), e_w = 2^(m_w - max).
template <int D, int G>
__device__ __forceinline__ void dtc_finish(const float* s_o, const float (&s_m)[DTC_WARPS][G],
                                           const float (&s_l)[DTC_WARPS][G], bf16_t* orow,
                                           float vs) {
    for (int idx = threadIdx.x; idx < G * D; idx += DTC_THREADS) {
        const int gg = idx / D, d = idx % D;
        float m = NEG_INF;
#pragma unroll
        for (int w = 0; w < DTC_WARPS; ++w) m = fmaxf(m, s_m[w][gg]);
        float acc = 0.0f, l = 0.0f;
#pragma unroll
        for (int w = 0; w < DTC_WARPS; ++w) {
            if (s_m[w][gg] != NEG_INF) {
                const float e = exp2f(s_m[w][gg] - m);
                acc += s_o[(w * G + gg) * D + d] * e;
                l += s_l[w][gg] * e;
            }
        }
        orow[idx] = f2bf(l > 0.0f ? (acc * vs) / l : 0.0f);
    }
}

template <int D, int G, typename KV>
__device__ __forceinline__ void decode_attn_tc_impl(
    bf16_t* __restrict__ out, int out_stride, const bf16_t* __restrict__ q, int q_stride,
    const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache, int kv_stride,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices, float scale_log2,
    float v_scale) {
    static_assert(G >= 1 && G <= 8, "the group's heads are rows 0..7 of the MMA tile");
    static_assert(sizeof(typename KV::T) == 2, "a bf16 pool (FP8 pools: decode_attn_fp8_impl)");
    constexpr int LD = D + 8;             // padded rows: fragment loads free of bank conflicts
    constexpr int CH = D / 8;             // 16-byte loads per row
    constexpr int RPP = DTC_THREADS / CH; // rows per pass of the block
    constexpr int NP = DTC_BK / RPP;      // passes per tile
    // K and V tiles; after the last tile sK holds the warps' outputs for the combination
    __shared__ __align__(16) bf16_t sK[DTC_BK * LD];
    __shared__ __align__(16) bf16_t sV[DTC_BK * LD];
    __shared__ float s_m[DTC_WARPS][G], s_l[DTC_WARPS][G];
    static_assert(DTC_WARPS * G * D * sizeof(float) <= sizeof(sK), "outputs fit in sK");

    pdl_wait();
    pdl_trigger_early();
    const int kvh = blockIdx.x, b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int beg = kv_indptr[b];
    const int len = kv_indptr[b + 1] - beg;
    const int h0 = kvh * G;
    const int c = tid % CH;
    const size_t head_off = (size_t)kvh * D + c * 8;
    bf16_t* orow = out + (size_t)b * out_stride + (size_t)h0 * D;
    if (len <= 0) {
        for (int idx = tid; idx < G * D; idx += DTC_THREADS) orow[idx] = 0;
        pdl_trigger_end();
        return;
    }

    // The group's query heads as A fragments: row g is head h0 + g; rows G..15 are zero.
    unsigned int qf[D / 16][4];
    {
        const bf16_t* qrow = q + (size_t)b * q_stride + (size_t)(h0 + g) * D;
#pragma unroll
        for (int kb = 0; kb < D / 16; ++kb) {
            const int col = kb * 16 + tig * 2;
            qf[kb][0] = g < G ? *(const unsigned int*)(qrow + col) : 0u;
            qf[kb][1] = 0u;
            qf[kb][2] = g < G ? *(const unsigned int*)(qrow + col + 8) : 0u;
            qf[kb][3] = 0u;
        }
    }

    int slot[NP];
    dtc_slots<NP, RPP, CH>(slot, kv_indices, beg, 0, len, tid);
    // Copies the tile whose pool slots `slot` holds into the tiles, then reads the slots of the
    // tile DTC_BK keys further while the copies are in flight.
    auto fetch = [&](int kt) {
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            const int r = tid / CH + i * RPP;
            const size_t row = slot[i] >= 0 ? (size_t)slot[i] * kv_stride + head_off : 0;
            cp_async16(sK + r * LD + c * 8, k_cache + row, slot[i] >= 0);
            cp_async16(sV + r * LD + c * 8, v_cache + row, slot[i] >= 0);
        }
        cp_commit();
        dtc_slots<NP, RPP, CH>(slot, kv_indices, beg, kt + DTC_BK, len, tid);
    };
    float o[D / 8][2];  // row g's outputs (rows g + 8 are padding and stay zero)
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) o[nb][0] = o[nb][1] = 0.0f;
    float m0 = NEG_INF, l0 = 0.0f;

    for (int kt = 0; kt < len; kt += DTC_BK) {
        fetch(kt);
        cp_wait<0>();
        __syncthreads();

        // scores of this warp's 16 keys (two n-blocks of 8) against the group's heads
        float s[2][4];
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
            // B fragments of two 16-dim steps per ldmatrix: matrices (keys, dims kb*16 + 0/8)
            // and (keys, (kb + 1)*16 + 0/8)
            const int mi = lane >> 3;
            const bf16_t* krow =
                sK + (warp * 16 + nb * 8 + (lane & 7)) * LD + (mi >> 1) * 16 + (mi & 1) * 8;
#pragma unroll
            for (int kb = 0; kb < D / 16; kb += 2) {
                unsigned int b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                             : "r"(smem_addr(krow + kb * 16)));
                mma_bf16_16816(s[nb], qf[kb], b0, b1);
                mma_bf16_16816(s[nb], qf[kb + 1], b2, b3);
            }
        }
        const float alpha = dtc_softmax(s, kt + warp * 16, len, scale_log2, m0, l0);
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb) {
            o[nb][0] *= alpha;
            o[nb][1] *= alpha;
        }
        // O += P V over the warp's 16 keys: P's accumulator layout is the A fragment
        const unsigned int pa[4] = {pack_bf2(s[0][0], s[0][1]), 0u, pack_bf2(s[1][0], s[1][1]),
                                    0u};
        const int vkey = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
        for (int nb = 0; nb < D / 8; nb += 2) {
            const int dim = nb * 8 + (lane >> 4) * 8;
            unsigned int r0, r1, r2, r3;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                         : "r"(smem_addr(sV + vkey * LD + dim)));
            float acc0[4] = {o[nb][0], o[nb][1], 0.0f, 0.0f};
            float acc1[4] = {o[nb + 1][0], o[nb + 1][1], 0.0f, 0.0f};
            mma_bf16_16816(acc0, pa, r0, r1);
            mma_bf16_16816(acc1, pa, r2, r3);
            o[nb][0] = acc0[0];
            o[nb][1] = acc0[1];
            o[nb + 1][0] = acc1[0];
            o[nb + 1][1] = acc1[1];
        }
        __syncthreads();  // every warp is done with the tile
    }

    // the warps' results, combined in warp order
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    float* s_o = reinterpret_cast<float*>(sK);
    if (g < G) {
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb) {
            const int d = nb * 8 + tig * 2;
            s_o[(warp * G + g) * D + d] = o[nb][0];
            s_o[(warp * G + g) * D + d + 1] = o[nb][1];
        }
        if (tig == 0) {
            s_m[warp][g] = m0;
            s_l[warp][g] = l0;
        }
    }
    __syncthreads();
    pdl_trigger_end();
    dtc_finish<D, G>(s_o, s_m, s_l, orow, v_scale);
}

// The FP8 pools' form. The pool's bytes go into shared memory as they are, by cp.async, two
// tiles deep (the next tile's copies in flight while a tile is computed, one barrier a tile),
// and the MMA fragments are widened from those bytes to f16 (in units of the pool type's
// F16_UNIT, folded into the softmax and output scales; query and P are rounded to f16, which
// keeps more bits than bf16 below 65504). A form that widened each tile into f16 tiles in shared
// memory first, and read them with ldmatrix, read an e4m3 pool at 0.80-0.84 of the copy rate on
// an H100; this one at ~0.97 (456 sequences of ~1500 keys: 1.41 GB a layer in 483 µs). Both
// operands take an order of their own over the dimension they sum:
// - S = Q K^T sums over dims. A thread's B fragment of k-step kb = 4m + s is the four bytes
//   64m + 16 tig + 4s .. + 3 of its key (k 2tig, 2tig+1 are the first two; 2tig+8, 2tig+9 the
//   last two), so a 16-byte read gives four k-steps; the query fragments take the same dims.
// - O = P V sums over keys, with V's dims as the n columns: ldmatrix.trans on the bytes read as
//   16-bit pairs gives a thread, of keys 2tig and 2tig+1, the byte pair of dims 2g and 2g+1;
//   one MMA takes the even dims (n column g = dim 2g of the 16) and one the odd, so a thread's
//   outputs are dims 16q + 4tig .. + 3 of its row.
// The 16-byte chunks of a key row are swizzled in shared memory so that both reads are free of
// bank conflicts.
template <int D>
__device__ __forceinline__ int dts_k_chunk(int row, int c) {
    // 8 keys x 4 chunks a phase: rows 2p and 2p + 1 read opposite halves
    return D == 128 ? c ^ ((row & 1) << 2) : c;
}
template <int D>
__device__ __forceinline__ int dts_v_chunk(int row, int c) {
    // ldmatrix: 8 keys at one chunk a phase
    return D == 128 ? c ^ (row & 7) : c ^ ((row >> 1) & 3);
}

template <int D, int G, typename KV>
__device__ __forceinline__ void decode_attn_fp8_impl(
    bf16_t* __restrict__ out, int out_stride, const bf16_t* __restrict__ q, int q_stride,
    const unsigned char* __restrict__ k_cache, const unsigned char* __restrict__ v_cache,
    int kv_stride, const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
    float scale_log2, float v_scale) {
    static_assert(G >= 1 && G <= 8, "the group's heads are rows 0..7 of the MMA tile");
    constexpr int CH = D / 16;             // 16-byte chunks of a key row
    constexpr int RPP = DTC_THREADS / CH;  // rows per pass of the block
    constexpr int NP = DTC_BK / RPP;       // passes per tile
    constexpr int TILE = DTC_BK * D;       // bytes of a K or a V tile
    // [stage][K, V][key][D bytes]; after the last tile, the warps' outputs
    __shared__ __align__(16) unsigned char tiles[2][2][TILE];
    __shared__ float s_m[DTC_WARPS][G], s_l[DTC_WARPS][G];
    static_assert(DTC_WARPS * G * D * sizeof(float) <= sizeof(tiles), "outputs fit in the tiles");

    pdl_wait();
    pdl_trigger_early();
    const int kvh = blockIdx.x, b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int beg = kv_indptr[b];
    const int len = kv_indptr[b + 1] - beg;
    const int h0 = kvh * G;
    const int c = tid % CH;
    const size_t head_off = (size_t)kvh * D + c * 16;
    const float sl2 = scale_log2 * KV::F16_UNIT, vs = v_scale * KV::F16_UNIT;
    bf16_t* orow = out + (size_t)b * out_stride + (size_t)h0 * D;
    if (len <= 0) {
        for (int idx = tid; idx < G * D; idx += DTC_THREADS) orow[idx] = 0;
        pdl_trigger_end();
        return;
    }

    // query fragments (f16) in the K fragments' order of dims; rows G..15 are zero
    unsigned int qf[D / 16][4];
    {
        const bf16_t* qrow = q + (size_t)b * q_stride + (size_t)(h0 + g) * D;
#pragma unroll
        for (int kb = 0; kb < D / 16; ++kb) {
            const int col = (kb >> 2) * 64 + tig * 16 + (kb & 3) * 4;
            const unsigned int lo = g < G ? *(const unsigned int*)(qrow + col) : 0u;
            const unsigned int hi = g < G ? *(const unsigned int*)(qrow + col + 2) : 0u;
            qf[kb][0] = dtc_bf2_to_h2(lo);
            qf[kb][1] = 0u;
            qf[kb][2] = dtc_bf2_to_h2(hi);
            qf[kb][3] = 0u;
        }
    }

    int slot[NP];
    dtc_slots<NP, RPP, CH>(slot, kv_indices, beg, 0, len, tid);
    // Copies the tile whose pool slots `slot` holds into stage `st` (keys past the sequence
    // zero-filled), then reads the slots of the tile DTC_BK keys further.
    auto issue = [&](int kt, int st) {
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            const int r = tid / CH + i * RPP;
            const bool ok = slot[i] >= 0;
            const size_t row = ok ? (size_t)slot[i] * kv_stride + head_off : 0;
            cp_async16(&tiles[st][0][r * D + dts_k_chunk<D>(r, c) * 16], k_cache + row, ok);
            cp_async16(&tiles[st][1][r * D + dts_v_chunk<D>(r, c) * 16], v_cache + row, ok);
        }
        cp_commit();
        dtc_slots<NP, RPP, CH>(slot, kv_indices, beg, kt + DTC_BK, len, tid);
    };

    float o[D / 16][4];  // row g's outputs at dims 16 qb + 4 tig + e
#pragma unroll
    for (int qb = 0; qb < D / 16; ++qb) o[qb][0] = o[qb][1] = o[qb][2] = o[qb][3] = 0.0f;
    float m0 = NEG_INF, l0 = 0.0f;

    issue(0, 0);
    int st = 0;
    for (int kt = 0; kt < len; kt += DTC_BK, st ^= 1) {
        cp_wait<0>();
        // every thread's copies of this tile are in; every warp is done with the other stage
        __syncthreads();
        if (kt + DTC_BK < len) issue(kt + DTC_BK, st ^ 1);
        const unsigned char* tk = tiles[st][0];
        const unsigned char* tv = tiles[st][1];

        // scores of this warp's 16 keys (two n-blocks of 8) against the group's heads
        float s[2][4];
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
            const int key = warp * 16 + nb * 8 + g;
#pragma unroll
            for (int m = 0; m < D / 64; ++m) {
                const uint4 w =
                    *(const uint4*)(tk + key * D + dts_k_chunk<D>(key, m * 4 + tig) * 16);
                const unsigned int ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    unsigned int b0, b1;
                    KV::to_f16x4(ws[e], b0, b1);
                    mma_f16_16816(s[nb], qf[m * 4 + e], b0, b1);
                }
            }
        }
        const float alpha = dtc_softmax(s, kt + warp * 16, len, sl2, m0, l0);
#pragma unroll
        for (int qb = 0; qb < D / 16; ++qb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) o[qb][e] *= alpha;
        }
        // O += P V over the warp's 16 keys: P's accumulator layout is the A fragment
        const unsigned int pa[4] = {dtc_pack_h2(s[0][0], s[0][1]), 0u,
                                    dtc_pack_h2(s[1][0], s[1][1]), 0u};
        // matrices (keys 0-7, dims 16qb..), (keys 8-15, 16qb..), the same for qb + 1
        const int vkey = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
        for (int qb = 0; qb < D / 16; qb += 2) {
            const int chunk = qb + (lane >> 4);
            unsigned int r[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"(smem_addr(tv + vkey * D + dts_v_chunk<D>(vkey, chunk) * 16)));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned int lo = r[2 * h], hi = r[2 * h + 1];
                float* od = o[qb + h];
                float even[4] = {od[0], od[2], 0.0f, 0.0f};
                float odd[4] = {od[1], od[3], 0.0f, 0.0f};
                mma_f16_16816(even, pa, KV::pair_f16(lo, 0, 2), KV::pair_f16(hi, 0, 2));
                mma_f16_16816(odd, pa, KV::pair_f16(lo, 1, 3), KV::pair_f16(hi, 1, 3));
                od[0] = even[0];
                od[1] = odd[0];
                od[2] = even[1];
                od[3] = odd[1];
            }
        }
    }

    // the warps' results, combined in warp order
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    __syncthreads();  // every warp is done with the tiles
    float* s_o = reinterpret_cast<float*>(&tiles[0][0][0]);
    if (g < G) {
#pragma unroll
        for (int qb = 0; qb < D / 16; ++qb)
            *(float4*)&s_o[(warp * G + g) * D + qb * 16 + tig * 4] =
                make_float4(o[qb][0], o[qb][1], o[qb][2], o[qb][3]);
        if (tig == 0) {
            s_m[warp][g] = m0;
            s_l[warp][g] = l0;
        }
    }
    __syncthreads();
    pdl_trigger_end();
    dtc_finish<D, G>(s_o, s_m, s_l, orow, vs);
}

// Kernel names: decode_attn_tc_d<D>_g<G> for a bf16 pool, with _e4m3 / _e5m2 appended for FP8.
#define DECODE_ATTN_TC(IMPL, D, G, SUF, KV)                                                \
    extern "C" __global__ void __launch_bounds__(DTC_THREADS)                              \
        decode_attn_tc_d##D##_g##G##SUF(bf16_t* out, int out_stride, const bf16_t* q,      \
                                        int q_stride, const KV::T* kc, const KV::T* vc,    \
                                        int kv_stride, const int* kv_indptr,               \
                                        const int* kv_indices, float scale_log2,           \
                                        float v_scale) {                                   \
        IMPL<D, G, KV>(out, out_stride, q, q_stride, kc, vc, kv_stride, kv_indptr,         \
                       kv_indices, scale_log2, v_scale);                                   \
    }

#define DECODE_ATTN_TC_ALL(IMPL, SUF, KV)  \
    DECODE_ATTN_TC(IMPL, 64, 1, SUF, KV)   \
    DECODE_ATTN_TC(IMPL, 64, 2, SUF, KV)   \
    DECODE_ATTN_TC(IMPL, 64, 4, SUF, KV)   \
    DECODE_ATTN_TC(IMPL, 64, 8, SUF, KV)   \
    DECODE_ATTN_TC(IMPL, 128, 1, SUF, KV)  \
    DECODE_ATTN_TC(IMPL, 128, 2, SUF, KV)  \
    DECODE_ATTN_TC(IMPL, 128, 4, SUF, KV)  \
    DECODE_ATTN_TC(IMPL, 128, 8, SUF, KV)

DECODE_ATTN_TC_ALL(decode_attn_tc_impl, , KvBf16)
DECODE_ATTN_TC_ALL(decode_attn_fp8_impl, _e4m3, KvE4m3)
DECODE_ATTN_TC_ALL(decode_attn_fp8_impl, _e5m2, KvE5m2)
