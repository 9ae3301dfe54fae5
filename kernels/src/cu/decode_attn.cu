// Decode attention over the paged KV pool (page size 1), one query token per sequence.
//
// Grid (batch, kv_heads, splits). Each block takes one KV head with its GQA group of G query
// heads (so K/V rows are read once for the group) and one contiguous split of the sequence;
// it writes unnormalised partial outputs plus (max, sum) in the log2 domain. The split size is
// derived from each sequence's own length on the device (at least one tile of keys, so a short
// sequence occupies only the first splits of the grid), so one launch shape (and one captured
// graph) serves any lengths. A block issues every key and value load of a tile before it uses
// any: at decode sizes the kernel is bound by memory latency, not bandwidth.
//
// Three forms share the code:
// - decode_attn_d*_g*: partials only; `attn_merge_splits` (a second launch) combines them.
// - decode_attn_merged_d*_g*: the last split block of each (sequence, KV head) to finish (an
//   arrival counter, as in the split-k GEMV) merges the group's splits itself, in split order
//   and with attn_merge_splits' arithmetic, so the result never depends on timing and equals
//   the two-launch form bit for bit (a sequence with one active split writes its output
//   directly, as the merge of one split would). Counters start at zero and are left at zero.
// - decode_attn_rope_d*_g*: the merged form reading the raw fused qkv row of a decode pass
//   (every sequence one new token, q and k not yet rotated). Each block rotates its group's
//   query heads; the block whose split holds the sequence's last position (the new token)
//   rotates k, writes k and v to the pool at that position's slot (kv_indices'
//   last entry of the sequence) and uses them directly. RoPE and rounding as
//   rope_kv_store_bf16, so the result (and the pool) equal rope_kv_store + decode_attn.
//
// KV scales (an FP8 pool: kv.cuh): keys and values are used as stored; the layer's K scale is
// folded into scale_log2 by the host and its V scale multiplies the unnormalised output o as a
// block writes it (its partial, or its output o * v_scale / l when it is the only split), so
// the merges (which only weight and sum partials) need none. The rope form stores the new
// token's k * k_inv and v * v_inv. A bf16 pool gets v_scale = k_inv = v_inv = 1.
//
// Layouts: q row of sequence b at q + b * q_stride, head h at + h * D (for the rope form the
// qkv row [q heads | k heads | v heads]); K/V pool rows of kv_stride elements (kv_heads * D)
// per slot; partial_o [B, H, S, D], partial_ml [B, H, S, 2]; counters [B, kv_heads].

#define DEC_THREADS 128
// Most splits a launch may have (MAX_DECODE_SPLITS on the host).
#define DEC_MAX_SPLITS 32

// Decode attention forms (see above).
#define DEC_PARTIALS 0
#define DEC_MERGED 1
#define DEC_ROPE 2

// Merge of one output element of attn_merge_splits: head row `base` (= (b * n_heads + h) *
// nsplit) of the partials, dim d, with m the largest max of the non-empty splits. The merged
// forms' in-kernel merge (dec_merge_block) does the same arithmetic in the same order, so both
// round alike.
__device__ __forceinline__ float dec_merge_max(const float* __restrict__ partial_ml, size_t base,
                                               int nsplit) {
    float m = NEG_INF;
    for (int s = 0; s < nsplit; ++s) {
        if (partial_ml[(base + s) * 2 + 1] > 0.0f) m = fmaxf(m, partial_ml[(base + s) * 2]);
    }
    return m;
}

__device__ __forceinline__ bf16_t dec_merge_one(const float* __restrict__ partial_o,
                                                const float* __restrict__ partial_ml,
                                                size_t base, int nsplit, int head_dim, int d,
                                                float m) {
    float l = 0.0f, o = 0.0f;
    for (int s = 0; s < nsplit; ++s) {
        const float ls = partial_ml[(base + s) * 2 + 1];
        if (ls > 0.0f) {
            const float w = exp2f(partial_ml[(base + s) * 2] - m);
            l += ls * w;
            o += partial_o[(base + s) * head_dim + d] * w;
        }
    }
    return f2bf(l > 0.0f ? o / l : 0.0f);
}

