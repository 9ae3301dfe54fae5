// Decode attention over the paged KV pool (page size 1), one query token per sequence.
//
// Grid (batch, kv_heads, splits). Each block takes one KV head with its GQA group of G query
// heads (so K/V rows are read once for the group) and one contiguous split of the sequence;
// it writes unnormalised partial outputs plus (max, sum) in the log2 domain. The split size is
// derived from each sequence's own length on the device, so one launch shape (and one captured
// graph) serves any lengths.
//
// Three forms share the code:
// - decode_attn_d*_g*: partials only; `attn_merge_splits` (a second launch) combines them.
// - decode_attn_merged_d*_g*: the last split block of each (sequence, KV head) to finish (an
//   arrival counter, as in the split-k GEMV) merges the group's splits itself, in split order
//   and with attn_merge_splits' arithmetic, so the result never depends on timing and equals
//   the two-launch form bit for bit. Counters start at zero and are left at zero.
// - decode_attn_rope_d*_g*: the merged form reading the raw fused qkv row of a decode pass
//   (every sequence one new token, q and k not yet rotated). Each block rotates its group's
//   query heads; the block whose split holds the sequence's last position (the new token)
//   rotates k, writes k and v to the pool at that position's slot (kv_indices'
//   last entry of the sequence) and uses them directly. RoPE and rounding as
//   rope_kv_store_bf16, so the result (and the pool) equal rope_kv_store + decode_attn.
//
// Layouts: q row of sequence b at q + b * q_stride, head h at + h * D (for the rope form the
// qkv row [q heads | k heads | v heads]); K/V pool rows of kv_stride elements (kv_heads * D)
// per slot; partial_o [B, H, S, D], partial_ml [B, H, S, 2]; counters [B, kv_heads].

#define DEC_THREADS 128
#define DEC_TILE 128

// Decode attention forms (see above).
#define DEC_PARTIALS 0
#define DEC_MERGED 1
#define DEC_ROPE 2

// Merge of one output element: head row `base` (= (b * n_heads + h) * nsplit) of the partials,
// dim d, with m the largest max of the non-empty splits. Shared by attn_merge_splits and the
// merged forms so both round alike. LD loads a partial (plain or L2-coherent).
template <bool COHERENT>
__device__ __forceinline__ float dec_ld(const float* p) {
    if (COHERENT) {
        float v;
        asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
        return v;
    }
    return *p;
}

template <bool COHERENT>
__device__ __forceinline__ float dec_merge_max(const float* __restrict__ partial_ml, size_t base,
                                               int nsplit) {
    float m = NEG_INF;
    for (int s = 0; s < nsplit; ++s) {
        if (dec_ld<COHERENT>(partial_ml + (base + s) * 2 + 1) > 0.0f) {
            m = fmaxf(m, dec_ld<COHERENT>(partial_ml + (base + s) * 2));
        }
    }
    return m;
}

template <bool COHERENT>
__device__ __forceinline__ bf16_t dec_merge_one(const float* __restrict__ partial_o,
                                                const float* __restrict__ partial_ml,
                                                size_t base, int nsplit, int head_dim, int d,
                                                float m) {
    float l = 0.0f, o = 0.0f;
    for (int s = 0; s < nsplit; ++s) {
        const float ls = dec_ld<COHERENT>(partial_ml + (base + s) * 2 + 1);
        if (ls > 0.0f) {
            const float w = exp2f(dec_ld<COHERENT>(partial_ml + (base + s) * 2) - m);
            l += ls * w;
            o += dec_ld<COHERENT>(partial_o + (base + s) * head_dim + d) * w;
        }
    }
    return f2bf(l > 0.0f ? o / l : 0.0f);
}

// Llama rotate-half RoPE of the pair (x1 = x[i], x2 = x[i + D/2]) at `pos`, rounded as
// rope_kv_store_bf16 rounds it.
__device__ __forceinline__ void dec_rope_pair(float pos, float inv_freq, float x1, float x2,
                                              bf16_t& o1, bf16_t& o2) {
    float s, c;
    sincosf(pos * inv_freq, &s, &c);
    c = rbf(c);
    s = rbf(s);
    o1 = f2bf(rbf(x1 * c) + rbf(-x2 * s));
    o2 = f2bf(rbf(x2 * c) + rbf(x1 * s));
}

