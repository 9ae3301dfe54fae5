// Causal prefill attention for a variable-length batch over the paged KV pool, on tensor cores
// (mma.sync m16n8k16 bf16, f32 accumulators), flash-attention style (online softmax, scores
// never leave registers).
//
// A sequence's queries are positions prefix .. prefix + q_len - 1 (a prompt may start after a
// cached prefix); its keys are positions 0 .. prefix + q_len - 1, all read from the pool through
// kv_indices (the new tokens' K/V were written there by rope_kv_store first).
//
// Grid (n_tiles, n_heads); each block takes 64 queries of one head and a run of their keys.
// Work entry i (4 ints, see prefill_tiles / prefill_work on the host) covers sequence
// tiles[4i] from query offset tiles[4i+1]; tiles[4i+2] = split + (nsplit << 16) says which of
// nsplit runs of whole key tiles over the queries' key range the block takes, and tiles[4i+3]
// is the first partial slot of that query tile's splits. Blocks are numbered so that the last
// entries (the host orders them by length) are dispatched first and short ones fill in behind.
//
// Split key ranges (nsplit > 1): a launch with few query tiles is bound by its longest one (a
// 1024-token prompt's last tile reads 16 key tiles in a row while the GPU has room for more
// blocks), so the host may cut the longest tiles' key ranges into runs of whole tiles. Each
// such block writes its unnormalised output and each row's (max, sum) in the log2 domain to
// its partial slot; the last of a query tile's splits to finish (an arrival counter per slot
// group and head, left at zero) merges them in split order, so the result never depends on
// timing. Partial slot p of head h holds rows ((p * n_heads + h) * 64 + r) of part_o (D
// floats each) and part_ml (2 floats each).
// 4 warps, 16 query rows each. K/V tiles of 64 keys in shared memory (rows padded by 8
// elements: fragment loads free of bank conflicts), fetched with cp.async: the V tile loads
// while the scores of its K tile are computed, the next K tile while P V is, and the next
// tile's pool indices are read a step ahead.
//
// Paired heads (the _h2 entries, FP8 pools): a block of 8 warps takes the same 64 queries of
// two query heads of one KV group (warps 0-3 head 2 blockIdx.y, warps 4-7 the next), so each
// K/V tile is fetched and widened to bf16 once for both; grid (n_tiles, n_heads / 2). Every
// row's arithmetic is the single head's, so the output is the same bits. The host uses it only
// for work lists without splits and groups of an even number of heads.
//
// KV scales (an FP8 pool: kv.cuh): keys and values are used as stored; the layer's K scale is
// folded into scale_log2 by the host and its V scale into the final normalisation
// (o * v_scale / l); a bf16 pool gets v_scale = 1.

#define PF_BQ 64
#define PF_BK 64
#define PF_THREADS 128
// Most splits of one query tile's keys (PREFILL_MAX_SPLITS on the host).
#define PF_MAX_SPLITS 16

// Pool slots of this thread's rows (tid / CH + i * RPP) of the key tile starting at kt; -1
// past the tile's end.
template <int NP, int RPP, int CH>
__device__ __forceinline__ void pf_slots(int (&slot)[NP], const int* __restrict__ kv_indices,
                                         int kvbeg, int kt, int kv_end, int tid) {
#pragma unroll
    for (int i = 0; i < NP; ++i) {
        const int r = tid / CH + i * RPP;
        slot[i] = kt + r < kv_end ? kv_indices[kvbeg + kt + r] : -1;
    }
}

