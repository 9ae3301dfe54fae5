// Row-wise and element-wise kernels of the Llama forward pass. Rounding follows PyTorch's bf16
// modules (each op's output rounded to bf16) so the engine tracks transformers closely.
// Each kernel waits for the kernels before it (pdl_wait) before it touches memory, and lets the
// next kernel start launching once a block's work is done (see pdl_trigger_end).

// out[t, :] = table[ids[t], :]; ids outside the table give a zero row.
extern "C" __global__ void embedding_gather_bf16(bf16_t* __restrict__ out,
                                                 const bf16_t* __restrict__ table,
                                                 const unsigned int* __restrict__ ids,
                                                 int hidden, int vocab) {
    pdl_wait();
    pdl_trigger_early();
    const int t = blockIdx.x;
    const unsigned int id = ids[t];
    const int nvec = hidden / 8;
    uint4* dst = (uint4*)(out + (size_t)t * hidden);
    if (id >= (unsigned int)vocab) {
        for (int i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = make_uint4(0, 0, 0, 0);
        return;
    }
    const uint4* src = (const uint4*)(table + (size_t)id * hidden);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = src[i];
    pdl_trigger_end();
}

// With `delta`: residual = bf16(residual + delta). Then out = rmsnorm(residual) * weight, as
// transformers' LlamaRMSNorm computes it (normalise in f32, round, multiply in bf16).
// One block per token; hidden % 8 == 0.
extern "C" __global__ void add_rmsnorm_bf16(bf16_t* __restrict__ out, bf16_t* __restrict__ residual,
                                            const bf16_t* __restrict__ delta,
                                            const bf16_t* __restrict__ weight, int hidden,
                                            float eps) {
    pdl_wait();
    pdl_trigger_early();
    __shared__ float scratch[32];
    const size_t row = (size_t)blockIdx.x * hidden;
    uint4* res = (uint4*)(residual + row);
    const int nvec = hidden / 8;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        float x[8];
        unpack8(res[i], x);
        if (delta != nullptr) {
            float d[8];
            unpack8(((const uint4*)(delta + row))[i], d);
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = rbf(x[j] + d[j]);
            res[i] = pack8(x);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += x[j] * x[j];
    }
    const float total = block_sum(ss, scratch);
    const float inv = rsqrtf(total / (float)hidden + eps);
    uint4* o = (uint4*)(out + row);
    const uint4* w = (const uint4*)weight;
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        float x[8], g[8];
        unpack8(res[i], x);
        unpack8(w[i], g);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] = g[j] * rbf(x[j] * inv);
        o[i] = pack8(x);
    }
    pdl_trigger_end();
}

// Rotate-half RoPE on q and k of a fused qkv row ([q heads | k heads | v heads] x head_dim),
// in place for q; k (rotated) and v are written to the paged pool at `slots[t]`.
// cos/sin are rounded to bf16 and each product rounded, as transformers' apply_rotary_pos_emb.
// One block per token: the token's cos/sin (head_dim / 2 <= 256 of each) are computed once
// into shared memory, then every head is rotated four pairs at a time. head_dim % 8 == 0.
// The pool's element type is KV's (kv.cuh): rope_kv_store_bf16, _e4m3 and _e5m2; an FP8 pool
// stores k * k_inv and v * v_inv (the inverses of the layer's K and V scales; a bf16 pool
// ignores them). With RESCALE (rope_kv_store_rescale_*), qkv holds an FP8 GEMM's unscaled
// product, and its scales (xs per token, ws per column) are applied first exactly as
// fp8_rescale_bf16 rounds them; the q heads are written back scaled and rotated, the k and v
// parts of qkv are left as they were (attention reads k and v from the pool). With `keep`, k
// (rotated) and v (scaled) are also written back into qkv as bf16, the values a bf16 pool
// would hold: prefill attention over an FP8 pool can then read a fresh prompt's K and V from
// the rows (see kv_rows in core's cuda/forward/attn_plan.rs).
template <int N>
__device__ __forceinline__ void rescale_words(unsigned int* w, float sx, const float* ws) {
    // 2N bf16 values in w (low half first), ws[0..2N) 16-byte aligned: bf16(x * sx * ws + 0)
    // as fp8_rescale_bf16 computes and rounds it
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
        const float4 c = __ldg((const float4*)ws + k);
        const float x0 = __uint_as_float(w[2 * k] << 16);
        const float x1 = __uint_as_float(w[2 * k] & 0xffff0000u);
        const float x2 = __uint_as_float(w[2 * k + 1] << 16);
        const float x3 = __uint_as_float(w[2 * k + 1] & 0xffff0000u);
        w[2 * k] = (unsigned int)f2bf(x0 * sx * c.x + 0.0f) |
                   ((unsigned int)f2bf(x1 * sx * c.y + 0.0f) << 16);
        w[2 * k + 1] = (unsigned int)f2bf(x2 * sx * c.z + 0.0f) |
                       ((unsigned int)f2bf(x3 * sx * c.w + 0.0f) << 16);
    }
}

