// Sampling from bf16 logits, one block of SAMPLE_THREADS per row.
//
// Greedy rows (temperature <= 0) take the first index of the maximum. Other rows work on
// e_i = exp((x_i - max) / T), so the most likely token has e = 1, and keep the tokens with
// e >= tau, where tau is the largest of three thresholds found by bisection on e:
// top-k (at least k tokens kept), top-p (the kept mass of the top-k set reaches top_p of it)
// and min-p (e >= min_p, i.e. p >= min_p * p_max). The token is the first index whose running
// sum, in vocabulary order over the kept set, reaches u times the kept mass.
// params per row: [temperature, top_p, top_k, min_p, u].

#define SAMPLE_THREADS 1024
#define BISECT_STEPS 30

__device__ __forceinline__ void block_max_arg(float& v, int& i, float* sv, int* si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
    __syncthreads();
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sv[lane] : NEG_INF;
    i = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
}

// Count and mass of e_i >= t over the row.
__device__ __forceinline__ void count_mass(const bf16_t* row, int vocab, float mx, float inv_t,
                                           float t, float* scratch, float& cnt, float& mass) {
    float c = 0.0f, s = 0.0f;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float e = exp2f((bf2f(row[j]) - mx) * inv_t);
        if (e >= t) {
            c += 1.0f;
            s += e;
        }
    }
    cnt = block_sum(c, scratch);
    mass = block_sum(s, scratch);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_bf16(int* __restrict__ out, const bf16_t* __restrict__ logits, int vocab,
                const float* __restrict__ params) {
    __shared__ float scratch[32];
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ float s_chunk[SAMPLE_THREADS];
    pdl_wait();
    pdl_trigger_early();
    const bf16_t* row = logits + (size_t)blockIdx.x * vocab;
    const float* p = params + blockIdx.x * 5;
    const float temperature = p[0], top_p = p[1], min_p = p[3], u = p[4];
    const int top_k = (int)p[2];

    float mv = NEG_INF;
    int mi = 0x7fffffff;
    if ((vocab & 7) == 0 && ((size_t)row & 15) == 0) {
        // 16-byte loads, four in flight per thread: one block reads a 128K-entry row at a
        // fraction of the scalar loop's time. A thread meets its indices out of order here, so
        // ties go to the lower index explicitly; the same pick as the scalar loop below.
        const uint4* rv = (const uint4*)row;
        const int nv = vocab >> 3;
        for (int base = threadIdx.x; base < nv; base += 4 * blockDim.x) {
            uint4 w[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int vi = base + u * blockDim.x;
                w[u] = vi < nv ? rv[vi] : make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u,
                                                     0xff80ff80u);  // -inf, never above mv
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                float f[8];
                unpack8(w[u], f);
                const int j0 = (base + u * blockDim.x) * 8;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    // (a tie only once something was taken: -inf and NaN never are)
                    if (f[e] > mv || (f[e] == mv && mi != 0x7fffffff && j0 + e < mi)) {
                        mv = f[e];
                        mi = j0 + e;
                    }
                }
            }
        }
    } else {
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
            const float v = bf2f(row[j]);
            if (v > mv) {  // strided order: the first hit per thread is its lowest index
                mv = v;
                mi = j;
            }
        }
    }
    block_max_arg(mv, mi, sv, si);
    if (!(temperature > 0.0f)) {
        if (threadIdx.x == 0) out[blockIdx.x] = mi;
        pdl_trigger_end();
        return;
    }
    const float mx = mv;
    const float inv_t = 1.4426950408889634f / temperature;  // exp(x/T) = exp2(x * log2e / T)

    float tau = 0.0f;
    float cnt, mass_all;
    count_mass(row, vocab, mx, inv_t, 0.0f, scratch, cnt, mass_all);
    float mass_k = mass_all;
    if (top_k > 0 && top_k < vocab) {
        // largest t with count(e >= t) >= k
        float lo = 0.0f, hi = 1.0f;
        for (int it = 0; it < BISECT_STEPS; ++it) {
            const float mid = 0.5f * (lo + hi);
            float c, s;
            count_mass(row, vocab, mx, inv_t, mid, scratch, c, s);
            if (c >= (float)top_k) lo = mid;
            else hi = mid;
        }
        tau = lo;
        float c;
        count_mass(row, vocab, mx, inv_t, tau, scratch, c, mass_k);
    }
    if (top_p < 1.0f) {
        // largest t >= tau with mass(e >= t) >= top_p * mass_k
        float lo = tau, hi = 1.0f;
        const float target = top_p * mass_k;
        for (int it = 0; it < BISECT_STEPS; ++it) {
            const float mid = 0.5f * (lo + hi);
            float c, s;
            count_mass(row, vocab, mx, inv_t, mid, scratch, c, s);
            if (s >= target) lo = mid;
            else hi = mid;
        }
        tau = lo;
    }
    tau = fmaxf(tau, min_p);
    tau = fminf(tau, 1.0f);  // the top token always stays

    // Inverse CDF over the kept set in vocabulary order: each thread owns a contiguous chunk.
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int j0 = threadIdx.x * chunk, j1 = min(vocab, j0 + chunk);
    float local = 0.0f;
    for (int j = j0; j < j1; ++j) {
        const float e = exp2f((bf2f(row[j]) - mx) * inv_t);
        if (e >= tau) local += e;
    }
    s_chunk[threadIdx.x] = local;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int i = 0; i < (int)blockDim.x; ++i) total += s_chunk[i];
        const float target = u * total;
        float run = 0.0f;
        int pick = mi;
        for (int i = 0; i < (int)blockDim.x; ++i) {
            if (s_chunk[i] > 0.0f && run + s_chunk[i] > target) {
                const int a = i * chunk, z = min(vocab, a + chunk);
                for (int j = a; j < z; ++j) {
                    const float e = exp2f((bf2f(row[j]) - mx) * inv_t);
                    if (e >= tau) {
                        run += e;
                        pick = j;
                        if (run > target) break;
                    }
                }
                break;
            }
            run += s_chunk[i];
        }
        out[blockIdx.x] = pick;
    }
    pdl_trigger_end();
}

// In-place edits of bf16 logits [rows, vocab], one thread per entry (row, token, rep, add):
// l = logits[row, token]; with rep != 1, l = l > 0 ? l / rep : l * rep (repetition penalty);
// then l += add (frequency and presence penalties, logit bias, -inf masks); rounded to bf16.
// No two entries name the same (row, token); entries outside the buffer are skipped.
struct LogitEdit {
    unsigned int row, token;
    float rep, add;
};

extern "C" __global__ void logit_edits_bf16(bf16_t* __restrict__ logits, int rows, int vocab,
                                            const LogitEdit* __restrict__ edits, int n) {
    pdl_wait();
    pdl_trigger_early();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const LogitEdit e = edits[i];
        if (e.row >= (unsigned int)rows || e.token >= (unsigned int)vocab) continue;
        bf16_t* p = logits + (size_t)e.row * vocab + e.token;
        float l = bf2f(*p);
        if (e.rep != 1.0f) l = l > 0.0f ? l / e.rep : l * e.rep;
        *p = f2bf(l + e.add);
    }
    pdl_trigger_end();
}