template <int D, int G, int MODE>
__device__ __forceinline__ void decode_attn_impl(
    bf16_t* __restrict__ out, int out_stride, float* __restrict__ partial_o,
    float* __restrict__ partial_ml, unsigned int* __restrict__ counters,
    const bf16_t* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, bf16_t* k_store, bf16_t* v_store, int kv_stride,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
    const int* __restrict__ positions, const float* __restrict__ inv_freq, int n_heads,
    float scale_log2) {
    constexpr int LPK = D / 8;            // lanes per key in the score phase (8 dims each)
    constexpr int KPW = 32 / LPK;         // keys per warp step
    constexpr int NW = DEC_THREADS / 32;  // warps
    constexpr int NKG = DEC_THREADS / LPK;  // key groups in the value phase
    constexpr int ROPE_D = MODE == DEC_ROPE ? D : 1;

    __shared__ float s_p[G][DEC_TILE];
    __shared__ float s_m[G], s_l[G], s_alpha[G];
    __shared__ float s_red[NKG][G][8 * LPK];
    __shared__ float s_q[MODE == DEC_ROPE ? G : 1][ROPE_D];
    __shared__ float s_knew[ROPE_D], s_vnew[ROPE_D];
    __shared__ int s_last;

    pdl_wait();
    pdl_trigger_early();
    const int b = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, nsplit = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int beg = kv_indptr[b];
    const int len = kv_indptr[b + 1] - beg;
    const int per = (len + nsplit - 1) / nsplit;
    const int k0 = split * per;
    const int k1 = min(len, k0 + per);
    const int h0 = kvh * G;
    // rope form: the new token's position in the sequence (its last); -1 where none
    const int last = MODE == DEC_ROPE ? len - 1 : -1;

    if (k0 >= k1) {  // empty split: contributes nothing
        for (int g = tid; g < G; g += DEC_THREADS) {
            float* ml = partial_ml + ((size_t)(b * n_heads + h0 + g) * nsplit + split) * 2;
            ml[0] = NEG_INF;
            ml[1] = 0.0f;
        }
        pdl_trigger_end();
        if (MODE == DEC_PARTIALS) return;
    } else {
        if constexpr (MODE == DEC_ROPE) {
            // rotate the group's query heads (and, in the split holding the new token, its k)
            // as rope_kv_store_bf16 does; v is copied as is
            constexpr int HALF = D / 2;
            const bf16_t* row = q + (size_t)b * q_stride;
            const float pos = (float)positions[b];
            const bool has_new = k0 <= last && last < k1;
            const int n_rot = (G + (has_new ? 1 : 0)) * HALF;
            const size_t kv_row = has_new ? (size_t)kv_indices[beg + last] * kv_stride + kvh * D
                                          : 0;
            for (int idx = tid; idx < n_rot; idx += DEC_THREADS) {
                const int g = idx / HALF, i = idx % HALF;
                const int col = g < G ? (h0 + g) * D : (n_heads + kvh) * D;
                bf16_t o1, o2;
                dec_rope_pair(pos, inv_freq[i], bf2f(row[col + i]), bf2f(row[col + i + HALF]),
                              o1, o2);
                if (g < G) {
                    s_q[g][i] = bf2f(o1);
                    s_q[g][i + HALF] = bf2f(o2);
                } else {
                    k_store[kv_row + i] = o1;
                    k_store[kv_row + i + HALF] = o2;
                    s_knew[i] = bf2f(o1);
                    s_knew[i + HALF] = bf2f(o2);
                }
            }
            if (has_new) {
                const bf16_t* v = row + (size_t)(n_heads + gridDim.y + kvh) * D;
                for (int i = tid; i < D; i += DEC_THREADS) {
                    v_store[kv_row + i] = v[i];
                    s_vnew[i] = bf2f(v[i]);
                }
            }
            __syncthreads();
        }

        // q dims of this lane, for every head of the group
        const int sub = lane % LPK;
        float qr[G][8];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if constexpr (MODE == DEC_ROPE) {
#pragma unroll
                for (int i = 0; i < 8; ++i) qr[g][i] = s_q[g][sub * 8 + i];
            } else {
                const uint4 v = *(const uint4*)(q + (size_t)b * q_stride + (h0 + g) * D + sub * 8);
                unpack8(v, qr[g]);
            }
        }
        if (tid < G) {
            s_m[tid] = NEG_INF;
            s_l[tid] = 0.0f;
        }
        const int vc = tid % LPK;   // value phase: dim chunk
        const int kg = tid / LPK;   // value phase: key group
        float acc[G][8];
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
        const size_t head_off = (size_t)kvh * D;

        for (int t0 = k0; t0 < k1; t0 += DEC_TILE) {
            const int n = min(DEC_TILE, k1 - t0);
            // scores
            for (int jb = warp * KPW; jb < n; jb += NW * KPW) {
                const int j = jb + lane / LPK;
                const bool ok = j < n;
                float kf[8];
                if (MODE == DEC_ROPE && ok && t0 + j == last) {  // the new token's k, rotated above
#pragma unroll
                    for (int i = 0; i < 8; ++i) kf[i] = s_knew[(sub * 8 + i) % ROPE_D];
                } else if (ok) {
                    const int slot = kv_indices[beg + t0 + j];
                    unpack8(
                        *(const uint4*)(k_cache + (size_t)slot * kv_stride + head_off + sub * 8),
                        kf);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) kf[i] = 0.0f;
                }
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    float d = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; ++i) d += qr[g][i] * kf[i];
#pragma unroll
                    for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                    if (ok && sub == 0) s_p[g][j] = d * scale_log2;
                }
            }
            __syncthreads();
            // online softmax per head: one warp per head
            for (int g = warp; g < G; g += NW) {
                float mx = NEG_INF;
                for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s_p[g][j]);
                mx = warp_max(mx);
                const float m_old = s_m[g];
                const float m_new = fmaxf(m_old, mx);
                float sum = 0.0f;
                for (int j = lane; j < n; j += 32) {
                    const float p = exp2f(s_p[g][j] - m_new);
                    s_p[g][j] = p;
                    sum += p;
                }
                sum = warp_sum(sum);
                __syncwarp();
                if (lane == 0) {
                    const float alpha = exp2f(m_old - m_new);
                    s_alpha[g] = alpha;
                    s_l[g] = s_l[g] * alpha + sum;
                    s_m[g] = m_new;
                }
            }
            __syncthreads();
            // values
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float a = s_alpha[g];
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] *= a;
            }
            for (int j = kg; j < n; j += NKG) {
                float vf[8];
                if (MODE == DEC_ROPE && t0 + j == last) {
#pragma unroll
                    for (int i = 0; i < 8; ++i) vf[i] = s_vnew[(vc * 8 + i) % ROPE_D];
                } else {
                    const int slot = kv_indices[beg + t0 + j];
                    unpack8(*(const uint4*)(v_cache + (size_t)slot * kv_stride + head_off + vc * 8),
                            vf);
                }
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    const float p = s_p[g][j];
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[g][i] += p * vf[i];
                }
            }
            __syncthreads();
        }
        pdl_trigger_end();
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) s_red[kg][g][vc * 8 + i] = acc[g][i];
        __syncthreads();
        for (int idx = tid; idx < G * D; idx += DEC_THREADS) {
            const int g = idx / D, d = idx % D;
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < NKG; ++k) s += s_red[k][g][d];
            const size_t part = (size_t)(b * n_heads + h0 + g) * nsplit + split;
            partial_o[part * D + d] = s;
            if (d == 0) {
                partial_ml[part * 2] = s_m[g];
                partial_ml[part * 2 + 1] = s_l[g];
            }
        }
    }
    if (MODE == DEC_PARTIALS) return;

    // merged forms: the last split block of (b, kvh) to arrive merges the group's heads
    __threadfence();
    __syncthreads();
    if (nsplit > 1) {
        unsigned int* counter = counters + (size_t)b * gridDim.y + kvh;
        if (tid == 0) {
            const unsigned int prev = atomicAdd(counter, 1u);
            s_last = prev == (unsigned int)(nsplit - 1);
        }
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        if (tid == 0) *counter = 0u;  // ready for the next launch (graph replays too)
    }
    for (int idx = tid; idx < G * D; idx += DEC_THREADS) {
        const int g = idx / D, d = idx % D;
        const size_t base = (size_t)(b * n_heads + h0 + g) * nsplit;
        const float m = dec_merge_max<true>(partial_ml, base, nsplit);
        out[(size_t)b * out_stride + (h0 + g) * D + d] =
            dec_merge_one<true>(partial_o, partial_ml, base, nsplit, D, d, m);
    }
}