// Fetch one K or V tile (rows of `slot`) for `dst`. From a bf16 pool: cp.async straight into
// `dst`. From an FP8 pool (kv.cuh): each thread's 8 bytes per row into `raw`, registers, so the
// loads overlap the work until pf_land widens them to bf16 (exact) and stores them into `dst`
// (where the bf16 form waits for its cp.async group); a __syncthreads after either makes the
// tile visible.
template <typename KV, int NP, int RPP, int CH, int LD>
__device__ __forceinline__ void pf_fetch(bf16_t* dst, const typename KV::T* cache,
                                         const int (&slot)[NP], int kv_stride, size_t head_off,
                                         int tid, typename KV::Raw8 (&raw)[NP]) {
    const int c = tid % CH;
#pragma unroll
    for (int i = 0; i < NP; ++i) {
        if constexpr (sizeof(typename KV::T) == 2) {
            const int r = tid / CH + i * RPP;
            const bf16_t* src =
                slot[i] >= 0 ? cache + (size_t)slot[i] * kv_stride + head_off + c * 8 : cache;
            cp_async16(dst + r * LD + c * 8, src, slot[i] >= 0);
        } else {
            raw[i] = slot[i] >= 0
                         ? KV::load8(cache + (size_t)slot[i] * kv_stride + head_off + c * 8)
                         : KV::zero8();
        }
    }
}

template <typename KV, int NP, int RPP, int CH, int LD>
__device__ __forceinline__ void pf_land(bf16_t* dst, const typename KV::Raw8 (&raw)[NP],
                                        int tid) {
    if constexpr (sizeof(typename KV::T) != 2) {
        const int c = tid % CH;
#pragma unroll
        for (int i = 0; i < NP; ++i) {
            *(uint4*)(dst + (tid / CH + i * RPP) * LD + c * 8) = KV::to_bf16x8(raw[i]);
        }
    }
}

// A tile's scores scaled into the log2 domain, with MASK those of keys past kv_end or after
// the row's query position at -inf, and each row's largest (rows g and g + 8 of the warp).
template <bool MASK>
__device__ __forceinline__ void pf_scale_mask(float (&s)[PF_BK / 8][4], int kt, int tig,
                                              int kv_end, int qpos0, int qpos1, float scale_log2,
                                              float& mx0, float& mx1) {
#pragma unroll
    for (int nb = 0; nb < PF_BK / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = kt + nb * 8 + tig * 2 + (e & 1);
            const int qp = e < 2 ? qpos0 : qpos1;
            const float v =
                (!MASK || (key < kv_end && key <= qp)) ? s[nb][e] * scale_log2 : NEG_INF;
            s[nb][e] = v;
            if (e < 2) mx0 = fmaxf(mx0, v);
            else mx1 = fmaxf(mx1, v);
        }
    }
}

