// Matrix-vector products for decode and for mixture-of-experts jobs:
//   out[job·nx + t, r] = Σ_c x[xrow(job)·nx + t, c] · W[e(job)·m + r, c] (+ bias[e·m + r])
// with xrow(job) = job / x_div and e(job) = experts[job] (0 when `experts`
// is null). A plain linear is one job with nx ≤ 4 rows of x, so each weight
// row is read once for all of them; an MoE layer is one job per (token,
// selected expert) with nx = 1.
//
// Layout: a block of 8 warps computes 8 / W output rows with W warps per
// row (W = `wpr`, 1, 2, 4 or 8; the host picks it so that small matrices
// still fill the GPU); grid = (jobs, ceil(m / (8 / W))). The W warps of a
// row take its 256-value chunks round-robin, and their partial sums meet
// in shared memory in warp order. Each lane reads 16 bytes of the weight
// row at a time (8 bf16/f16 values; 8 f32 as two 16-byte loads) when the
// row length allows aligned vectors, else one element at a time; grouped
// formats (MXFP4, int8, int4) take one 32-value group at a time.
//
// Decode is bound by how many weight bytes are in flight: each lane issues
// UNROLL loads of raw weight words (4 chunks of 16 bytes for the dense
// formats) before it widens any, and keeps only those words (not widened
// floats) in registers, so four blocks fit on an SM. Weights go through
// the non-caching read-only path (`ld_stream`); x is re-read from L1 by
// every warp. The grouped formats are described above their kernel.

#define GEMV_MAX_X 4
#define GEMV_MAX_SEGS 3

// Up to GEMV_MAX_SEGS matrices with the same input width and format, one
// launch for all (a layer's q, k and v; gate and up): their rows are laid
// end to end, each segment padded to a multiple of the rows a warp takes,
// so small matrices share the GPU instead of each leaving it half idle.
// `scales` is only read by the grouped formats; a null bias is none.
// Must match `GemvSegs` in src/linear.rs.
struct GemvSegs {
    const void* w[GEMV_MAX_SEGS];
    const void* scales[GEMV_MAX_SEGS];
    const void* bias[GEMV_MAX_SEGS];
    float* out[GEMV_MAX_SEGS];
    u32 m[GEMV_MAX_SEGS];
    u32 count;
};

// arr[i] for i < GEMV_MAX_SEGS with constant indices only: indexing the
// by-value parameter struct with a variable would copy it to local memory.
template <class T>
__device__ __forceinline__ T pick(const T (&arr)[GEMV_MAX_SEGS], u32 i) {
    return i == 0 ? arr[0] : i == 1 ? arr[1] : arr[2];
}

// The segment holding virtual row `v` (segments padded to `align` rows)
// and the row within it; false past the last segment.
__device__ __forceinline__ bool seg_of(const GemvSegs& sg, u32 v, u32 align, u32& seg, u32& r) {
#pragma unroll
    for (u32 i = 0; i < GEMV_MAX_SEGS; i++) {
        if (i < sg.count) {
            const u32 span = (sg.m[i] + align - 1) / align * align;
            if (v < span) {
                seg = i;
                r = v;
                return true;
            }
            v -= span;
        }
    }
    return false;
}

// A dense dtype's 8-value chunk: WORDS 16-byte words, fetched raw and
// widened exactly to f32 when used.
template <int DT>
struct Wt;

template <>
struct Wt<DT_F32> {
    static constexpr int WORDS = 2;
    static constexpr int UNROLL = 4;
    static __device__ __forceinline__ void fetch(const void* w, u64 i, uint4* r) {
        const float* p = (const float*)w + i;
        r[0] = ld_stream(p);
        r[1] = ld_stream(p + 4);
    }
    static __device__ __forceinline__ void widen(const uint4* r, float* o) {
        o[0] = __uint_as_float(r[0].x); o[1] = __uint_as_float(r[0].y);
        o[2] = __uint_as_float(r[0].z); o[3] = __uint_as_float(r[0].w);
        o[4] = __uint_as_float(r[1].x); o[5] = __uint_as_float(r[1].y);
        o[6] = __uint_as_float(r[1].z); o[7] = __uint_as_float(r[1].w);
    }
};

