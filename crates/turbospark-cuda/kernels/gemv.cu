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
// UNROLL loads of raw weight words (8 of 16 bytes for the 16-bit and
// 4-bit formats, 4 for f32 and int8, whose chunks are two words) before it
// widens any, and keeps only those words (not widened floats) in
// registers, so occupancy stays high. Weights go through the non-caching read-only path (`ld_stream`);
// x is re-read from L1 by every warp.
#define GEMV_MAX_X 4

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
    static constexpr int UNROLL = 8;
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
    static constexpr int UNROLL = 8;
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
    u32 r, part, wpr, lane;
    bool valid;
};

__device__ __forceinline__ GemvRow gemv_row(u32 wpr, u32 m) {
    GemvRow g;
    const u32 warp = threadIdx.x >> 5;
    g.lane = threadIdx.x & 31u;
    g.wpr = wpr;
    g.part = warp % wpr;
    g.r = blockIdx.y * ((blockDim.x >> 5) / wpr) + warp / wpr;
    g.valid = g.r < m;
    return g;
}

// Sums each x row's partials over the lanes and the row's W warps (in warp
// order) and writes them (with the bias) from the row's first lane.
__device__ __forceinline__ void gemv_store(float* out, float* acc, const void* bias,
                                           int bias_dt, u64 e, u32 job, u32 nx, u32 m,
                                           const GemvRow& g) {
    __shared__ float part[8][GEMV_MAX_X];
#pragma unroll
    for (u32 t = 0; t < GEMV_MAX_X; t++) acc[t] = warp_sum(acc[t]);
    if (g.wpr > 1) {
        const u32 warp = threadIdx.x >> 5;
        if (g.lane == 0) {
#pragma unroll
            for (u32 t = 0; t < GEMV_MAX_X; t++) part[warp][t] = acc[t];
        }
        __syncthreads();
        if (g.part == 0) {
#pragma unroll
            for (u32 t = 0; t < GEMV_MAX_X; t++) {
                float s = part[warp][t];
                for (u32 w = 1; w < g.wpr; w++) s += part[warp + w][t];
                acc[t] = s;
            }
        }
    }
    if (!g.valid || g.part != 0 || g.lane != 0) return;
#pragma unroll
    for (u32 t = 0; t < GEMV_MAX_X; t++) {
        if (t < nx) {
            float s = acc[t];
            if (bias) s += load_w(bias, bias_dt, e * m + g.r);
            out[((u64)job * nx + t) * m + g.r] = s;
        }
    }
}

template <int DT>
__device__ __forceinline__ void gemv_dense(float* out, const float* x, const void* w,
                                           const void* bias, int bias_dt, const int* experts,
                                           u32 nx, u32 x_div, u32 k, u32 m, u32 wpr) {
    const GemvRow g = gemv_row(wpr, m);
    const u32 job = blockIdx.x;
    const u64 e = experts ? (u64)experts[job] : 0;
    const u64 wrow = (e * m + (g.valid ? g.r : 0)) * k;
    const float* xb = x + (u64)(job / x_div) * nx * k;
    float acc[GEMV_MAX_X] = {0.0f, 0.0f, 0.0f, 0.0f};
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
                for (u32 t = 0; t < GEMV_MAX_X; t++) {
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
            for (u32 t = 0; t < GEMV_MAX_X; t++) {
                if (t < nx) acc[t] += dot8(wv, xb + (u64)t * k + c);
            }
        }
    } else if (g.valid) {
        for (u32 c = g.part * 32 + g.lane; c < k; c += 32 * wpr) {
            const float wv = load_w(w, DT, wrow + c);
#pragma unroll
            for (u32 t = 0; t < GEMV_MAX_X; t++) {
                if (t < nx) acc[t] += wv * xb[(u64)t * k + c];
            }
        }
    }
    gemv_store(out, acc, bias, bias_dt, e, job, nx, m, g);
}

#define GEMV_ARGS                                                                         \
    float *out, const float *x, const void *w, const void *bias, int bias_dt,            \
        const int *experts, u32 nx, u32 x_div, u32 k, u32 m, u32 wpr
#define GEMV_PASS out, x, w, bias, bias_dt, experts, nx, x_div, k, m, wpr

extern "C" __global__ void gemv_f32(GEMV_ARGS) { gemv_dense<DT_F32>(GEMV_PASS); }
extern "C" __global__ void gemv_bf16(GEMV_ARGS) { gemv_dense<DT_BF16>(GEMV_PASS); }
extern "C" __global__ void gemv_f16(GEMV_ARGS) { gemv_dense<DT_F16>(GEMV_PASS); }

// Grouped formats: 32 values per group, each group's dot product summed
// unscaled (in four 8-value dot8 steps) and then multiplied by the group's
// scale (the CPU's order). Each lane takes whole groups: it fetches the raw
// code words and scales of UNROLL groups, then widens one group at a
// time (rows are whole groups, so the words are 16-byte aligned).

// MXFP4: one 16-byte word a group (byte j holds values 2j, low nibble, and
// 2j + 1, high nibble) and one E8M0 scale byte.
struct Mxfp4 {
    static constexpr int WORDS = 1;
    static constexpr int UNROLL = 8;
    static __device__ __forceinline__ void fetch(const u8* codes, u64 group, uint4* r) {
        r[0] = ld_stream((const uint4*)codes + group);
    }
    // The 8 values of 32-bit word `j` (0..3) of the group: values 8j..8j+7.
    static __device__ __forceinline__ void widen8(const uint4* r, int j, float* o) {
        const u32 q = j == 0 ? r[0].x : j == 1 ? r[0].y : j == 2 ? r[0].z : r[0].w;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const u32 byte = (q >> (8 * b)) & 0xffu;
            o[2 * b] = e2m1(byte & 15u);
            o[2 * b + 1] = e2m1(byte >> 4);
        }
    }
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        return e8m0(((const u8*)scales)[group]);
    }
};

