// The grouped weight formats (MXFP4, int8, int4: codes in groups of 32
// values, one scale a group; int8/int4 one a 32 << GemvSegs::scale_shift
// values) as the GEMV kernels read them, and the rounding of x to integer
// codes that their integer-activation kernels share (gemv_grouped.cu's
// `_qx` kernels and gemv_grouped_stream.cu). Put in front of both files
// (src/compile.rs), after gemv_common.cuh. Formats only: no kernel here.

// Widening codes to f32 without int-to-float conversions, which run at a
// quarter of the FMA rate and would bound these kernels: a small integer
// n placed in the mantissa of 2^23 (bits 0x4B000000 | n) is the float
// 2^23 + n, and one exact subtraction leaves n.
#define MAGIC 8388608.0f  // 2^23

// An int in (−2²², 2²²) as a float, exactly, without the quarter-rate
// conversion: the float 1.5 · 2²³ + n less 1.5 · 2²³.
__device__ __forceinline__ float small_int_to_float(int n) {
    return __int_as_float(n + 0x4B400000) - 12582912.0f;
}

// The PTX leaves (the CPU emulation, TS_EMULATED, defines its own:
// tests/emulate/cuda_shim.h).
#ifndef TS_EMULATED
// Σ of the four signed byte products of a and b, plus c.
__device__ __forceinline__ int dp4a(u32 a, u32 b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Σ of the two signed 16-bit halves of a times bytes 0, 1 (lo) or 2, 3 (hi)
// of b, plus c.
__device__ __forceinline__ int dp2a_lo(u32 a, u32 b, int c) {
    int r;
    asm("dp2a.lo.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

__device__ __forceinline__ int dp2a_hi(u32 a, u32 b, int c) {
    int r;
    asm("dp2a.hi.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// The bytes of (a, b) chosen by the low 16 bits of `sel` as PTX's prmt
// has it: bits 0-2 of a nibble pick a byte, bit 3 replicates its sign.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
#endif

// A 16-byte group's codes as four 32-bit words, in one load (MXFP4, int4).
__device__ __forceinline__ void fetch_group16(const u8* codes, u64 group, u32* w) {
    const uint4 v = ld_stream(codes + group * 16);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
}

// MXFP4: 16 bytes of E2M1 codes a group (byte j: values 2j low nibble,
// 2j + 1 high nibble), one E8M0 scale byte. A code is a sign bit and a
// 3-bit magnitude index into {0, .5, 1, 1.5, 2, 3, 4, 6}; twice those are
// the bytes {0, 1, 2, 3, 4, 6, 8, 12}, which one byte-permute looks up for
// four codes at once. `widen` returns twice each value (exact), and
// `scale` returns half the E8M0 scale (exact: a power of two), so each
// product is the same float.
struct Mxfp4 {
    typedef u32 Word;
    static constexpr int UNROLL = 4;
    static constexpr int GROUP_BYTES = 16;  // codes a group
    static __device__ __forceinline__ Word fetch(const u8* codes, u64 group, u32 sub) {
        return ld_stream_u32((const u32*)codes + group * 4 + sub);
    }
    static __device__ __forceinline__ void widen(Word q, float* o) {
        const u32 twice_lo = 0x03020100u, twice_hi = 0x0C080604u;
        const u32 mags[2] = {__byte_perm(twice_lo, twice_hi, q & 0x7777u),
                             __byte_perm(twice_lo, twice_hi, (q >> 16) & 0x7777u)};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            // Bytes [magnitude, 0, 0, 0x4B]: the float 2^23 + magnitude.
            const u32 bits = __byte_perm(mags[i >> 2], 0x4B000000u, 0x7440u | (i & 3));
            const float twice = __uint_as_float(bits) - MAGIC;
            const u32 sign = (q << (28 - 4 * i)) & 0x80000000u;  // code bit 3
            o[i] = __uint_as_float(__float_as_uint(twice) | sign);
        }
    }
    // Twice the 8 values as bytes (natural order), dotted with 8 int16 x
    // codes: MXFP4 is the format as released, so rounding x is the only
    // error against the reference and it gets 16 bits (two-way dp2a).
    typedef uint4 XWord;
    static constexpr int X_MAX = 32767;
    static constexpr bool SPLIT = false;
    // The bytes are twice the value plus ZERO (4 .. 28), so the kernel
    // takes ZERO · Σ x codes off each group's sum.
    static constexpr int ZERO = 16;
    static __device__ __forceinline__ int dot_x(Word q, XWord xw, int acc) {
        // The magnitudes {0, 1, 2, 3, 4, 6, 8, 12} (twice the E2M1
        // values) looked up by the codes themselves with prmt, which reads
        // a selector nibble's bit 3 as "replicate the selected byte's sign"
        // (0 here): positive codes (bit 3 clear) give their magnitude and
        // negative ones 0, and with the sign bits flipped the other way
        // round. pos + ZERO − neg is then each byte's value plus ZERO, in
        // 4 .. 28, so no byte borrows from the next.
        const u32 lo = 0x03020100u, hi = 0x0C080604u, zero = 0x10101010u;
        const u32 flip = q ^ 0x88888888u;
        const u32 w0 = prmt(lo, hi, q) + zero - prmt(lo, hi, flip);
        const u32 w1 = prmt(lo, hi, q >> 16) + zero - prmt(lo, hi, flip >> 16);
        return dp2a_hi(xw.w, w1, dp2a_lo(xw.z, w1, dp2a_hi(xw.y, w0, dp2a_lo(xw.x, w0, acc))));
    }
    // A whole group's codes (4 Words) in one 16-byte load.
    static __device__ __forceinline__ void fetch_group(const u8* codes, u64 group, Word* w) {
        fetch_group16(codes, group, w);
    }
    // A group's integer sum, |n| ≤ 32 · 12 · 32767 < 2²⁴: exact as a float
    // (one conversion a group and row).
    static __device__ __forceinline__ float to_float(int n) { return __int2float_rn(n); }
    // A group's scale is fetched raw with its codes and widened when used:
    // a branch on a just-loaded value would make each load wait for the
    // previous one instead of all of a step's loads being in flight.
    typedef u32 Scale;
    static __device__ __forceinline__ Scale scale(const void* scales, u64 group) {
        return ((const u8*)scales)[group];
    }
    // Half of e8m0(s): 2^(s − 128), exactly (s = 0 and 1 are the subnormals
    // 2^−128 and 2^−127; 255 stays inf, as e8m0 has it). Selects only.
    static __device__ __forceinline__ float value(Scale s) {
        const u32 bits = s >= 2 ? (s - 1) << 23 : 0x00200000u << s;
        return __uint_as_float(s == 255 ? 0x7f800000u : bits);
    }
};

// The --quant formats' scales: one f16 a scale group (by default a code
// group: llama.cpp's Q8_0/Q4_0 bytes), fetched raw like MXFP4's and
// widened exactly when used. `index` is the scale's own (the callers
// shift a code group's index: gemv_grouped.cu's scale_of).
struct F16Scales {
    typedef u16 Scale;
    static __device__ __forceinline__ Scale scale(const void* scales, u64 index) {
        return ((const u16*)scales)[index];
    }
    static __device__ __forceinline__ float value(Scale s) { return f16_to_f32(s); }
};

// Int8 (weight-only --quant): 32 signed bytes a group, f16 scales.
struct Q8 : F16Scales {
    typedef uint2 Word;
    static constexpr int UNROLL = 4;
    static constexpr int GROUP_BYTES = 32;  // codes a group
    static __device__ __forceinline__ Word fetch(const u8* codes, u64 group, u32 sub) {
        return ld_stream_u64((const uint2*)codes + group * 4 + sub);
    }
    static __device__ __forceinline__ void widen(Word q, float* o) {
        // Byte b holds the code c = b − 256·[b ≥ 128]; b ^ 0x80 = c + 128.
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o[i] = __uint_as_float(((q.x >> (8 * i)) & 0xffu) ^ 0x4B000080u) - (MAGIC + 128.0f);
            o[4 + i] = __uint_as_float(((q.y >> (8 * i)) & 0xffu) ^ 0x4B000080u) - (MAGIC + 128.0f);
        }
    }
    typedef uint2 XWord;
    static constexpr int X_MAX = 127;
    static constexpr bool SPLIT = false;
    static constexpr int ZERO = 0;
    static __device__ __forceinline__ int dot_x(Word q, XWord xw, int acc) {
        return dp4a(q.x, xw.x, dp4a(q.y, xw.y, acc));
    }
    // A whole group's codes (4 Words) in two 16-byte loads.
    static __device__ __forceinline__ void fetch_group(const u8* codes, u64 group, Word* w) {
        const uint4 a = ld_stream(codes + group * 32), b = ld_stream(codes + group * 32 + 16);
        w[0] = make_uint2(a.x, a.y); w[1] = make_uint2(a.z, a.w);
        w[2] = make_uint2(b.x, b.y); w[3] = make_uint2(b.z, b.w);
    }
    // |n| ≤ 32 · 128 · 127 < 2²²: exact through small_int_to_float.
    static __device__ __forceinline__ float to_float(int n) { return small_int_to_float(n); }
};

// Int4 (weight-only --quant): 16 bytes a group of value + 8 codes (low
// nibble first), f16 scales.
struct Q4 : F16Scales {
    typedef u32 Word;
    static constexpr int UNROLL = 4;
    static constexpr int GROUP_BYTES = 16;  // codes a group
    static __device__ __forceinline__ Word fetch(const u8* codes, u64 group, u32 sub) {
        return ld_stream_u32((const u32*)codes + group * 4 + sub);
    }
    static __device__ __forceinline__ void widen(Word q, float* o) {
        // Nibble i is value i: the float 2^23 + n, less 2^23 + 8.
#pragma unroll
        for (int i = 0; i < 8; i++) {
            o[i] = __uint_as_float(((q >> (4 * i)) & 0xfu) | 0x4B000000u) - (MAGIC + 8.0f);
        }
    }
    // The low nibbles are values 0, 2, 4, 6 and the high ones 1, 3, 5, 7:
    // x codes come split the same way (SPLIT). Codes are value + ZERO, so
    // the kernel takes ZERO · Σ x codes off each group's sum.
    typedef uint2 XWord;
    static constexpr int X_MAX = 127;
    static constexpr bool SPLIT = true;
    static constexpr int ZERO = 8;
    static __device__ __forceinline__ int dot_x(Word q, XWord xw, int acc) {
        return dp4a(q & 0x0F0F0F0Fu, xw.x, dp4a((q >> 4) & 0x0F0F0F0Fu, xw.y, acc));
    }
    static __device__ __forceinline__ void fetch_group(const u8* codes, u64 group, Word* w) {
        fetch_group16(codes, group, w);
    }
    // |n| ≤ 32 · 15 · 127 before the zero point is taken off: exact.
    static __device__ __forceinline__ float to_float(int n) { return small_int_to_float(n); }
};


// Grouped formats with integer activations (Precision::Bf16, one row of x
// per job): widening each code to f32 and one FMA per value is what bounds
// the kernels above; here a block first rounds its x row to integer codes
// in shared memory, per 32-value group (the weights' groups) with one f32
// step d = amax / X_MAX, so every 8 values of a row are two dp4a (int8 x)
// or four dp2a (int16 x) and the group's sum is exact in integers:
//   out[r] = Σ_groups (scale_w · d) · Σ_{32} code_w · code_x.
// int8 x (the --quant int8/int4 formats, whose own weight rounding is far
// larger) is an error of at most d / 2 a value, ~0.4% of the group's
// largest; int16 x (MXFP4, the released format) ~2e-5 of it.
// Precision::F32 keeps the f32 kernels. Non-finite x make the group's d
// NaN (or inf), so they reach the output as the f32 path would.
//
// Layout: each lane takes whole groups (one 16-byte load of a row's codes,
// two for int8) of GR = 4 rows at once, a warp 32 consecutive groups a
// step, so a load instruction moves 512 bytes of a row and a group's x
// codes, read once, serve four rows: few instructions a weight byte, which
// is what bounds these kernels once the bytes are in flight.
//
// Shared memory (dynamic, k · (bytes a code + 1/8) bytes): the x codes, 8
// to an XWord in the order the format pairs them with its codes (natural,
// or for int4 the even values then the odd ones), chunk-major (chunk j of
// every group, then chunk j + 1: a warp's lanes read consecutive words),
// then one d per group.


#ifndef TS_EMULATED
// max that propagates NaN (fmaxf drops it).
__device__ __forceinline__ float max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
#endif

// Σ of an XWord's eight codes, plus acc.
__device__ __forceinline__ int x_sum(const uint2& x, int acc) {
    return dp4a(x.x, 0x01010101u, dp4a(x.y, 0x01010101u, acc));
}

__device__ __forceinline__ int x_sum(const uint4& x, int acc) {
    const u32 ones = 0x01010101u;
    return dp2a_lo(x.x, ones, dp2a_lo(x.y, ones, dp2a_lo(x.z, ones, dp2a_lo(x.w, ones, acc))));
}

// Eight codes (their low bytes or halves) in one XWord, in this order.
__device__ __forceinline__ void pack_x(uint2& o, const int* n) {
    o.x = __byte_perm(__byte_perm(n[0], n[1], 0x0040), __byte_perm(n[2], n[3], 0x0040), 0x5410);
    o.y = __byte_perm(__byte_perm(n[4], n[5], 0x0040), __byte_perm(n[6], n[7], 0x0040), 0x5410);
}

__device__ __forceinline__ void pack_x(uint4& o, const int* n) {
    o.x = __byte_perm(n[0], n[1], 0x5410);
    o.y = __byte_perm(n[2], n[3], 0x5410);
    o.z = __byte_perm(n[4], n[5], 0x5410);
    o.w = __byte_perm(n[6], n[7], 0x5410);
}

// Rounds one k-wide f32 row to codes and steps (see above); the block's
// first `threads` threads (whole warps) take part. A thread takes 8
// values, four threads a group (so the group max is two shuffles). With a
// fused norm (`norm` non-null) it rounds w_norm · x instead and returns this
// thread's part of Σ x²: the norm's factor r is common to every value, so
// the codes are the same and r scales the row's sum when it is stored.
// QC chunks a thread are loaded before any is rounded, so a row takes
// ⌈k / (8 · QC · threads)⌉ round trips to L2: without a norm 8 (the down
// projection's 14,336 values in one, not two: Llama-8B int4's down launch
// 0.6 µs shorter alone), with one 4 (its weights are as many registers
// again, and a norm's row, the hidden size, fits one round at 4).
template <class F, int QC>
__device__ __forceinline__ float quantize_rounds(const float* xr, u32 k, typename F::XWord* xq,
                                                 float* xd, const void* norm, int norm_dt,
                                                 u32 threads) {
    float ss = 0.0f;
    const u32 chunks = k / 8;  // a multiple of 4: whole groups per 4 lanes
    for (u32 base = 0; base < chunks; base += QC * threads) {
        float4 lo[QC], hi[QC];
        float nw[QC][8];  // the norm's weights, loaded with x
#pragma unroll
        for (int r = 0; r < QC; r++) {
            // Slots past the row are left out whole (the same for every
            // thread: the shuffles below stay in step), so a short row
            // pays for the chunks it has, not for QC.
            if (base + r * threads >= chunks) break;
            const u32 c = base + r * threads + threadIdx.x;
            if (c < chunks) {
                lo[r] = ((const float4*)xr)[2 * c];
                hi[r] = ((const float4*)xr)[2 * c + 1];
                if (norm) load_w8(norm, norm_dt, 8 * c, nw[r]);
            } else {
                lo[r] = hi[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
#pragma unroll
        for (int r = 0; r < QC; r++) {
            if (base + r * threads >= chunks) break;
            const u32 c = base + r * threads + threadIdx.x;
            float v[8] = {lo[r].x, lo[r].y, lo[r].z, lo[r].w, hi[r].x, hi[r].y, hi[r].z, hi[r].w};
            if (norm && c < chunks) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    ss += v[i] * v[i];
                    v[i] *= nw[r][i];
                }
            }
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) amax = max_nan(amax, fabsf(v[i]));
            amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
            // 0 for NaN (codes 0; d carries the NaN).
            const float inv = amax > 0.0f ? (float)F::X_MAX / amax : 0.0f;
            int n[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                // SPLIT: the even values, then the odd ones.
                const int from = F::SPLIT ? (i < 4 ? 2 * i : 2 * (i - 4) + 1) : i;
                n[i] = __float2int_rn(v[from] * inv);
            }
            if (c >= chunks) continue;
            pack_x(xq[(c & 3u) * (k / 32) + c / 4], n);  // chunk c % 4 of group c / 4
            if ((c & 3u) == 0) xd[c / 4] = amax * (1.0f / (float)F::X_MAX);
        }
    }
    return ss;
}

template <class F>
__device__ __forceinline__ float quantize_x(const float* xr, u32 k, typename F::XWord* xq,
                                            float* xd, const GemvSegs& sg, u32 threads) {
    if (sg.norm) return quantize_rounds<F, 4>(xr, k, xq, xd, sg.norm, sg.norm_dt, threads);
    return quantize_rounds<F, 8>(xr, k, xq, xd, nullptr, 0, threads);
}
