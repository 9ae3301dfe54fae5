// Element types of the KV cache (`--kv-cache-dtype`). KvBf16 keeps K and V as computed; the FP8
// types keep one byte per element: e4m3 (f2e4m3 of fp8.cu: nearest even, saturated to +-448) and
// e5m2 (f2e5m2: nearest even, saturated to +-57344, NaN stays NaN), of the value times `inv`, the
// inverse of the layer's K or V scale (1 where the checkpoint brings none, as SGLang uses). Every
// FP8 value is exact in bf16 and in f32, so attention reads the values the bytes stand for, in
// the stored domain: the attention kernels apply the scales outside the per-key work (K's
// folded into the softmax scale, V's on the output). The kernels that write the cache round
// each element once, and a fused kernel that also uses the value it writes uses the rounded
// one. KvBf16 ignores `inv` (a bf16 cache is not scaled).
//
// Each type gives: T (one element), Raw8 (eight elements as loaded), load8/zero8, unpack (eight
// floats), to_bf16x8 (eight bf16 in a uint4), enc (a bf16 value times inv, as stored), dec (a
// stored value as f32), store4 / store8 (four / eight bf16 values, as uint2 / uint4, times inv,
// stored). The FP8 types also give to_f16x4 (four stored bytes as f16 in units of F16_UNIT,
// exact: two words, lowest first) and pair_f16 (two chosen bytes of a word as one f16 pair) for
// kernels that run f16 MMAs on the bytes.

__device__ __forceinline__ unsigned int f2e5m2(float f) {
    const unsigned int sign = (__float_as_uint(f) >> 24) & 0x80u;
    const float a = fabsf(f);
    if (a != a) return sign | 0x7fu;  // NaN
    if (a < 6.103515625e-05f) {
        // below the smallest normal (2^-14): multiples of 2^-16; 4 of them is 2^-14 itself (0x04)
        return sign | (unsigned int)__float2int_rn(a * 65536.0f);
    }
    unsigned int u = __float_as_uint(a);
    u += 0xfffffu + ((u >> 21) & 1u);  // round to 2 mantissa bits, ties to even
    const int e = (int)(u >> 23) - 127;
    const unsigned int m = (u >> 21) & 3u;
    if (e > 15) return sign | 0x7bu;  // saturate to 57344 (infinities too)
    return sign | ((unsigned int)(e + 15) << 2) | m;
}

struct KvBf16 {
    typedef bf16_t T;
    typedef uint4 Raw8;
    static __device__ __forceinline__ Raw8 load8(const T* p) { return *(const uint4*)p; }
    static __device__ __forceinline__ Raw8 zero8() { return make_uint4(0u, 0u, 0u, 0u); }
    static __device__ __forceinline__ void unpack(Raw8 v, float* f) { unpack8(v, f); }
    static __device__ __forceinline__ uint4 to_bf16x8(Raw8 v) { return v; }
    static __device__ __forceinline__ T enc(bf16_t x, float) { return x; }
    static __device__ __forceinline__ float dec(T x) { return bf2f(x); }
    static __device__ __forceinline__ void store4(T* p, uint2 v, float) { *(uint2*)p = v; }
    static __device__ __forceinline__ void store8(T* p, uint4 v, float) { *(uint4*)p = v; }
};

template <bool E5M2>
struct KvFp8 {
    typedef unsigned char T;
    typedef uint2 Raw8;
    // four stored bytes (of a word, lowest first) as floats
    static __device__ __forceinline__ void dec4(unsigned int w, float* f) {
        if constexpr (E5M2) {
            // an e5m2 byte is the upper half of the f16 of the same value
#pragma unroll
            for (int i = 0; i < 4; ++i) f[i] = h2f(((w >> (8 * i)) & 0xffu) << 8);
        } else {
            unsigned int lo, hi;
            e4m3x4_to_f16x4(w, lo, hi);
            f[0] = h2f(lo & 0xffffu) * FP8_F16_UNIT;
            f[1] = h2f(lo >> 16) * FP8_F16_UNIT;
            f[2] = h2f(hi & 0xffffu) * FP8_F16_UNIT;
            f[3] = h2f(hi >> 16) * FP8_F16_UNIT;
        }
    }
    // f16 values of the stored ones are these units: e4m3 as e4m3x4_to_f16x4 widens it; an
    // e5m2 byte is the upper half of its f16
    static constexpr float F16_UNIT = E5M2 ? 1.0f : FP8_F16_UNIT;
    static __device__ __forceinline__ void to_f16x4(unsigned int w, unsigned int& lo,
                                                    unsigned int& hi) {
        if constexpr (E5M2) {
            lo = __byte_perm(w, 0u, 0x1404u);  // byte 0 -> bits 8-15, byte 1 -> bits 24-31
            hi = __byte_perm(w, 0u, 0x3424u);
        } else {
            e4m3x4_to_f16x4(w, lo, hi);
        }
    }
    // bytes i and j of w as an f16 pair (i's in the low half), in units of F16_UNIT
    static __device__ __forceinline__ unsigned int pair_f16(unsigned int w, int i, int j) {
        unsigned int lo, hi;
        to_f16x4(__byte_perm(w, 0u, (unsigned int)(i | (j << 4))), lo, hi);
        return lo;
    }
    static __device__ __forceinline__ unsigned int enc1(float x) {
        if constexpr (E5M2) {
            return f2e5m2(x);
        } else {
            return f2e4m3(x);
        }
    }
    // four bf16 values (two words, lowest first) times inv as four stored bytes in a word
    static __device__ __forceinline__ unsigned int enc4(unsigned int a, unsigned int b,
                                                        float inv) {
        return enc1(__uint_as_float(a << 16) * inv) |
               (enc1(__uint_as_float(a & 0xffff0000u) * inv) << 8) |
               (enc1(__uint_as_float(b << 16) * inv) << 16) |
               (enc1(__uint_as_float(b & 0xffff0000u) * inv) << 24);
    }
    static __device__ __forceinline__ Raw8 load8(const T* p) { return *(const uint2*)p; }
    static __device__ __forceinline__ Raw8 zero8() { return make_uint2(0u, 0u); }
    static __device__ __forceinline__ void unpack(Raw8 v, float* f) {
        dec4(v.x, f);
        dec4(v.y, f + 4);
    }
    static __device__ __forceinline__ uint4 to_bf16x8(Raw8 v) {
        float f[8];
        unpack(v, f);
        return pack8(f);  // exact: every FP8 value is a bf16 value
    }
    static __device__ __forceinline__ T enc(bf16_t x, float inv) {
        return (T)enc1(bf2f(x) * inv);
    }
    static __device__ __forceinline__ float dec(T x) {
        float f[4];
        dec4((unsigned int)x, f);
        return f[0];
    }
    static __device__ __forceinline__ void store4(T* p, uint2 v, float inv) {
        *(unsigned int*)p = enc4(v.x, v.y, inv);
    }
    static __device__ __forceinline__ void store8(T* p, uint4 v, float inv) {
        *(uint2*)p = make_uint2(enc4(v.x, v.y, inv), enc4(v.z, v.w, inv));
    }
};

typedef KvFp8<false> KvE4m3;
typedef KvFp8<true> KvE5m2;