// A split block's end (see the top): its unnormalised rows and their (max, sum) to its partial
// slot; the last of the query tile's nsplit blocks to arrive merges every split's rows in split
// order and writes the output rows (the first `rows` of the tile; row 0 is token `row0` of the
// batch). `s_w`: shared memory for PF_MAX_SPLITS + 1 floats per row.
template <int D>
__device__ __forceinline__ void pf_split_out(bf16_t* __restrict__ out, int out_stride,
                                             const float (&o)[D / 8][4], float m0, float m1,
                                             float l0, float l1, float* __restrict__ part_o,
                                             float* __restrict__ part_ml,
                                             unsigned int* __restrict__ counters, int part0,
                                             int split, int nsplit, int h, int row0, int rows,
                                             float v_scale, float* s_w, int& s_last) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int n_heads = gridDim.y;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    {
        const size_t base = ((size_t)(part0 + split) * n_heads + h) * PF_BQ;
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb) {
            const int d = nb * 8 + tig * 2;
            *(float2*)(part_o + (base + r0) * D + d) = make_float2(o[nb][0], o[nb][1]);
            *(float2*)(part_o + (base + r1) * D + d) = make_float2(o[nb][2], o[nb][3]);
        }
        if (tig == 0) {
            *(float2*)(part_ml + (base + r0) * 2) = make_float2(m0, l0);
            *(float2*)(part_ml + (base + r1) * 2) = make_float2(m1, l1);
        }
    }
    __threadfence();
    __syncthreads();
    unsigned int* counter = counters + (size_t)part0 * n_heads + h;
    if (tid == 0) s_last = atomicAdd(counter, 1u) == (unsigned int)(nsplit - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (tid == 0) *counter = 0u;  // ready for the next launch
    // per row: each split's weight exp2(m_s - m) and v_scale / l
    const size_t head0 = (size_t)part0 * n_heads + h;  // slot s of this head: head0 + s * n_heads
    if (tid < PF_BQ) {
        float ms[PF_MAX_SPLITS], ls[PF_MAX_SPLITS];
        float m = NEG_INF;
#pragma unroll
        for (int s = 0; s < PF_MAX_SPLITS; ++s) {
            if (s < nsplit) {
                const float* ml = part_ml + ((head0 + (size_t)s * n_heads) * PF_BQ + tid) * 2;
                ms[s] = ld_cg_f32(ml);
                ls[s] = ld_cg_f32(ml + 1);
                m = fmaxf(m, ms[s]);
            }
        }
        float l = 0.0f;
#pragma unroll
        for (int s = 0; s < PF_MAX_SPLITS; ++s) {
            if (s < nsplit) {
                const float w = ms[s] == NEG_INF ? 0.0f : exp2f(ms[s] - m);
                s_w[s * PF_BQ + tid] = w;
                l += ls[s] * w;
            }
        }
        s_w[PF_MAX_SPLITS * PF_BQ + tid] = l > 0.0f ? v_scale / l : 0.0f;
    }
    __syncthreads();
    // 8 dims of 8 rows a thread: rows tid / CHR + 8 i, dims (tid % CHR) * 8
    constexpr int CHR = D / 8;          // 8-dim chunks per row
    constexpr int RS = PF_THREADS / CHR;  // rows a pass
    const int c = tid % CHR;
    float acc[PF_BQ / RS][8];
#pragma unroll
    for (int i = 0; i < PF_BQ / RS; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    for (int s = 0; s < nsplit; ++s) {
        const float* ps = part_o + (head0 + (size_t)s * n_heads) * PF_BQ * D;
        float4 a[PF_BQ / RS][2];
#pragma unroll
        for (int i = 0; i < PF_BQ / RS; ++i) {
            const float* p = ps + (size_t)(tid / CHR + RS * i) * D + c * 8;
            a[i][0] = ld_cg_f32x4(p);
            a[i][1] = ld_cg_f32x4(p + 4);
        }
#pragma unroll
        for (int i = 0; i < PF_BQ / RS; ++i) {
            const float w = s_w[s * PF_BQ + tid / CHR + RS * i];
            acc[i][0] += a[i][0].x * w;
            acc[i][1] += a[i][0].y * w;
            acc[i][2] += a[i][0].z * w;
            acc[i][3] += a[i][0].w * w;
            acc[i][4] += a[i][1].x * w;
            acc[i][5] += a[i][1].y * w;
            acc[i][6] += a[i][1].z * w;
            acc[i][7] += a[i][1].w * w;
        }
    }
#pragma unroll
    for (int i = 0; i < PF_BQ / RS; ++i) {
        const int r = tid / CHR + RS * i;
        if (r < rows) {
            const float inv = s_w[PF_MAX_SPLITS * PF_BQ + r];
            uint4 v;
            v.x = pack_bf2(acc[i][0] * inv, acc[i][1] * inv);
            v.y = pack_bf2(acc[i][2] * inv, acc[i][3] * inv);
            v.z = pack_bf2(acc[i][4] * inv, acc[i][5] * inv);
            v.w = pack_bf2(acc[i][6] * inv, acc[i][7] * inv);
            *(uint4*)(out + (size_t)(row0 + r) * out_stride + h * D + c * 8) = v;
        }
    }
}

template <int D, typename KV, int HPB>
__device__ __forceinline__ void prefill_attn_impl(
    bf16_t* __restrict__ out, int out_stride, const bf16_t* __restrict__ qkv, int q_stride,
    const typename KV::T* __restrict__ k_cache, const typename KV::T* __restrict__ v_cache,
    int kv_stride,
    const int* __restrict__ tiles, const int* __restrict__ q_indptr,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
    const int* __restrict__ prefix_lens, int group, float scale_log2, float v_scale,
    float* __restrict__ part_o, float* __restrict__ part_ml, unsigned int* __restrict__ counters) {
    constexpr int LD = D + 8;
    constexpr int CH = D / 8;               // 16-byte chunks per row
    constexpr int THREADS = PF_THREADS * HPB;
    constexpr int RPP = THREADS / CH;       // rows per pass of the block
    constexpr int NP = PF_BK / RPP;         // passes per tile
    __shared__ __align__(16) bf16_t sK[PF_BK * LD];
    __shared__ __align__(16) bf16_t sV[PF_BK * LD];
    __shared__ int s_last;

    pdl_wait();
    pdl_trigger_early();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    // heads vary fastest in dispatch order, tiles from the last
    const int lin = blockIdx.y * gridDim.x + blockIdx.x;
    const int tile = gridDim.x - 1 - lin / gridDim.y;
    const int wr = warp & 3;  // the warp's 16 rows of the tile
    const int h = (lin % gridDim.y) * HPB + (warp >> 2), kvh = h / group;
    const int seq = tiles[4 * tile], qoff = tiles[4 * tile + 1];
    const int split = tiles[4 * tile + 2] & 0xffff, nsplit = tiles[4 * tile + 2] >> 16;
    const int part0 = tiles[4 * tile + 3];
    const int qbeg = q_indptr[seq], qlen = q_indptr[seq + 1] - qbeg;
    const int prefix = prefix_lens[seq];
    const int kvbeg = kv_indptr[seq];
    const int kvlen = kv_indptr[seq + 1] - kvbeg;
    const int kv_end = min(kvlen, prefix + qoff + PF_BQ);
    // this block's keys: the split-th of nsplit runs of whole key tiles over [0, kv_end)
    const int n_kt = (kv_end + PF_BK - 1) / PF_BK;
    const int per = (n_kt + nsplit - 1) / nsplit;
    const int kv_lo = min(split * per, n_kt) * PF_BK;
    const int kv_hi = min(kv_end, (split + 1) * per * PF_BK);
    const size_t head_off = (size_t)kvh * D;

    // the first K tile loads while Q is staged through sV into registers (A fragments)
    int slot[NP], slot_next[NP];
    typename KV::Raw8 raw_k[NP], raw_v[NP];  // an FP8 pool's bytes on their way (pf_fetch)
    pf_slots<NP, RPP, CH>(slot, kv_indices, kvbeg, kv_lo, kv_end, tid);
    pf_fetch<KV, NP, RPP, CH, LD>(sK, k_cache, slot, kv_stride, head_off, tid, raw_k);
    cp_commit();
    // Q (each head of the block in turn) staged through sV into registers (A fragments)
    unsigned int qf[D / 16][4];
    for (int hh = 0; hh < HPB; ++hh) {
        const int hq = (lin % gridDim.y) * HPB + hh;
        for (int idx = tid; idx < PF_BQ * CH; idx += THREADS) {
            const int r = idx / CH, c = idx % CH;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (qoff + r < qlen) {
                v = *(const uint4*)(qkv + (size_t)(qbeg + qoff + r) * q_stride + hq * D + c * 8);
            }
            *(uint4*)(sV + r * LD + c * 8) = v;
        }
        __syncthreads();
        if ((warp >> 2) == hh) {
            const int r = wr * 16 + g;
#pragma unroll
            for (int kb = 0; kb < D / 16; ++kb) {
                const int c = kb * 16 + tig * 2;
                qf[kb][0] = *(const unsigned int*)(sV + r * LD + c);
                qf[kb][1] = *(const unsigned int*)(sV + (r + 8) * LD + c);
                qf[kb][2] = *(const unsigned int*)(sV + r * LD + c + 8);
                qf[kb][3] = *(const unsigned int*)(sV + (r + 8) * LD + c + 8);
            }
        }
        __syncthreads();
    }

    const int qpos0 = prefix + qoff + wr * 16 + g;
    const int qpos1 = qpos0 + 8;
    float o[D / 8][4];
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    for (int kt = kv_lo; kt < kv_hi; kt += PF_BK) {
        const bool more = kt + PF_BK < kv_hi;
        if (more) pf_slots<NP, RPP, CH>(slot_next, kv_indices, kvbeg, kt + PF_BK, kv_end, tid);
        pf_land<KV, NP, RPP, CH, LD>(sK, raw_k, tid);  // sK is free since the last scores
        pf_fetch<KV, NP, RPP, CH, LD>(sV, v_cache, slot, kv_stride, head_off, tid, raw_v);
        cp_commit();
        cp_wait<1>();  // this tile's K
        __syncthreads();

        float s[PF_BK / 8][4];
#pragma unroll
        for (int nb = 0; nb < PF_BK / 8; ++nb) {
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
            // B fragments of two 16-dim steps per ldmatrix: matrices (keys nb*8.., dims
            // kb*16 + 0/8) and (.., (kb + 1)*16 + 0/8)
            const int mi = lane >> 3;
            const bf16_t* krow = sK + (nb * 8 + (lane & 7)) * LD + (mi >> 1) * 16 + (mi & 1) * 8;
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
        // mask, scale (log2 domain), running max; a tile whose every key is in range and at
        // or before the block's first query needs no mask
        float mx0 = NEG_INF, mx1 = NEG_INF;
        if (kt + PF_BK <= kv_end && kt + PF_BK - 1 <= prefix + qoff) {
            pf_scale_mask<false>(s, kt, tig, kv_end, qpos0, qpos1, scale_log2, mx0, mx1);
        } else {
            pf_scale_mask<true>(s, kt, tig, kv_end, qpos0, qpos1, scale_log2, mx0, mx1);
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        // A row with every key masked so far keeps m = -inf; guard the subtraction.
        const float base0 = mn0 == NEG_INF ? 0.0f : mn0;
        const float base1 = mn1 == NEG_INF ? 0.0f : mn1;
        const float a0 = exp2f(m0 - base0), a1 = exp2f(m1 - base1);
        m0 = mn0;
        m1 = mn1;
        float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
        for (int nb = 0; nb < PF_BK / 8; ++nb) {
            s[nb][0] = exp2f(s[nb][0] - base0);
            s[nb][1] = exp2f(s[nb][1] - base0);
            s[nb][2] = exp2f(s[nb][2] - base1);
            s[nb][3] = exp2f(s[nb][3] - base1);
            rs0 += s[nb][0] + s[nb][1];
            rs1 += s[nb][2] + s[nb][3];
        }
        l0 = l0 * a0 + rs0;
        l1 = l1 * a1 + rs1;
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb) {
            o[nb][0] *= a0;
            o[nb][1] *= a0;
            o[nb][2] *= a1;
            o[nb][3] *= a1;
        }
        pf_land<KV, NP, RPP, CH, LD>(sV, raw_v, tid);  // sV is free since the last P V
        cp_wait<0>();  // this tile's V
        __syncthreads();  // every warp is done with sK
        if (more) {
            pf_fetch<KV, NP, RPP, CH, LD>(sK, k_cache, slot_next, kv_stride, head_off, tid, raw_k);
            cp_commit();
        }
        // O += P V; P's accumulator layout is reused as the A fragment.
#pragma unroll
        for (int kb = 0; kb < PF_BK / 16; ++kb) {
            unsigned int pa[4];
            pa[0] = pack_bf2(s[2 * kb][0], s[2 * kb][1]);
            pa[1] = pack_bf2(s[2 * kb][2], s[2 * kb][3]);
            pa[2] = pack_bf2(s[2 * kb + 1][0], s[2 * kb + 1][1]);
            pa[3] = pack_bf2(s[2 * kb + 1][2], s[2 * kb + 1][3]);
            const int key = kb * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
            for (int nb = 0; nb < D / 8; nb += 2) {
                const int dim = nb * 8 + (lane >> 4) * 8;
                unsigned int r0, r1, r2, r3;
                asm volatile(
                    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                    : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                    : "r"(smem_addr(sV + key * LD + dim)));
                mma_bf16_16816(o[nb], pa, r0, r1);
                mma_bf16_16816(o[nb + 1], pa, r2, r3);
            }
        }
        __syncthreads();  // every warp is done with sV
#pragma unroll
        for (int i = 0; i < NP; ++i) slot[i] = slot_next[i];
    }

    cp_wait<0>();  // an empty split's first fetch
    pdl_trigger_end();
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (HPB == 1 && nsplit > 1) {
        pf_split_out<D>(out, out_stride, o, m0, m1, l0, l1, part_o, part_ml, counters, part0,
                        split, nsplit, h, qbeg + qoff, qlen - qoff, v_scale, (float*)sK, s_last);
        return;
    }
    const float inv0 = l0 > 0.0f ? v_scale / l0 : 0.0f;
    const float inv1 = l1 > 0.0f ? v_scale / l1 : 0.0f;
    const int r0 = qoff + wr * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
        const int col = h * D + nb * 8 + tig * 2;
        if (r0 < qlen) {
            *(unsigned int*)(out + (size_t)(qbeg + r0) * out_stride + col) =
                pack_bf2(o[nb][0] * inv0, o[nb][1] * inv0);
        }
        if (r1 < qlen) {
            *(unsigned int*)(out + (size_t)(qbeg + r1) * out_stride + col) =
                pack_bf2(o[nb][2] * inv1, o[nb][3] * inv1);
        }
    }
}

// Kernel names: prefill_attn_d<D> for a bf16 pool, with _e4m3 / _e5m2 appended for FP8.
#define PREFILL_ATTN(D, SUF, KV)                                                               \
    extern "C" __global__ void __launch_bounds__(PF_THREADS) prefill_attn_d##D##SUF(           \
        bf16_t* out, int out_stride, const bf16_t* qkv, int q_stride, const KV::T* kc,         \
        const KV::T* vc, int kv_stride, const int* tiles, const int* q_indptr,                 \
        const int* kv_indptr, const int* kv_indices, const int* prefix_lens, int group,        \
        float scale_log2, float v_scale, float* part_o, float* part_ml,                        \
        unsigned int* counters) {                                                              \
        prefill_attn_impl<D, KV, 1>(out, out_stride, qkv, q_stride, kc, vc, kv_stride, tiles,     \
                                 q_indptr, kv_indptr, kv_indices, prefix_lens, group,          \
                                 scale_log2, v_scale, part_o, part_ml, counters);              \
    }