// Llama rotate-half RoPE of the pair (x1 = x[i], x2 = x[i + D/2]) by the angle whose cosine
// and sine (rounded to bf16) are c and s, rounded as rope_kv_store_bf16 rounds it.
__device__ __forceinline__ void dec_rope_pair(float c, float s, float x1, float x2, bf16_t& o1,
                                              bf16_t& o2) {
    o1 = f2bf(rbf(x1 * c) + rbf(-x2 * s));
    o2 = f2bf(rbf(x2 * c) + rbf(x1 * s));
}

// Key/value rows of one tile: this thread's 8 dims (`head_off`) of keys t0 + i * KPP + kk.
// Every load of the tile is issued before any is used, so a block waits for memory once per
// tile rather than once per key step. KV: the pool's element type (kv.cuh).
template <typename KV, int KPT, int KPP>
__device__ __forceinline__ void dec_load_tile(const typename KV::T* k_cache,
                                              const typename KV::T* v_cache,
                                              const int* __restrict__ kv_indices, int beg,
                                              int t0, int k1, int kk, size_t head_off,
                                              int kv_stride, typename KV::Raw8 (&kr)[KPT],
                                              typename KV::Raw8 (&vr)[KPT]) {
    int slot[KPT];
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
        const int t = t0 + i * KPP + kk;
        slot[i] = t < k1 ? kv_indices[beg + t] : -1;
    }
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
        if (slot[i] >= 0) {
            const size_t row = (size_t)slot[i] * kv_stride + head_off;
            kr[i] = KV::load8(k_cache + row);
            vr[i] = KV::load8(v_cache + row);
        } else {
            kr[i] = KV::zero8();
            vr[i] = KV::zero8();
        }
    }
}

// Keys per thread and tile: fewer for wide groups, whose query and accumulator registers grow.
template <int G>
struct DecTile {
    static constexpr int KPT = G >= 8 ? 4 : 8;
};

