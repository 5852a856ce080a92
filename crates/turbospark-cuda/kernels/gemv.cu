// Matrix-vector products for decode and for mixture-of-experts jobs:
//   out[job·nx + t, r] = Σ_c x[xrow(job)·nx + t, c] · W[e(job)·m + r, c] (+ bias[e·m + r])
// with xrow(job) = job / x_div and e(job) = experts[job] (0 when `experts`
// is null). A plain linear is one job with nx ≤ 4 rows of x, so each weight
// row is read once for all of them; an MoE layer is one job per (token,
// selected expert) with nx = 1.
//
// Layout: one warp per output row r, 8 warps per block; grid = (jobs,
// ceil(m / 8)). Each lane reads 16 bytes of the weight row at a time (8
// bf16/f16 values; 8 f32 as two 16-byte loads) when the row length allows
// aligned vectors, else one element at a time; grouped formats (MXFP4,
// int8, int4) take one 32-value group at a time.
// Accumulation is f32: per-lane partial sums, then a warp tree sum, so the
// result differs from the CPU's by summation order only.

#define GEMV_MAX_X 4

template <int DT>
struct Wt;

template <>
struct Wt<DT_F32> {
    static __device__ __forceinline__ void load8(const void* w, u64 i, float* o) {
        const float4* p = (const float4*)((const float*)w + i);
        const float4 a = p[0], b = p[1];
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
        o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    }
};

template <>
struct Wt<DT_BF16> {
    static __device__ __forceinline__ void load8(const void* w, u64 i, float* o) {
        const uint4 u = *(const uint4*)((const u16*)w + i);
        const u32 q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {  // little endian: the lower address is the low half
            o[2 * j] = __uint_as_float(q[j] << 16);
            o[2 * j + 1] = __uint_as_float(q[j] & 0xffff0000u);
        }
    }
};

template <>
struct Wt<DT_F16> {
    static __device__ __forceinline__ void load8(const void* w, u64 i, float* o) {
        const uint4 u = *(const uint4*)((const u16*)w + i);
        const u32 q[4] = {u.x, u.y, u.z, u.w};
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

// Warp-sums each x row's partial and writes it (with the bias) from lane 0.
__device__ __forceinline__ void gemv_store(float* out, const float* acc, const void* bias,
                                           int bias_dt, u64 e, u32 job, u32 nx, u32 m, u32 r) {
#pragma unroll
    for (u32 t = 0; t < GEMV_MAX_X; t++) {
        if (t < nx) {
            float s = warp_sum(acc[t]);
            if (bias) s += load_w(bias, bias_dt, e * m + r);
            if ((threadIdx.x & 31u) == 0) out[((u64)job * nx + t) * m + r] = s;
        }
    }
}

template <int DT>
__device__ __forceinline__ void gemv_dense(float* out, const float* x, const void* w,
                                           const void* bias, int bias_dt, const int* experts,
                                           u32 nx, u32 x_div, u32 k, u32 m) {
    const u32 lane = threadIdx.x & 31u;
    const u32 r = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= m) return;  // the whole warp leaves together
    const u32 job = blockIdx.x;
    const u64 e = experts ? (u64)experts[job] : 0;
    const u64 wrow = (e * m + r) * k;
    const float* xb = x + (u64)(job / x_div) * nx * k;
    float acc[GEMV_MAX_X] = {0.0f, 0.0f, 0.0f, 0.0f};
    if ((k & 7u) == 0) {
        for (u32 c = lane * 8; c < k; c += 256) {
            float wv[8];
            Wt<DT>::load8(w, wrow + c, wv);
#pragma unroll
            for (u32 t = 0; t < GEMV_MAX_X; t++) {
                if (t < nx) acc[t] += dot8(wv, xb + (u64)t * k + c);
            }
        }
    } else {
        for (u32 c = lane; c < k; c += 32) {
            const float wv = load_w(w, DT, wrow + c);
#pragma unroll
            for (u32 t = 0; t < GEMV_MAX_X; t++) {
                if (t < nx) acc[t] += wv * xb[(u64)t * k + c];
            }
        }
    }
    gemv_store(out, acc, bias, bias_dt, e, job, nx, m, r);
}

#define GEMV_ARGS                                                                         \
    float *out, const float *x, const void *w, const void *bias, int bias_dt,            \
        const int *experts, u32 nx, u32 x_div, u32 k, u32 m
#define GEMV_PASS out, x, w, bias, bias_dt, experts, nx, x_div, k, m

extern "C" __global__ void gemv_f32(GEMV_ARGS) { gemv_dense<DT_F32>(GEMV_PASS); }
extern "C" __global__ void gemv_bf16(GEMV_ARGS) { gemv_dense<DT_BF16>(GEMV_PASS); }
extern "C" __global__ void gemv_f16(GEMV_ARGS) { gemv_dense<DT_F16>(GEMV_PASS); }

// Grouped formats: 32 values per group, each group's dot product summed
// unscaled and then multiplied by the group's scale (the CPU's order).
// Each lane takes whole groups; `decode` widens one group (16 or 32 bytes,
// 16-byte aligned because rows are whole groups) to 32 floats.

// MXFP4: 16 bytes a group (byte j holds values 2j, low nibble, and 2j + 1,
// high nibble) and one E8M0 scale byte.
struct Mxfp4 {
    static __device__ __forceinline__ void decode(const u8* codes, u64 group, float* wv) {
        const uint4 u = ((const uint4*)codes)[group];
        const u32 q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const u32 byte = (q[j >> 2] >> (8 * (j & 3))) & 0xffu;
            wv[2 * j] = e2m1(byte & 15u);
            wv[2 * j + 1] = e2m1(byte >> 4);
        }
    }
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        return e8m0(((const u8*)scales)[group]);
    }
};