// Paired heads (see the top): prefill_attn_d<D>_<fp8>_h2, grid (n_tiles, n_heads / 2).
#define PREFILL_ATTN_H2(D, SUF, KV)                                                            \
    extern "C" __global__ void __launch_bounds__(2 * PF_THREADS)                               \
        prefill_attn_d##D##SUF##_h2(                                                           \
            bf16_t* out, int out_stride, const bf16_t* qkv, int q_stride, const KV::T* kc,     \
            const KV::T* vc, int kv_stride, const int* tiles, const int* q_indptr,             \
            const int* kv_indptr, const int* kv_indices, const int* prefix_lens, int group,    \
            float scale_log2, float v_scale, float* part_o, float* part_ml,                    \
            unsigned int* counters) {                                                          \
        prefill_attn_impl<D, KV, 2>(out, out_stride, qkv, q_stride, kc, vc, kv_stride, tiles, \
                                    q_indptr, kv_indptr, kv_indices, prefix_lens, group,       \
                                    scale_log2, v_scale, part_o, part_ml, counters);           \
    }

PREFILL_ATTN(64, , KvBf16)
PREFILL_ATTN(128, , KvBf16)
PREFILL_ATTN(64, _e4m3, KvE4m3)
PREFILL_ATTN(128, _e4m3, KvE4m3)
PREFILL_ATTN(64, _e5m2, KvE5m2)
PREFILL_ATTN(128, _e5m2, KvE5m2)
PREFILL_ATTN_H2(64, _e4m3, KvE4m3)
PREFILL_ATTN_H2(128, _e4m3, KvE4m3)
PREFILL_ATTN_H2(64, _e5m2, KvE5m2)
PREFILL_ATTN_H2(128, _e5m2, KvE5m2)