template <int D, int G, int MODE, typename KV>
__device__ __forceinline__ void decode_attn_impl(
    bf16_t* __restrict__ out, int out_stride, float* __restrict__ partial_o,
    float* __restrict__ partial_ml, unsigned int* __restrict__ counters,
    const bf16_t* __restrict__ q, int q_stride, const typename KV::T* k_cache,
    const typename KV::T* v_cache, typename KV::T* k_store, typename KV::T* v_store, int kv_stride, const int* __restrict__ kv_indptr,
    const int* __restrict__ kv_indices, const int* __restrict__ positions,
    const float* __restrict__ inv_freq, int n_heads, float scale_log2, float v_scale,
    float k_inv, float v_inv) {
    constexpr int LPK = D / 8;              // lanes per key (8 dims each)
    constexpr int KPP = DEC_THREADS / LPK;  // keys per pass of the block
    constexpr int KPT = DecTile<G>::KPT;    // keys per thread and tile
    constexpr int TILE = KPP * KPT;
    constexpr int NW = DEC_THREADS / 32;
    constexpr int ROPE_D = MODE == DEC_ROPE ? D : 1;

    __shared__ float s_q[MODE == DEC_ROPE ? G : 1][ROPE_D];
    __shared__ float s_knew[ROPE_D], s_vnew[ROPE_D];
    __shared__ float s_wm[NW][G], s_wl[NW][G];
    __shared__ float s_wacc[NW][G][D];
    __shared__ float s_sm[MODE == DEC_PARTIALS ? 1 : G][DEC_MAX_SPLITS];
    __shared__ float s_sl[MODE == DEC_PARTIALS ? 1 : G][DEC_MAX_SPLITS];
    __shared__ int s_last;

    if constexpr (MODE != DEC_ROPE) {
        pdl_wait();
        pdl_trigger_early();
    }
    const int b = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, nsplit = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int sub = tid % LPK, kk = tid / LPK;
    const int beg = kv_indptr[b];
    const int len = kv_indptr[b + 1] - beg;
    // Splits of at least one tile: a short sequence uses the first few splits of the grid and
    // the rest exit at once (the merge reads only the active ones).
    const int per = max((len + nsplit - 1) / nsplit, TILE);
    const int active = (len + per - 1) / per;
    const int k0 = split * per;
    const int k1 = min(len, k0 + per);
    const int h0 = kvh * G;
    // rope form: the new token's position in the sequence (its last); -1 where none
    const int last = MODE == DEC_ROPE ? len - 1 : -1;
    const size_t head_off = (size_t)kvh * D + sub * 8;
    typename KV::Raw8 kr[KPT], vr[KPT];
    // rope form: the split holding the new token, its pool row, and this thread's rotation
    // angle (every pair a thread rotates below has the same i = tid % (D / 2))
    const bool has_new = MODE == DEC_ROPE && k0 <= last && last < k1;
    size_t kv_row = 0;
    float rot_c = 0.0f, rot_s = 0.0f;
    if constexpr (MODE == DEC_ROPE) {
        // Of the rope form's inputs only the qkv row comes from the kernel before it (the qkv
        // GEMV); the indices, positions and the pool's cached keys and values were written
        // before that kernel started (this pass writes only the new token's slot, here). So the
        // first tile is fetched before the wait and its latency hides behind that kernel's
        // tail; the new token's slot read with it is never used (s_knew / s_vnew below).
        // The angle and the new token's slot come from the positions and indices too, so they
        // are ready before the wait as well.
        if (k0 < k1) {
            dec_load_tile<KV, KPT, KPP>(k_cache, v_cache, kv_indices, beg, k0, k1, kk, head_off,
                                        kv_stride, kr, vr);
            if (has_new) kv_row = (size_t)kv_indices[beg + last] * kv_stride + (size_t)kvh * D;
            sincosf((float)positions[b] * inv_freq[tid % (D / 2)], &rot_s, &rot_c);
            rot_c = rbf(rot_c);
            rot_s = rbf(rot_s);
        }
        pdl_wait();
        pdl_trigger_early();
    }

    if (k0 >= k1) {  // no keys: a split past the active ones, or an empty sequence
        if (MODE == DEC_PARTIALS) {
            for (int g = tid; g < G; g += DEC_THREADS) {
                float* ml = partial_ml + ((size_t)(b * n_heads + h0 + g) * nsplit + split) * 2;
                ml[0] = NEG_INF;
                ml[1] = 0.0f;
            }
        } else if (len == 0 && split == 0) {
            for (int idx = tid; idx < G * D; idx += DEC_THREADS) {
                out[(size_t)b * out_stride + h0 * D + idx] = 0;
            }
        }
        pdl_trigger_end();
        return;
    }

    if constexpr (MODE != DEC_ROPE) {
        dec_load_tile<KV, KPT, KPP>(k_cache, v_cache, kv_indices, beg, k0, k1, kk, head_off,
                                    kv_stride, kr, vr);
    }

    // q dims of this thread, for every head of the group
    float qr[G][8];
    if constexpr (MODE == DEC_ROPE) {
        // rotate the group's query heads (and, in the split holding the new token, its k) as
        // rope_kv_store_bf16 does; v is copied as is. Every value this thread needs from the
        // qkv row is loaded before any is used: one trip to memory after the wait.
        constexpr int HALF = D / 2;
        static_assert(DEC_THREADS % HALF == 0, "a thread's pairs share one angle");
        constexpr int ROT = ((G + 1) * HALF + DEC_THREADS - 1) / DEC_THREADS;  // pairs a thread
        constexpr int VPT = (D + DEC_THREADS - 1) / DEC_THREADS;                // v values a thread
        const bf16_t* row = q + (size_t)b * q_stride;
        const int n_rot = (G + (has_new ? 1 : 0)) * HALF;
        const int i = tid % HALF;
        bf16_t x1[ROT], x2[ROT], vx[VPT];
#pragma unroll
        for (int r = 0; r < ROT; ++r) {
            const int idx = tid + r * DEC_THREADS, g = idx / HALF;
            const int col = g < G ? (h0 + g) * D : (n_heads + kvh) * D;
            if (idx < n_rot) {
                x1[r] = row[col + i];
                x2[r] = row[col + i + HALF];
            }
        }
        const bf16_t* v = row + (size_t)(n_heads + gridDim.y + kvh) * D;
#pragma unroll
        for (int r = 0; r < VPT; ++r) {
            if (has_new && tid + r * DEC_THREADS < D) vx[r] = v[tid + r * DEC_THREADS];
        }
#pragma unroll
        for (int r = 0; r < ROT; ++r) {
            const int idx = tid + r * DEC_THREADS, g = idx / HALF;
            if (idx >= n_rot) break;
            bf16_t o1, o2;
            dec_rope_pair(rot_c, rot_s, bf2f(x1[r]), bf2f(x2[r]), o1, o2);
            if (g < G) {
                s_q[g][i] = bf2f(o1);
                s_q[g][i + HALF] = bf2f(o2);
            } else {
                // the pool's rounding, and attention uses the value as stored
                const typename KV::T e1 = KV::enc(o1, k_inv), e2 = KV::enc(o2, k_inv);
                k_store[kv_row + i] = e1;
                k_store[kv_row + i + HALF] = e2;
                s_knew[i] = KV::dec(e1);
                s_knew[i + HALF] = KV::dec(e2);
            }
        }
        if (has_new) {
#pragma unroll
            for (int r = 0; r < VPT; ++r) {
                const int d = tid + r * DEC_THREADS;
                if (d < D) {
                    const typename KV::T e = KV::enc(vx[r], v_inv);
                    v_store[kv_row + d] = e;
                    s_vnew[d] = KV::dec(e);
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) qr[g][i] = s_q[g][sub * 8 + i];
    } else {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            unpack8(*(const uint4*)(q + (size_t)b * q_stride + (h0 + g) * D + sub * 8), qr[g]);
        }
    }

    // Each thread keeps an online softmax over its own keys (the same for the LPK lanes of a
    // key, which hold different dims); the block combines them at the end.
    float m_run[G], l_run[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m_run[g] = NEG_INF;
        l_run[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
    }
    for (int t0 = k0; t0 < k1; t0 += TILE) {
        if (t0 != k0) {
            dec_load_tile<KV, KPT, KPP>(k_cache, v_cache, kv_indices, beg, t0, k1, kk, head_off,
                                    kv_stride, kr, vr);
        }
        float p[KPT][G];  // scores, then weights
#pragma unroll
        for (int i = 0; i < KPT; ++i) {
            const int t = t0 + i * KPP + kk;
            float kf[8];
            if (MODE == DEC_ROPE && t == last) {  // the new token's k, rotated above
#pragma unroll
                for (int j = 0; j < 8; ++j) kf[j] = s_knew[(sub * 8 + j) % ROPE_D];
            } else {
                KV::unpack(kr[i], kf);
            }
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float d = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) d += qr[g][j] * kf[j];
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                p[i][g] = t < k1 ? d * scale_log2 : NEG_INF;
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mx = NEG_INF;
#pragma unroll
            for (int i = 0; i < KPT; ++i) mx = fmaxf(mx, p[i][g]);
            if (mx == NEG_INF) {  // none of this thread's keys in the tile
#pragma unroll
                for (int i = 0; i < KPT; ++i) p[i][g] = 0.0f;
                continue;
            }
            const float m_new = fmaxf(m_run[g], mx);
            const float alpha = exp2f(m_run[g] - m_new);
            m_run[g] = m_new;
            l_run[g] *= alpha;
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[g][j] *= alpha;
#pragma unroll
            for (int i = 0; i < KPT; ++i) {
                p[i][g] = exp2f(p[i][g] - m_new);
                l_run[g] += p[i][g];
            }
        }
#pragma unroll
        for (int i = 0; i < KPT; ++i) {
            const int t = t0 + i * KPP + kk;
            float vf[8];
            if (MODE == DEC_ROPE && t == last) {
#pragma unroll
                for (int j = 0; j < 8; ++j) vf[j] = s_vnew[(sub * 8 + j) % ROPE_D];
            } else {
                KV::unpack(vr[i], vf);
            }
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[g][j] += p[i][g] * vf[j];
        }
    }

    // combine the key slots of a warp (lanes LPK apart), then the warps
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float m = m_run[g];
#pragma unroll
        for (int o = LPK; o < 32; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float w = m_run[g] == NEG_INF ? 0.0f : exp2f(m_run[g] - m);
        float l = l_run[g] * w;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] *= w;
#pragma unroll
        for (int o = LPK; o < 32; o <<= 1) {
            l += __shfl_xor_sync(0xffffffffu, l, o);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], o);
        }
        if (lane < LPK) {
#pragma unroll
            for (int j = 0; j < 8; ++j) s_wacc[warp][g][sub * 8 + j] = acc[g][j];
            if (sub == 0) {
                s_wm[warp][g] = m;
                s_wl[warp][g] = l;
            }
        }
    }
    __syncthreads();
    for (int idx = tid; idx < G * D; idx += DEC_THREADS) {
        const int g = idx / D, d = idx % D;
        float m = NEG_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) m = fmaxf(m, s_wm[w][g]);
        float o = 0.0f, l = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            if (s_wm[w][g] != NEG_INF) {
                const float e = exp2f(s_wm[w][g] - m);
                o += s_wacc[w][g][d] * e;
                l += s_wl[w][g] * e;
            }
        }
        if (MODE != DEC_PARTIALS && active == 1) {
            // the only split: what the merge would compute (weight exp2(0) = 1), directly
            out[(size_t)b * out_stride + (h0 + g) * D + d] =
                f2bf(l > 0.0f ? (o * v_scale) / l : 0.0f);
            continue;
        }
        const size_t part = (size_t)(b * n_heads + h0 + g) * nsplit + split;
        partial_o[part * D + d] = o * v_scale;
        if (d == 0) {
            partial_ml[part * 2] = m;
            partial_ml[part * 2 + 1] = l;
        }
    }
    pdl_trigger_end();
    if (MODE == DEC_PARTIALS || active == 1) return;

    // merged forms: the last active split block of (b, kvh) to arrive merges the group's heads
    __threadfence();
    __syncthreads();
    {
        unsigned int* counter = counters + (size_t)b * gridDim.y + kvh;
        if (tid == 0) {
            const unsigned int prev = atomicAdd(counter, 1u);
            s_last = prev == (unsigned int)(active - 1);
        }
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        if (tid == 0) *counter = 0u;  // ready for the next launch (graph replays too)
    }
    // the active splits' (max, sum) into shared memory, then every output element
    for (int idx = tid; idx < G * active; idx += DEC_THREADS) {
        const int g = idx / active, s = idx % active;
        const float* ml = partial_ml + ((size_t)(b * n_heads + h0 + g) * nsplit + s) * 2;
        s_sm[g][s] = ld_cg_f32(ml);
        s_sl[g][s] = ld_cg_f32(ml + 1);
    }
    __syncthreads();
    for (int idx = tid; idx < G * D; idx += DEC_THREADS) {
        const int g = idx / D, d = idx % D;
        const size_t base = (size_t)(b * n_heads + h0 + g) * nsplit;
        float m = NEG_INF;
        for (int s = 0; s < active; ++s) {
            if (s_sl[g][s] > 0.0f) m = fmaxf(m, s_sm[g][s]);
        }
        float l = 0.0f, o = 0.0f;
#pragma unroll 8
        for (int s = 0; s < active; ++s) {
            const float ls = s_sl[g][s];
            if (ls > 0.0f) {
                const float w = exp2f(s_sm[g][s] - m);
                l += ls * w;
                o += ld_cg_f32(partial_o + (base + s) * D + d) * w;
            }
        }
        out[(size_t)b * out_stride + (h0 + g) * D + d] = f2bf(l > 0.0f ? o / l : 0.0f);
    }
}