template <typename KV, bool RESCALE>
__device__ __forceinline__ void rope_kv_store_impl(bf16_t* __restrict__ qkv,
                                                   typename KV::T* __restrict__ k_cache,
                                                   typename KV::T* __restrict__ v_cache,
                                                   const int* __restrict__ positions,
                                                   const int* __restrict__ slots,
                                                   const float* __restrict__ inv_freq,
                                                   int n_heads, int n_kv_heads, int head_dim,
                                                   float k_inv, float v_inv,
                                                   const float* __restrict__ xs,
                                                   const float* __restrict__ ws, int keep) {
    __shared__ float s_cos[256], s_sin[256];
    pdl_wait();
    pdl_trigger_early();
    const int t = blockIdx.x;
    const int half = head_dim / 2;
    const int row_len = (n_heads + 2 * n_kv_heads) * head_dim;
    bf16_t* row = qkv + (size_t)t * row_len;
    const float pos = (float)positions[t];
    const size_t kv_row = (size_t)slots[t] * n_kv_heads * head_dim;
    const float sx = RESCALE ? xs[t] : 0.0f;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        s_cos[i] = rbf(c);
        s_sin[i] = rbf(s);
    }
    __syncthreads();
    const int quads = half / 4;
    const int n_rot = (n_heads + n_kv_heads) * quads;
    for (int idx = threadIdx.x; idx < n_rot; idx += blockDim.x) {
        const int head = idx / quads, i = (idx % quads) * 4;
        const uint2 a = *(const uint2*)(row + head * head_dim + i);
        const uint2 b = *(const uint2*)(row + head * head_dim + i + half);
        unsigned int aw[2] = {a.x, a.y}, bw[2] = {b.x, b.y};
        if (RESCALE) {
            rescale_words<2>(aw, sx, ws + head * head_dim + i);
            rescale_words<2>(bw, sx, ws + head * head_dim + i + half);
        }
        unsigned int ow1[2], ow2[2];
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            bf16_t o1[2], o2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float c = s_cos[i + 2 * w + e], s = s_sin[i + 2 * w + e];
                const float x1 = __uint_as_float(e ? aw[w] & 0xffff0000u : aw[w] << 16);
                const float x2 = __uint_as_float(e ? bw[w] & 0xffff0000u : bw[w] << 16);
                o1[e] = f2bf(rbf(x1 * c) + rbf(-x2 * s));
                o2[e] = f2bf(rbf(x2 * c) + rbf(x1 * s));
            }
            ow1[w] = (unsigned int)o1[0] | ((unsigned int)o1[1] << 16);
            ow2[w] = (unsigned int)o2[0] | ((unsigned int)o2[1] << 16);
        }
        if (head < n_heads || keep) {
            bf16_t* dst = row + head * head_dim;
            *(uint2*)(dst + i) = make_uint2(ow1[0], ow1[1]);
            *(uint2*)(dst + i + half) = make_uint2(ow2[0], ow2[1]);
        }
        if (head >= n_heads) {
            typename KV::T* dst = k_cache + kv_row + (head - n_heads) * head_dim;
            KV::store4(dst + i, make_uint2(ow1[0], ow1[1]), k_inv);
            KV::store4(dst + i + half, make_uint2(ow2[0], ow2[1]), k_inv);
        }
    }
    bf16_t* v = row + (n_heads + n_kv_heads) * head_dim;
    const int nvec = n_kv_heads * head_dim / 8;
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        uint4 x = ((const uint4*)v)[i];
        if (RESCALE) {
            unsigned int w[4] = {x.x, x.y, x.z, x.w};
            rescale_words<4>(w, sx, ws + (n_heads + n_kv_heads) * head_dim + i * 8);
            x = make_uint4(w[0], w[1], w[2], w[3]);
            if (keep) ((uint4*)v)[i] = x;
        }
        KV::store8(v_cache + kv_row + (size_t)i * 8, x, v_inv);
    }
    pdl_trigger_end();
}