// Int8 (weight-only --quant): two 16-byte words a group of signed codes,
// one f32 scale.
struct Q8 {
    static constexpr int WORDS = 2;
    static constexpr int UNROLL = 4;
    static __device__ __forceinline__ void fetch(const u8* codes, u64 group, uint4* r) {
        const uint4* p = (const uint4*)codes + 2 * group;
        r[0] = ld_stream(p);
        r[1] = ld_stream(p + 1);
    }
    // Values 8j..8j+7: 32-bit words 2j and 2j + 1 of the group.
    static __device__ __forceinline__ void widen8(const uint4* r, int j, float* o) {
        const uint4 u = r[j >> 1];
        const u32 a = (j & 1) ? u.z : u.x, b = (j & 1) ? u.w : u.y;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o[i] = (float)(signed char)((a >> (8 * i)) & 0xffu);
            o[4 + i] = (float)(signed char)((b >> (8 * i)) & 0xffu);
        }
    }
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        return ((const float*)scales)[group];
    }
};

// Int4 (weight-only --quant): one 16-byte word a group of value + 8 codes
// (low nibble first), one f32 scale.
struct Q4 {
    static constexpr int WORDS = 1;
    static constexpr int UNROLL = 8;
    static __device__ __forceinline__ void fetch(const u8* codes, u64 group, uint4* r) {
        r[0] = ld_stream((const uint4*)codes + group);
    }
    static __device__ __forceinline__ void widen8(const uint4* r, int j, float* o) {
        const u32 q = j == 0 ? r[0].x : j == 1 ? r[0].y : j == 2 ? r[0].z : r[0].w;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const u32 byte = (q >> (8 * b)) & 0xffu;
            o[2 * b] = (float)((int)(byte & 15u) - 8);
            o[2 * b + 1] = (float)((int)(byte >> 4) - 8);
        }
    }
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        return ((const float*)scales)[group];
    }
};

// acc[t] += scale · Σ_{32 values} w · x[t] for one fetched group.
template <class F>
__device__ __forceinline__ void group_dot(const uint4* raw, float s, const float* xb, u32 nx,
                                          u64 k, u64 col, float* acc) {
    float b[GEMV_MAX_X] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float wv[8];
        F::widen8(raw, j, wv);
#pragma unroll
        for (u32 t = 0; t < GEMV_MAX_X; t++) {
            if (t < nx) b[t] += dot8(wv, xb + t * k + col + 8 * j);
        }
    }
#pragma unroll
    for (u32 t = 0; t < GEMV_MAX_X; t++) acc[t] += b[t] * s;
}

template <class F>
__device__ __forceinline__ void gemv_grouped(float* out, const float* x, const u8* codes,
                                             const void* scales, const void* bias, int bias_dt,
                                             const int* experts, u32 nx, u32 x_div, u32 k,
                                             u32 m, u32 wpr) {
    const GemvRow g = gemv_row(wpr, m);
    const u32 job = blockIdx.x;
    const u64 e = experts ? (u64)experts[job] : 0;
    const u32 groups = k / 32;
    const u64 g0 = (e * m + (g.valid ? g.r : 0)) * groups;  // the row's first group
    const float* xb = x + (u64)(job / x_div) * nx * k;
    float acc[GEMV_MAX_X] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (g.valid) {
        const u32 step = 32 * wpr;
        u32 q = g.part * 32 + g.lane;
        constexpr int U = F::UNROLL;
        for (; q + (U - 1) * step < groups; q += U * step) {
            uint4 raw[U][F::WORDS];
            float s[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                F::fetch(codes, g0 + q + u * step, raw[u]);
                s[u] = F::scale(scales, g0 + q + u * step);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                group_dot<F>(raw[u], s[u], xb, nx, k, (u64)(q + u * step) * 32, acc);
            }
        }
        for (; q < groups; q += step) {
            uint4 raw[F::WORDS];
            F::fetch(codes, g0 + q, raw);
            group_dot<F>(raw, F::scale(scales, g0 + q), xb, nx, k, (u64)q * 32, acc);
        }
    }
    gemv_store(out, acc, bias, bias_dt, e, job, nx, m, g);
}

#define GEMV_GROUPED_ARGS                                                                   \
    float *out, const float *x, const u8 *codes, const void *scales, const void *bias,      \
        int bias_dt, const int *experts, u32 nx, u32 x_div, u32 k, u32 m, u32 wpr
#define GEMV_GROUPED_PASS out, x, codes, scales, bias, bias_dt, experts, nx, x_div, k, m, wpr

extern "C" __global__ void gemv_mxfp4(GEMV_GROUPED_ARGS) { gemv_grouped<Mxfp4>(GEMV_GROUPED_PASS); }
extern "C" __global__ void gemv_q8(GEMV_GROUPED_ARGS) { gemv_grouped<Q8>(GEMV_GROUPED_PASS); }
extern "C" __global__ void gemv_q4(GEMV_GROUPED_ARGS) { gemv_grouped<Q4>(GEMV_GROUPED_PASS); }