// Kernel names: decode_attn[_merged|_rope]_d<D>_g<G> for a bf16 pool, with _e4m3 / _e5m2
// appended for an FP8 pool.
#define DECODE_ATTN(D, G, SUF, KV)                                                             \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                  \
        decode_attn_d##D##_g##G##SUF(float* po, float* pml, const bf16_t* q, int q_stride,     \
                                     const KV::T* kc, const KV::T* vc, int kv_stride,          \
                                     const int* kv_indptr, const int* kv_indices, int n_heads, \
                                     float scale_log2, float v_scale) {                        \
        decode_attn_impl<D, G, DEC_PARTIALS, KV>(nullptr, 0, po, pml, nullptr, q, q_stride,    \
                                                 kc, vc, nullptr, nullptr, kv_stride,          \
                                                 kv_indptr, kv_indices, nullptr, nullptr,      \
                                                 n_heads, scale_log2, v_scale, 1.0f, 1.0f);    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                  \
        decode_attn_merged_d##D##_g##G##SUF(                                                   \
            bf16_t* out, int out_stride, float* po, float* pml, unsigned int* counters,        \
            const bf16_t* q, int q_stride, const KV::T* kc, const KV::T* vc, int kv_stride,    \
            const int* kv_indptr, const int* kv_indices, int n_heads, float scale_log2,        \
            float v_scale) {                                                                   \
        decode_attn_impl<D, G, DEC_MERGED, KV>(out, out_stride, po, pml, counters, q,          \
                                               q_stride, kc, vc, nullptr, nullptr, kv_stride,  \
                                               kv_indptr, kv_indices, nullptr, nullptr,        \
                                               n_heads, scale_log2, v_scale, 1.0f, 1.0f);      \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                  \
        decode_attn_rope_d##D##_g##G##SUF(                                                     \
            bf16_t* out, int out_stride, float* po, float* pml, unsigned int* counters,        \
            const bf16_t* qkv, int q_stride, KV::T* kc, KV::T* vc, int kv_stride,              \
            const int* kv_indptr, const int* kv_indices, const int* positions,                 \
            const float* inv_freq, int n_heads, float scale_log2, float v_scale, float k_inv,  \
            float v_inv) {                                                                     \
        decode_attn_impl<D, G, DEC_ROPE, KV>(out, out_stride, po, pml, counters, qkv,          \
                                             q_stride, kc, vc, kc, vc, kv_stride, kv_indptr,   \
                                             kv_indices, positions, inv_freq, n_heads,         \
                                             scale_log2, v_scale, k_inv, v_inv);               \
    }

