// Grouped formats (MXFP4, int8, int4): 32 values and one scale per group.
// A weight byte here stands for 2-4 values, so x (f32) is 8-16 times the
// bytes of the weights it meets: reading x is what limits these kernels
// unless it is shared. Layout: each warp computes GR = 4 rows at once and
// four lanes share a group, each taking 8 of its values (a 4-byte word of
// MXFP4/int4 codes, 8 bytes of int8), so the warp's x reads are contiguous
// (coalesced) and each x value loaded is used for GR rows. A block is 8
// warps; W = `wpr` warps split a row quad's groups round-robin and meet in
// shared memory. Per lane: acc += scale · (8-value dot) — the CPU sums a
// group unscaled before scaling, so results differ by rounding order only.
#define GR 4

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

// The --quant formats' scales: one f16 a group (llama.cpp's Q8_0/Q4_0
// bytes), fetched raw like MXFP4's and widened exactly when used.
struct F16Scales {
    typedef u16 Scale;
    static __device__ __forceinline__ Scale scale(const void* scales, u64 group) {
        return ((const u16*)scales)[group];
    }
    static __device__ __forceinline__ float value(Scale s) { return f16_to_f32(s); }
};

// Int8 (weight-only --quant): 32 signed bytes a group, one f16 scale.
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
// nibble first), one f16 scale.
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

// acc[i][t] += s[i] · Σ_{8 values} w_i · x_t for one step of one lane.
template <int NX, class F>
__device__ __forceinline__ void grouped_step(const typename F::Word* raw,
                                             const typename F::Scale* s,
                                             const float* xp, u32 nx, u64 k,
                                             float (*acc)[NX]) {
#pragma unroll
    for (u32 t = 0; t < NX; t++) {
        if (t < nx) {
            const float4 a = ((const float4*)(xp + t * k))[0];
            const float4 b = ((const float4*)(xp + t * k))[1];
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < GR; i++) {
                float wv[8];
                F::widen(raw[i], wv);
                float d = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) d += wv[j] * xv[j];
                acc[i][t] += F::value(s[i]) * d;
            }
        }
    }
}

// The row quad a warp of a grouped kernel computes: rows r0 .. r0 + GR of
// segment `seg` (r0 = m past the last segment: nothing is computed).
struct Quad {
    u32 lane, warp, part, m, r0;
    const u8* codes;
    const void* scales;
    const void* bias;
    float* out;
    u64 e;      // expert of this job (0 without experts)
    u64 g0[GR];  // each row's first group; rows past m read the last row
};

// `vb`: the block of work (blockIdx.y, or a persistent block's turn).
__device__ __forceinline__ Quad quad_of(const GemvSegs& sg, const int* experts, u32 k, u32 wpr,
                                        u32 vb) {
    Quad d;
    d.lane = threadIdx.x & 31u;
    d.warp = threadIdx.x >> 5;
    d.part = d.warp % wpr;
    u32 seg = 0, r0 = 0;
    const bool any = seg_of(sg, (vb * ((blockDim.x >> 5) / wpr) + d.warp / wpr) * GR, GR, seg, r0);
    d.m = pick(sg.m, seg);
    d.r0 = any ? r0 : d.m;
    d.codes = (const u8*)pick(sg.w, seg);
    d.scales = pick(sg.scales, seg);
    d.bias = pick(sg.bias, seg);
    d.out = pick(sg.out, seg);
    d.e = experts ? (u64)experts[blockIdx.x] : 0;
    const u32 groups = k / 32;
#pragma unroll
    for (int i = 0; i < GR; i++) {
        d.g0[i] = (d.e * d.m + glu_row(sg, d.m, min(d.r0 + i, d.m - 1))) * groups;
    }
    return d;
}

// The warps that exchange partial sums in grouped_store: a row quad's W
// warps, and with GLU_SEGS the neighbouring gate and up quads' (2·W). They
// meet at a barrier of their own (named barrier 1 + team), not the
// block's: a block-wide barrier each turn would hold every warp to the
// slowest warp's loads, and the warps' loads are what keeps DRAM busy.
__device__ __forceinline__ u32 team_warps(const GemvSegs& sg, u32 wpr) {
    return glu_segs(sg) ? 2 * wpr : wpr;
}

__device__ __forceinline__ void team_sync(const GemvSegs& sg, u32 wpr) {
    const u32 t = team_warps(sg, wpr);
    if (t > 1) {
        asm volatile("bar.sync %0, %1;" ::"r"(1 + (threadIdx.x >> 5) / t), "r"(32 * t) : "memory");
    }
}