template <>
struct Wt<DT_BF16> {
    static constexpr int WORDS = 1;
    static constexpr int UNROLL = 4;
    static __device__ __forceinline__ void fetch(const void* w, u64 i, uint4* r) {
        r[0] = ld_stream((const u16*)w + i);
    }
    static __device__ __forceinline__ void widen(const uint4* r, float* o) {
        const u32 q[4] = {r[0].x, r[0].y, r[0].z, r[0].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {  // little endian: the lower address is the low half
            o[2 * j] = __uint_as_float(q[j] << 16);
            o[2 * j + 1] = __uint_as_float(q[j] & 0xffff0000u);
        }
    }
};

template <>
struct Wt<DT_F16> {
    static constexpr int WORDS = 1;
    static constexpr int UNROLL = 4;
    static __device__ __forceinline__ void fetch(const void* w, u64 i, uint4* r) {
        r[0] = ld_stream((const u16*)w + i);
    }
    static __device__ __forceinline__ void widen(const uint4* r, float* o) {
        const u32 q[4] = {r[0].x, r[0].y, r[0].z, r[0].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            o[2 * j] = f16_to_f32((u16)(q[j] & 0xffffu));
            o[2 * j + 1] = f16_to_f32((u16)(q[j] >> 16));
        }
    }
};

// Σ_{i<8} w[i] · x[i] for 8 consecutive (16-byte aligned) x values.
__device__ __forceinline__ float dot8(const float* w, const float* x) {
    const float4 a = ((const float4*)x)[0], b = ((const float4*)x)[1];
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
           w[6] * b.z + w[7] * b.w;
}

// Which output row this warp works on and which of the row's W warps it
// is. `valid` is false past the last row (such warps still take part in
// the block's shared-memory exchange).
struct GemvRow {
    u32 r, part, wpr, lane, m;
    const void* w;
    const void* bias;
    float* out;
    bool valid;
};

__device__ __forceinline__ GemvRow gemv_row(const GemvSegs& sg, u32 wpr) {
    GemvRow g;
    const u32 warp = threadIdx.x >> 5;
    g.lane = threadIdx.x & 31u;
    g.wpr = wpr;
    g.part = warp % wpr;
    u32 seg = 0, r = 0;
    g.valid = seg_of(sg, blockIdx.y * ((blockDim.x >> 5) / wpr) + warp / wpr, 1, seg, r);
    g.r = r;
    g.m = pick(sg.m, seg);
    g.w = pick(sg.w, seg);
    g.bias = pick(sg.bias, seg);
    g.out = pick(sg.out, seg);
    return g;
}

// Sums each x row's partials over the lanes and the row's W warps (in warp
// order) and writes them (with the bias) from the row's first lane.
template <int NX>
__device__ __forceinline__ void gemv_store(float* acc, int bias_dt, u64 e, u32 job, u32 nx,
                                           const GemvRow& g) {
    float* out = g.out;
    const void* bias = g.bias;
    const u32 m = g.m;
    __shared__ float part[8][NX];
#pragma unroll
    for (u32 t = 0; t < NX; t++) acc[t] = warp_sum(acc[t]);
    if (g.wpr > 1) {
        const u32 warp = threadIdx.x >> 5;
        if (g.lane == 0) {
#pragma unroll
            for (u32 t = 0; t < NX; t++) part[warp][t] = acc[t];
        }
        __syncthreads();
        if (g.part == 0) {
#pragma unroll
            for (u32 t = 0; t < NX; t++) {
                float s = part[warp][t];
                for (u32 w = 1; w < g.wpr; w++) s += part[warp + w][t];
                acc[t] = s;
            }
        }
    }
    if (!g.valid || g.part != 0 || g.lane != 0) return;
#pragma unroll
    for (u32 t = 0; t < NX; t++) {
        if (t < nx) {
            float s = acc[t];
            if (bias) s += load_w(bias, bias_dt, e * m + g.r);
            out[((u64)job * nx + t) * m + g.r] = s;
        }
    }
}

template <int NX, int DT>
__device__ __forceinline__ void gemv_dense(const GemvSegs& sg, const float* x, int bias_dt,
                                           const int* experts, u32 nx, u32 x_div, u32 k,
                                           u32 wpr) {
    const GemvRow g = gemv_row(sg, wpr);
    const void* w = g.w;
    const u32 m = g.m;
    const u32 job = blockIdx.x;
    const u64 e = experts ? (u64)experts[job] : 0;
    const u64 wrow = (e * m + (g.valid ? g.r : 0)) * k;
    const float* xb = x + (u64)(job / x_div) * nx * k;
    float acc[NX];
#pragma unroll
    for (int t = 0; t < NX; t++) acc[t] = 0.0f;
    if (g.valid && (k & 7u) == 0) {
        const u32 step = 256 * wpr;
        u32 c = (g.part * 32 + g.lane) * 8;
        // U chunks a step, all fetched before any is used; the per-lane
        // sum still runs over the chunks in ascending order.
        constexpr int U = Wt<DT>::UNROLL;
        for (; c + (U - 1) * step < k; c += U * step) {
            uint4 raw[U][Wt<DT>::WORDS];
#pragma unroll
            for (int u = 0; u < U; u++) Wt<DT>::fetch(w, wrow + c + u * step, raw[u]);
#pragma unroll
            for (int u = 0; u < U; u++) {
                float wv[8];
                Wt<DT>::widen(raw[u], wv);
#pragma unroll
                for (u32 t = 0; t < NX; t++) {
                    if (t < nx) acc[t] += dot8(wv, xb + (u64)t * k + c + u * step);
                }
            }
        }
        for (; c < k; c += step) {
            uint4 raw[Wt<DT>::WORDS];
            Wt<DT>::fetch(w, wrow + c, raw);
            float wv[8];
            Wt<DT>::widen(raw, wv);
#pragma unroll
            for (u32 t = 0; t < NX; t++) {
                if (t < nx) acc[t] += dot8(wv, xb + (u64)t * k + c);
            }
        }
    } else if (g.valid) {
        for (u32 c = g.part * 32 + g.lane; c < k; c += 32 * wpr) {
            const float wv = load_w(w, DT, wrow + c);
#pragma unroll
            for (u32 t = 0; t < NX; t++) {
                if (t < nx) acc[t] += wv * xb[(u64)t * k + c];
            }
        }
    }
    gemv_store<NX>(acc, bias_dt, e, job, nx, g);
}

#define GEMV_ARGS \
    GemvSegs sg, const float *x, int bias_dt, const int *experts, u32 nx, u32 x_div, u32 k, u32 wpr
#define GEMV_PASS sg, x, bias_dt, experts, nx, x_div, k, wpr

// Each kernel twice: `_x1` for one row of x (decode; its accumulators fit
// in registers with room for `minb` blocks per SM, which keeps enough weight
// bytes in flight), and the plain name for up to GEMV_MAX_X rows.
#define GEMV_KERNELS(name, body, T, minb)                                                        \
    extern "C" __global__ void __launch_bounds__(256, minb) name##_x1(GEMV_ARGS) {              \
        body<1, T>(GEMV_PASS);                                                                   \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(256, 2) name(GEMV_ARGS) {                      \
        body<GEMV_MAX_X, T>(GEMV_PASS);                                                          \
    }

GEMV_KERNELS(gemv_f32, gemv_dense, DT_F32, 4)
GEMV_KERNELS(gemv_bf16, gemv_dense, DT_BF16, 4)
GEMV_KERNELS(gemv_f16, gemv_dense, DT_F16, 4)

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
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        const u32 s = ((const u8*)scales)[group];
        // Half of e8m0(s): 2^(s − 128), exactly (s = 0 is 2^−128; 255
        // stays inf, as e8m0 has it).
        if (s == 255) return e8m0(s);
        return s == 0 ? __uint_as_float(0x00200000u)
                      : s == 1 ? __uint_as_float(0x00400000u) : __uint_as_float((s - 1) << 23);
    }
};