#define DECODE_ATTN(D, G)                                                                      \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                  \
        decode_attn_d##D##_g##G(float* po, float* pml, const bf16_t* q, int q_stride,          \
                                const bf16_t* kc, const bf16_t* vc, int kv_stride,             \
                                const int* kv_indptr, const int* kv_indices, int n_heads,      \
                                float scale_log2) {                                            \
        decode_attn_impl<D, G, DEC_PARTIALS>(nullptr, 0, po, pml, nullptr, q, q_stride, kc, vc, \
                                             nullptr, nullptr, kv_stride, kv_indptr,           \
                                             kv_indices, nullptr, nullptr, n_heads,            \
                                             scale_log2);                                      \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) decode_attn_merged_d##D##_g##G(  \
        bf16_t* out, int out_stride, float* po, float* pml, unsigned int* counters,            \
        const bf16_t* q, int q_stride, const bf16_t* kc, const bf16_t* vc, int kv_stride,      \
        const int* kv_indptr, const int* kv_indices, int n_heads, float scale_log2) {          \
        decode_attn_impl<D, G, DEC_MERGED>(out, out_stride, po, pml, counters, q, q_stride, kc, \
                                           vc, nullptr, nullptr, kv_stride, kv_indptr,         \
                                           kv_indices, nullptr, nullptr, n_heads, scale_log2); \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) decode_attn_rope_d##D##_g##G(    \
        bf16_t* out, int out_stride, float* po, float* pml, unsigned int* counters,            \
        const bf16_t* qkv, int q_stride, bf16_t* kc, bf16_t* vc, int kv_stride,                \
        const int* kv_indptr, const int* kv_indices, const int* positions,                     \
        const float* inv_freq, int n_heads, float scale_log2) {                                \
        decode_attn_impl<D, G, DEC_ROPE>(out, out_stride, po, pml, counters, qkv, q_stride, kc, \
                                         vc, kc, vc, kv_stride, kv_indptr, kv_indices,         \
                                         positions, inv_freq, n_heads, scale_log2);            \
    }

DECODE_ATTN(64, 1)
DECODE_ATTN(64, 2)
DECODE_ATTN(64, 4)
DECODE_ATTN(64, 8)
DECODE_ATTN(128, 1)
DECODE_ATTN(128, 2)
DECODE_ATTN(128, 4)
DECODE_ATTN(128, 8)

// out[b, h*D + d] = merge over splits. Grid (batch, heads), block D threads.
extern "C" __global__ void attn_merge_splits(bf16_t* __restrict__ out, int out_stride,
                                             const float* __restrict__ partial_o,
                                             const float* __restrict__ partial_ml, int n_heads,
                                             int nsplit, int head_dim) {
    pdl_wait();
    pdl_trigger_early();
    const int b = blockIdx.x, h = blockIdx.y;
    const size_t base = (size_t)(b * n_heads + h) * nsplit;
    const float m = dec_merge_max<false>(partial_ml, base, nsplit);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        out[(size_t)b * out_stride + h * head_dim + d] =
            dec_merge_one<false>(partial_o, partial_ml, base, nsplit, head_dim, d, m);
    }
    pdl_trigger_end();
}
