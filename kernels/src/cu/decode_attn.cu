// Decode attention over the paged KV pool (page size 1), one query token per sequence.
//
// Grid (batch, kv_heads, splits). Each block takes one KV head with its GQA group of G query
// heads (so K/V rows are read once for the group) and one contiguous split of the sequence;
// it writes unnormalised partial outputs plus (max, sum) in the log2 domain, and
// `attn_merge_splits` combines the splits. The split size is derived from each sequence's own
// length on the device, so one launch shape (and one captured graph) serves any lengths.
//
// Layouts: q row of sequence b at q + b * q_stride, head h at + h * D; K/V pool rows of
// kv_stride elements (kv_heads * D) per slot; partial_o [B, H, S, D], partial_ml [B, H, S, 2].

#define DEC_THREADS 128
#define DEC_TILE 128

template <int D, int G>
__device__ __forceinline__ void decode_attn_impl(float* __restrict__ partial_o,
                                                 float* __restrict__ partial_ml,
                                                 const bf16_t* __restrict__ q, int q_stride,
                                                 const bf16_t* __restrict__ k_cache,
                                                 const bf16_t* __restrict__ v_cache,
                                                 int kv_stride, const int* __restrict__ kv_indptr,
                                                 const int* __restrict__ kv_indices, int n_heads,
                                                 float scale_log2) {
    constexpr int LPK = D / 8;            // lanes per key in the score phase (8 dims each)
    constexpr int KPW = 32 / LPK;         // keys per warp step
    constexpr int NW = DEC_THREADS / 32;  // warps
    constexpr int NKG = DEC_THREADS / LPK;  // key groups in the value phase

    __shared__ float s_p[G][DEC_TILE];
    __shared__ float s_m[G], s_l[G], s_alpha[G];
    __shared__ float s_red[NKG][G][8 * LPK];

    pdl_wait();
    pdl_launch_dependents();
    const int b = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, nsplit = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int beg = kv_indptr[b];
    const int len = kv_indptr[b + 1] - beg;
    const int per = (len + nsplit - 1) / nsplit;
    const int k0 = split * per;
    const int k1 = min(len, k0 + per);
    const int h0 = kvh * G;

    if (k0 >= k1) {  // empty split: contributes nothing
        for (int g = tid; g < G; g += DEC_THREADS) {
            float* ml = partial_ml + ((size_t)(b * n_heads + h0 + g) * nsplit + split) * 2;
            ml[0] = NEG_INF;
            ml[1] = 0.0f;
        }
        return;
    }

    // q dims of this lane, for every head of the group
    const int sub = lane % LPK;
    float qr[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const uint4 v = *(const uint4*)(q + (size_t)b * q_stride + (h0 + g) * D + sub * 8);
        unpack8(v, qr[g]);
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
            if (ok) {
                const int slot = kv_indices[beg + t0 + j];
                unpack8(*(const uint4*)(k_cache + (size_t)slot * kv_stride + head_off + sub * 8),
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
            const int slot = kv_indices[beg + t0 + j];
            float vf[8];
            unpack8(*(const uint4*)(v_cache + (size_t)slot * kv_stride + head_off + vc * 8), vf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float p = s_p[g][j];
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] += p * vf[i];
            }
        }
        __syncthreads();
    }
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

#define DECODE_ATTN(D, G)                                                                      \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                  \
        decode_attn_d##D##_g##G(float* po, float* pml, const bf16_t* q, int q_stride,          \
                                const bf16_t* kc, const bf16_t* vc, int kv_stride,             \
                                const int* kv_indptr, const int* kv_indices, int n_heads,      \
                                float scale_log2) {                                            \
        decode_attn_impl<D, G>(po, pml, q, q_stride, kc, vc, kv_stride, kv_indptr, kv_indices, \
                               n_heads, scale_log2);                                           \
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
    pdl_launch_dependents();
    const int b = blockIdx.x, h = blockIdx.y;
    const size_t base = (size_t)(b * n_heads + h) * nsplit;
    float m = NEG_INF;
    for (int s = 0; s < nsplit; ++s) {
        if (partial_ml[(base + s) * 2 + 1] > 0.0f) m = fmaxf(m, partial_ml[(base + s) * 2]);
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float l = 0.0f, o = 0.0f;
        for (int s = 0; s < nsplit; ++s) {
            const float ls = partial_ml[(base + s) * 2 + 1];
            if (ls > 0.0f) {
                const float w = exp2f(partial_ml[(base + s) * 2] - m);
                l += ls * w;
                o += partial_o[(base + s) * head_dim + d] * w;
            }
        }
        out[(size_t)b * out_stride + h * head_dim + d] = f2bf(l > 0.0f ? o / l : 0.0f);
    }
}