#define ROPE_KV_STORE(SUF, KV)                                                                 \
    extern "C" __global__ void rope_kv_store_##SUF(                                            \
        bf16_t* qkv, KV::T* k_cache, KV::T* v_cache, const int* positions, const int* slots,  \
        const float* inv_freq, int n_heads, int n_kv_heads, int head_dim, float k_inv,         \
        float v_inv, const float*, const float*, int keep) {                                   \
        rope_kv_store_impl<KV, false>(qkv, k_cache, v_cache, positions, slots, inv_freq,       \
                                      n_heads, n_kv_heads, head_dim, k_inv, v_inv, nullptr,    \
                                      nullptr, keep);                                          \
    }                                                                                          \
    extern "C" __global__ void rope_kv_store_rescale_##SUF(                                    \
        bf16_t* qkv, KV::T* k_cache, KV::T* v_cache, const int* positions, const int* slots,  \
        const float* inv_freq, int n_heads, int n_kv_heads, int head_dim, float k_inv,         \
        float v_inv, const float* xs, const float* ws, int keep) {                             \
        rope_kv_store_impl<KV, true>(qkv, k_cache, v_cache, positions, slots, inv_freq,        \
                                     n_heads, n_kv_heads, head_dim, k_inv, v_inv, xs, ws,      \
                                     keep);                                                    \
    }
ROPE_KV_STORE(bf16, KvBf16)
ROPE_KV_STORE(e4m3, KvE4m3)
ROPE_KV_STORE(e5m2, KvE5m2)

// out[t, i] = bf16(bf16(silu(gate[t, i])) * up[t, i]) with gate_up = [gate | up] per row (SiLU:
// silu_f32).
extern "C" __global__ void silu_mul_bf16(bf16_t* __restrict__ out,
                                         const bf16_t* __restrict__ gate_up, int n_tokens,
                                         int inter) {
    pdl_wait();
    pdl_trigger_early();
    const int nvec_row = inter / 8;
    const size_t total = (size_t)n_tokens * nvec_row;
    for (size_t v = (size_t)blockIdx.x * blockDim.x + threadIdx.x; v < total;
         v += (size_t)gridDim.x * blockDim.x) {
        const size_t t = v / nvec_row, i = v % nvec_row;
        const uint4* row = (const uint4*)(gate_up + t * 2 * inter);
        float g[8], u[8];
        unpack8(row[i], g);
        unpack8(row[nvec_row + i], u);
#pragma unroll
        for (int j = 0; j < 8; ++j) g[j] = rbf(silu_f32(g[j])) * u[j];
        ((uint4*)(out + t * inter))[i] = pack8(g);
    }
    pdl_trigger_end();
}

// out[i, :] = src[rows[i], :] for bf16 rows of `width` elements (width % 8 == 0).
extern "C" __global__ void gather_rows_bf16(bf16_t* __restrict__ out,
                                            const bf16_t* __restrict__ src,
                                            const int* __restrict__ rows, int width) {
    pdl_wait();
    pdl_trigger_early();
    const int i = blockIdx.x;
    const uint4* s = (const uint4*)(src + (size_t)rows[i] * width);
    uint4* d = (uint4*)(out + (size_t)i * width);
    for (int j = threadIdx.x; j < width / 8; j += blockDim.x) d[j] = s[j];
    pdl_trigger_end();
}

// dst[pairs[2 i]] = src[pairs[2 i + 1]] for i < n: the next step's input token ids taken from
// the tokens the previous step sampled, on the device.
extern "C" __global__ void copy_tokens_i32(int* __restrict__ dst, const int* __restrict__ src,
                                           const int* __restrict__ pairs, int n) {
    pdl_wait();
    pdl_trigger_early();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        dst[pairs[2 * i]] = src[pairs[2 * i + 1]];
    }
    pdl_trigger_end();
}