// Int8 (weight-only --quant): 32 signed bytes a group, one f32 scale.
struct Q8 {
    typedef uint2 Word;
    static constexpr int UNROLL = 4;
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
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        return ((const float*)scales)[group];
    }
};

// Int4 (weight-only --quant): 16 bytes a group of value + 8 codes (low
// nibble first), one f32 scale.
struct Q4 {
    typedef u32 Word;
    static constexpr int UNROLL = 4;
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
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        return ((const float*)scales)[group];
    }
};

// acc[i][t] += s[i] · Σ_{8 values} w_i · x_t for one step of one lane.
template <int NX, class F>
__device__ __forceinline__ void grouped_step(const typename F::Word* raw, const float* s,
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
                acc[i][t] += s[i] * d;
            }
        }
    }
}

template <int NX, class F>
__device__ __forceinline__ void gemv_grouped(const GemvSegs& sg, const float* x, int bias_dt,
                                             const int* experts, u32 nx, u32 x_div, u32 k,
                                             u32 wpr) {
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const u32 part = warp % wpr;
    // This warp's quad of rows: rows r0 .. r0 + GR of segment `seg` (none
    // past the last segment: then r0 = m and nothing is computed).
    u32 seg = 0, r0 = 0;
    const bool any = seg_of(sg, (blockIdx.y * ((blockDim.x >> 5) / wpr) + warp / wpr) * GR, GR,
                            seg, r0);
    const u32 m = pick(sg.m, seg);
    if (!any) r0 = m;
    const u8* codes = (const u8*)pick(sg.w, seg);
    const void* scales = pick(sg.scales, seg);
    const void* bias = pick(sg.bias, seg);
    float* out = pick(sg.out, seg);
    const u32 job = blockIdx.x;
    const u64 e = experts ? (u64)experts[job] : 0;
    const u32 groups = k / 32, sub = lane & 3u;
    const float* xb = x + (u64)(job / x_div) * nx * k;
    // Each of the GR rows' first group; rows past m read the last row
    // (their sums are never stored).
    u64 g0[GR];
#pragma unroll
    for (int i = 0; i < GR; i++) g0[i] = (e * m + min(r0 + i, m - 1)) * groups;
    float acc[GR][NX];
#pragma unroll
    for (int i = 0; i < GR; i++) {
#pragma unroll
        for (u32 t = 0; t < NX; t++) acc[i][t] = 0.0f;
    }
    if (r0 < m) {
        const u32 step = 8 * wpr;  // groups a step of the row quad's warps covers
        u32 q = part * 8 + (lane >> 2);
        constexpr int U = F::UNROLL;
        for (; q + (U - 1) * step < groups; q += U * step) {
            typename F::Word raw[U][GR];
            float s[U][GR];
#pragma unroll
            for (int u = 0; u < U; u++) {
#pragma unroll
                for (int i = 0; i < GR; i++) {
                    raw[u][i] = F::fetch(codes, g0[i] + q + u * step, sub);
                    s[u][i] = F::scale(scales, g0[i] + q + u * step);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                grouped_step<NX, F>(raw[u], s[u], xb + (u64)(q + u * step) * 32 + 8 * sub, nx, k, acc);
            }
        }
        for (; q < groups; q += step) {
            typename F::Word raw[GR];
            float s[GR];
#pragma unroll
            for (int i = 0; i < GR; i++) {
                raw[i] = F::fetch(codes, g0[i] + q, sub);
                s[i] = F::scale(scales, g0[i] + q);
            }
            grouped_step<NX, F>(raw, s, xb + (u64)q * 32 + 8 * sub, nx, k, acc);
        }
    }
    // Sum over lanes, then over the quad's W warps in warp order.
    __shared__ float part_sum[8][GR][NX];
#pragma unroll
    for (int i = 0; i < GR; i++) {
#pragma unroll
        for (u32 t = 0; t < NX; t++) acc[i][t] = warp_sum(acc[i][t]);
    }
    if (wpr > 1) {
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < GR; i++) {
#pragma unroll
                for (u32 t = 0; t < NX; t++) part_sum[warp][i][t] = acc[i][t];
            }
        }
        __syncthreads();
        if (part == 0) {
#pragma unroll
            for (int i = 0; i < GR; i++) {
#pragma unroll
                for (u32 t = 0; t < NX; t++) {
                    float v = part_sum[warp][i][t];
                    for (u32 w = 1; w < wpr; w++) v += part_sum[warp + w][i][t];
                    acc[i][t] = v;
                }
            }
        }
    }
    if (part != 0 || lane != 0) return;
#pragma unroll
    for (int i = 0; i < GR; i++) {
        const u32 r = r0 + i;
        if (r >= m) break;
#pragma unroll
        for (u32 t = 0; t < NX; t++) {
            if (t < nx) {
                float v = acc[i][t];
                if (bias) v += load_w(bias, bias_dt, e * m + r);
                out[((u64)job * nx + t) * m + r] = v;
            }
        }
    }
}


// The E2M1 lookup needs more registers: three blocks per SM.
GEMV_KERNELS(gemv_mxfp4, gemv_grouped, Mxfp4, 3)
GEMV_KERNELS(gemv_q8, gemv_grouped, Q8, 4)
GEMV_KERNELS(gemv_q4, gemv_grouped, Q4, 4)