// Sums each row's partials over the lanes, then over the quad's W warps in
// warp order, and stores them (with the bias) from the quad's first lane;
// a glu launch's quad is two (gate, up) pairs, whose activations it writes.
template <int NX>
__device__ __forceinline__ void grouped_store(const GemvSegs& sg, float (*acc)[NX], const Quad& d,
                                              int bias_dt, u32 nx, u32 wpr, float r,
                                              bool accumulate) {
    __shared__ float part_sum[8][GR][NX];
#pragma unroll
    for (int i = 0; i < GR; i++) {
#pragma unroll
        for (u32 t = 0; t < NX; t++) acc[i][t] = warp_sum(acc[i][t]);
    }
    if (wpr > 1) {
        if (d.lane == 0) {
#pragma unroll
            for (int i = 0; i < GR; i++) {
#pragma unroll
                for (u32 t = 0; t < NX; t++) part_sum[d.warp][i][t] = acc[i][t];
            }
        }
        team_sync(sg, wpr);
        if (d.part == 0) {
#pragma unroll
            for (int i = 0; i < GR; i++) {
#pragma unroll
                for (u32 t = 0; t < NX; t++) {
                    float v = part_sum[d.warp][i][t];
                    for (u32 w = 1; w < wpr; w++) v += part_sum[d.warp + w][i][t];
                    acc[i][t] = v;
                }
            }
        }
    }
    const u32 job = blockIdx.x;
    if (glu_segs(sg)) {
        // Gate quad c and up quad c are neighbouring warps' (GLU_SEGS):
        // their first lanes meet in shared memory, and the gate's writes
        // the four activations (NX = 1: one row of x with a fused norm).
        __shared__ float pair[8][GR];
        const u32 slot = d.warp / wpr;
        const bool first = d.part == 0 && d.lane == 0;
        if (first) {
#pragma unroll
            for (int i = 0; i < GR; i++) {
                const u32 row = min(d.r0 + i, d.m - 1);
                pair[slot][i] = out_value(acc[i][0], r, d.bias, bias_dt, d.e * d.m + row);
            }
        }
        team_sync(sg, wpr);
        if (!first || (slot & 1u)) return;
#pragma unroll
        for (int i = 0; i < GR; i++) {
            const u32 row = d.r0 + i;
            if (row < d.m) {
                d.out[(u64)job * d.m + row] = glu_value(sg, pair[slot][i], pair[slot + 1][i]);
            }
        }
        return;
    }
    if (d.part != 0 || d.lane != 0) return;
    if (sg.glu) {
#pragma unroll
        for (int i = 0; i < GR; i += 2) {
            const u32 row = d.r0 + i;  // gate; row + 1 is its up (m is even)
            if (row >= d.m) break;
#pragma unroll
            for (u32 t = 0; t < NX; t++) {
                if (t < nx) {
                    const float g = out_value(acc[i][t], r, d.bias, bias_dt,
                                              d.e * d.m + glu_row(sg, d.m, row));
                    const float u = out_value(acc[i + 1][t], r, d.bias, bias_dt,
                                              d.e * d.m + glu_row(sg, d.m, row + 1));
                    d.out[((u64)job * nx + t) * (d.m / 2) + row / 2] = glu_value(sg, g, u);
                }
            }
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < GR; i++) {
        const u32 row = d.r0 + i;
        if (row >= d.m) break;
#pragma unroll
        for (u32 t = 0; t < NX; t++) {
            if (t < nx) {
                store_out(&d.out[((u64)job * nx + t) * d.m + row], acc[i][t], r, d.bias, bias_dt,
                          d.e * d.m + row, accumulate);
            }
        }
    }
}

template <int NX, class F>
__device__ __forceinline__ void gemv_grouped(const GemvSegs& sg, const float* x, int bias_dt,
                                             const int* experts, u32 nx, u32 x_div, u32 k,
                                             u32 wpr) {
    pdl_enter();
    const Quad d = quad_of(sg, experts, k, wpr, blockIdx.y);
    const u32 groups = k / 32, sub = d.lane & 3u;
    const float* xb = x + (u64)(blockIdx.x / x_div) * nx * k;
    float acc[GR][NX];
#pragma unroll
    for (int i = 0; i < GR; i++) {
#pragma unroll
        for (u32 t = 0; t < NX; t++) acc[i][t] = 0.0f;
    }
    if (d.r0 < d.m) {
        const u32 step = 8 * wpr;  // groups a step of the row quad's warps covers
        u32 q = d.part * 8 + (d.lane >> 2);
        constexpr int U = F::UNROLL;
        for (; q + (U - 1) * step < groups; q += U * step) {
            typename F::Word raw[U][GR];
            typename F::Scale s[U][GR];
#pragma unroll
            for (int u = 0; u < U; u++) {
#pragma unroll
                for (int i = 0; i < GR; i++) {
                    raw[u][i] = F::fetch(d.codes, d.g0[i] + q + u * step, sub);
                    s[u][i] = F::scale(d.scales, d.g0[i] + q + u * step);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                grouped_step<NX, F>(raw[u], s[u], xb + (u64)(q + u * step) * 32 + 8 * sub, nx, k, acc);
            }
        }
        // The last steps one at a time: fetching them together (as the
        // integer-activation kernel does) makes the one-row variants spill.
        for (; q < groups; q += step) {
            typename F::Word raw[GR];
            typename F::Scale s[GR];
#pragma unroll
            for (int i = 0; i < GR; i++) {
                raw[i] = F::fetch(d.codes, d.g0[i] + q, sub);
                s[i] = F::scale(d.scales, d.g0[i] + q);
            }
            grouped_step<NX, F>(raw, s, xb + (u64)q * 32 + 8 * sub, nx, k, acc);
        }
    }
    grouped_store<NX>(sg, acc, d, bias_dt, nx, wpr, 1.0f, sg.accumulate != 0);
}

// The E2M1 lookup needs more registers: three blocks per SM.
GEMV_KERNELS(gemv_mxfp4, gemv_grouped, Mxfp4, 3)
GEMV_KERNELS(gemv_q8, gemv_grouped, Q8, 4)
GEMV_KERNELS(gemv_q4, gemv_grouped, Q4, 4)

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

// max that propagates NaN (fmaxf drops it).
__device__ __forceinline__ float max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

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

// Rounds one k-wide f32 row to codes and steps (see above); every thread
// of the block takes part. A thread takes 8 values, four threads a group
// (so the group max is two shuffles). With a fused norm (`norm` non-null)
// it rounds w_norm · x instead and returns this thread's part of Σ x²: the
// norm's factor r is common to every value, so the codes are the same and
// r scales the row's sum when it is stored.
template <class F>
__device__ __forceinline__ float quantize_x(const float* xr, u32 k, typename F::XWord* xq,
                                            float* xd, const GemvSegs& sg) {
    const void* norm = sg.norm;
    float ss = 0.0f;
    const u32 chunks = k / 8;  // a multiple of 4: whole groups per 4 lanes
    // QC chunks a thread are loaded before any is rounded: a wide row (the
    // down projection's 14,336 values) then takes two round trips to L2,
    // not seven.
    constexpr int QC = 4;
    for (u32 base = 0; base < chunks; base += QC * blockDim.x) {
        float4 lo[QC], hi[QC];
        float nw[QC][8];  // the norm's weights, loaded with x
#pragma unroll
        for (int r = 0; r < QC; r++) {
            const u32 c = base + r * blockDim.x + threadIdx.x;
            if (c < chunks) {
                lo[r] = ((const float4*)xr)[2 * c];
                hi[r] = ((const float4*)xr)[2 * c + 1];
                if (norm) load_w8(norm, sg.norm_dt, 8 * c, nw[r]);
            } else {
                lo[r] = hi[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
#pragma unroll
        for (int r = 0; r < QC; r++) {
            const u32 c = base + r * blockDim.x + threadIdx.x;
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

// A lane's group in each of the GR rows, raw: codes and scales.
template <class F>
struct GroupWords {
    typename F::Word w[GR][4];
    typename F::Scale s[GR];
    __device__ __forceinline__ void fetch(const Quad& d, u32 q) {
#pragma unroll
        for (int i = 0; i < GR; i++) {
            F::fetch_group(d.codes, d.g0[i] + q, w[i]);
            s[i] = F::scale(d.scales, d.g0[i] + q);
        }
    }
    // The lines `fetch` will read, into L2.
    static __device__ __forceinline__ void prefetch(const Quad& d, u32 q) {
#pragma unroll
        for (int i = 0; i < GR; i++) {
            prefetch_l2(d.codes + (d.g0[i] + q) * F::GROUP_BYTES);
            prefetch_l2((const u8*)d.scales + (d.g0[i] + q) * sizeof(typename F::Scale));
        }
    }
};

// Groups a lane has in flight at once (GR rows each). Four (the row's rest
// two at a time, no spills) measured slower on the H200 in alternating
// processes: Llama-8B int4 381 -> 364 tok/s, int8 272 -> 264, gpt-oss-20b
// 433 -> 421.
#define QX_UNROLL 2

template <class F>
__device__ __forceinline__ void gemv_grouped_qx(const GemvSegs& sg, const float* x, int bias_dt,
                                                const int* experts, u32 nx, u32 x_div, u32 k,
                                                u32 wpr) {
    typedef typename F::XWord XWord;
    extern __shared__ uint4 shared_x[];
    XWord* xq = (XWord*)shared_x;
    float* xd = (float*)(xq + k / 8);
    const u32 groups = k / 32, step = 32 * wpr;  // groups a step of a quad's warps covers
    constexpr int U = QX_UNROLL;
    // Weights do not depend on the previous kernel: the first turn's first
    // U steps are asked of L2 before waiting for it (programmatic
    // dependent launch; into L2, not registers, which the main loop needs),
    // unless experts (which it writes) pick the rows.
    if (experts == nullptr) {
        const Quad d = quad_of(sg, nullptr, k, wpr, blockIdx.y);  // r0 = m past the rows
        if (d.r0 < d.m) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const u32 q = d.part * 32 + d.lane + u * step;
                if (q < groups) GroupWords<F>::prefetch(d, q);
            }
        }
    }
    pdl_enter();
    const float* xr = x + (u64)(blockIdx.x / x_div) * k;
    const float ss = quantize_x<F>(xr, k, xq, xd, sg);
    __shared__ float parts[8];
    if (sg.norm) norm_part(ss, parts);
    __syncthreads();  // the codes (and the norm's parts) complete
    const float r = sg.norm ? norm_factor(sg, parts, blockDim.x >> 5, k, xr) : 1.0f;
    // Persistent: this block takes blocks of work blockIdx.y, + gridDim.y,
    // ... of the job, reusing the rounded x (the same count for every warp
    // of the block, so the exchange in grouped_store stays in step).
    u32 quads = 0;
#pragma unroll
    for (u32 i = 0; i < GEMV_MAX_SEGS; i++) {
        if (i < sg.count) quads += (pick(sg.m, i) + GR - 1) / GR;
    }
    const u32 per_block = (blockDim.x >> 5) / wpr;
    const u32 work = (quads + per_block - 1) / per_block;
    for (u32 vb = blockIdx.y; vb < work; vb += gridDim.y) {
        const Quad d = quad_of(sg, experts, k, wpr, vb);
        float acc[GR][1];
#pragma unroll
        for (int i = 0; i < GR; i++) acc[i][0] = 0.0f;
        // Group q of the GR rows. Its x codes are read once; with a zero
        // point (int4, MXFP4) the group's sum takes ZERO · Σ x codes off.
        auto group_at = [&](const GroupWords<F>& g, u32 q) {
            XWord xw[4];
#pragma unroll
            for (int j = 0; j < 4; j++) xw[j] = xq[j * groups + q];
            const float xs = xd[q];
            int xoff = 0;
            if (F::ZERO) {
#pragma unroll
                for (int j = 0; j < 4; j++) xoff = x_sum(xw[j], xoff);
                xoff *= F::ZERO;
            }
#pragma unroll
            for (int i = 0; i < GR; i++) {
                int n = -xoff;
#pragma unroll
                for (int j = 0; j < 4; j++) n = F::dot_x(g.w[i][j], xw[j], n);
                acc[i][0] += (F::value(g.s[i]) * xs) * F::to_float(n);
            }
        };
        if (d.r0 < d.m) {
            // The main loop runs while every lane's U steps lie in the row
            // (a count the warp shares, so its lanes never split between
            // the loops); the rest of the row, at most U steps, is also in
            // flight at once, in a block of its own so that the main loop
            // keeps its registers.
            const u32 first = d.part * 32, span = 32 + (U - 1) * step;
            const u32 full = groups >= first + span ? (groups - first - span) / (U * step) + 1 : 0;
            u32 q = first + d.lane;
            for (u32 it = 0; it < full; it++, q += U * step) {
                GroupWords<F> raw[U];
#pragma unroll
                for (int u = 0; u < U; u++) raw[u].fetch(d, q + u * step);
#pragma unroll
                for (int u = 0; u < U; u++) group_at(raw[u], q + u * step);
            }
            if (q < groups) {
                GroupWords<F> raw[U];
#pragma unroll
                for (int u = 0; u < U; u++) raw[u].fetch(d, q + u * step < groups ? q + u * step : q);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (q + u * step < groups) group_at(raw[u], q + u * step);
                }
            }
        }
        grouped_store<1>(sg, acc, d, bias_dt, 1, wpr, r, sg.accumulate != 0);
        team_sync(sg, wpr);  // the next turn rewrites the team's exchanges
    }
}

#define GEMV_QX_KERNEL(name, F, minb)                                                            \
    extern "C" __global__ void __launch_bounds__(256, minb) name(GEMV_ARGS) {                   \
        gemv_grouped_qx<F>(GEMV_PASS); /* calls pdl_enter */                                     \
    }

// Two blocks an SM: 16 warps with U groups of 4 rows each in flight. Three
// (80 registers) measured slower on the H200: Llama-8B int4 380 -> 358
// tok/s, int8 271 -> 243, gpt-oss-20b level.
GEMV_QX_KERNEL(gemv_mxfp4_qx, Mxfp4, 2)
GEMV_QX_KERNEL(gemv_q8_qx, Q8, 2)
GEMV_QX_KERNEL(gemv_q4_qx, Q4, 2)