#define DECODE_ATTN_ALL(SUF, KV)  \
    DECODE_ATTN(64, 1, SUF, KV)   \
    DECODE_ATTN(64, 2, SUF, KV)   \
    DECODE_ATTN(64, 4, SUF, KV)   \
    DECODE_ATTN(64, 8, SUF, KV)   \
    DECODE_ATTN(128, 1, SUF, KV)  \
    DECODE_ATTN(128, 2, SUF, KV)  \
    DECODE_ATTN(128, 4, SUF, KV)  \
    DECODE_ATTN(128, 8, SUF, KV)

DECODE_ATTN_ALL(, KvBf16)
DECODE_ATTN_ALL(_e4m3, KvE4m3)
DECODE_ATTN_ALL(_e5m2, KvE5m2)

// out[b, h*D + d] = merge over splits. Grid (batch, heads), block D threads.
extern "C" __global__ void attn_merge_splits(bf16_t* __restrict__ out, int out_stride,
                                             const float* __restrict__ partial_o,
                                             const float* __restrict__ partial_ml, int n_heads,
                                             int nsplit, int head_dim) {
    pdl_wait();
    pdl_trigger_early();
    const int b = blockIdx.x, h = blockIdx.y;
    const size_t base = (size_t)(b * n_heads + h) * nsplit;
    const float m = dec_merge_max(partial_ml, base, nsplit);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        out[(size_t)b * out_stride + h * head_dim + d] =
            dec_merge_one(partial_o, partial_ml, base, nsplit, head_dim, d, m);
    }
    pdl_trigger_end();
}