// Int8 (weight-only --quant): 32 signed bytes a group, one f32 scale.
struct Q8 {
    static __device__ __forceinline__ void decode(const u8* codes, u64 group, float* wv) {
        const uint4* p = (const uint4*)codes + 2 * group;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 u = p[h];
            const u32 q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 16; j++) {
                wv[16 * h + j] = (float)(signed char)((q[j >> 2] >> (8 * (j & 3))) & 0xffu);
            }
        }
    }
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        return ((const float*)scales)[group];
    }
};

// Int4 (weight-only --quant): 16 bytes a group of value + 8 codes (low
// nibble first), one f32 scale.
struct Q4 {
    static __device__ __forceinline__ void decode(const u8* codes, u64 group, float* wv) {
        const uint4 u = ((const uint4*)codes)[group];
        const u32 q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const u32 byte = (q[j >> 2] >> (8 * (j & 3))) & 0xffu;
            wv[2 * j] = (float)((int)(byte & 15u) - 8);
            wv[2 * j + 1] = (float)((int)(byte >> 4) - 8);
        }
    }
    static __device__ __forceinline__ float scale(const void* scales, u64 group) {
        return ((const float*)scales)[group];
    }
};

template <class F>
__device__ __forceinline__ void gemv_grouped(float* out, const float* x, const u8* codes,
                                             const void* scales, const void* bias, int bias_dt,
                                             const int* experts, u32 nx, u32 x_div, u32 k,
                                             u32 m) {
    const u32 lane = threadIdx.x & 31u;
    const u32 r = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= m) return;
    const u32 job = blockIdx.x;
    const u64 e = experts ? (u64)experts[job] : 0;
    const u32 groups = k / 32;
    const u64 g0 = (e * m + r) * groups;  // the row's first group
    const float* xb = x + (u64)(job / x_div) * nx * k;
    float acc[GEMV_MAX_X] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 g = lane; g < groups; g += 32) {
        float wv[32];
        F::decode(codes, g0 + g, wv);
        const float s = F::scale(scales, g0 + g);
#pragma unroll
        for (u32 t = 0; t < GEMV_MAX_X; t++) {
            if (t < nx) {
                const float* xp = xb + (u64)t * k + (u64)g * 32;
                float b = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; j++) b += dot8(wv + 8 * j, xp + 8 * j);
                acc[t] += b * s;
            }
        }
    }
    gemv_store(out, acc, bias, bias_dt, e, job, nx, m, r);
}

#define GEMV_GROUPED_ARGS                                                                   \
    float *out, const float *x, const u8 *codes, const void *scales, const void *bias,      \
        int bias_dt, const int *experts, u32 nx, u32 x_div, u32 k, u32 m
#define GEMV_GROUPED_PASS out, x, codes, scales, bias, bias_dt, experts, nx, x_div, k, m

extern "C" __global__ void gemv_mxfp4(GEMV_GROUPED_ARGS) { gemv_grouped<Mxfp4>(GEMV_GROUPED_PASS); }
extern "C" __global__ void gemv_q8(GEMV_GROUPED_ARGS) { gemv_grouped<Q8>(GEMV_GROUPED_PASS); }
extern "C" __global__ void gemv_q4(GEMV_GROUPED_ARGS) { gemv_grouped<Q4>(GEMV_GROUPED_PASS); }
