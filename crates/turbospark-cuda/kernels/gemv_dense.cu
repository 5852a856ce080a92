// Dense weights (f32, bf16, f16): the layout in gemv_common.cuh; the
// `_x1` variants can read x through a fused norm (staged in shared memory,
// persistent blocks). At the end, the streamed one-row kernels, whose
// weights come through a shared-memory ring.

// A dense dtype's 8-value chunk: WORDS 16-byte words, fetched raw and
// widened exactly to f32 when used.
template <int DT>
struct Wt;

template <>
struct Wt<DT_F32> {
    static constexpr int SIZE = 4;  // bytes a value
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
    static constexpr int SIZE = 2;  // bytes a value
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
    static constexpr int SIZE = 2;  // bytes a value
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
    u32 r, seg, part, wpr, lane, m;
    const void* w;
    const void* bias;
    float* out;
    bool valid;
};

// `vb`: the block of work (blockIdx.y, or a persistent block's turn).
__device__ __forceinline__ GemvRow gemv_row(const GemvSegs& sg, u32 wpr, u32 vb) {
    GemvRow g;
    const u32 warp = threadIdx.x >> 5;
    g.lane = threadIdx.x & 31u;
    g.wpr = wpr;
    g.part = warp % wpr;
    u32 seg = 0, r = 0;
    g.valid = seg_of(sg, vb * ((blockDim.x >> 5) / wpr) + warp / wpr, 1, seg, r);
    g.r = r;
    g.seg = seg;
    g.m = pick(sg.m, seg);
    g.w = pick(sg.w, seg);
    g.bias = pick(sg.bias, seg);
    g.out = pick(sg.out, seg);
    return g;
}

// Sums each x row's partials over the lanes and the row's W warps (in warp
// order) and writes them (with the bias) from the row's first lane. A glu
// launch's pairs are neighbouring rows of the block (an even number of
// rows a block: the host keeps W ≤ 4): their first lanes meet in shared
// memory and the gate row's writes the activation (pair c of a job's
// m / 2 in one segment, or of m with GLU_SEGS, where g.r is c).
template <int NX>
__device__ __forceinline__ void gemv_store(const GemvSegs& sg, float* acc, int bias_dt, u64 e,
                                           u32 job, u32 nx, const GemvRow& g, float r,
                                           bool accumulate) {
    float* out = g.out;
    const void* bias = g.bias;
    const u32 m = g.m;
    __shared__ float part[8][NX];
#pragma unroll
    for (u32 t = 0; t < NX; t++) acc[t] = warp_sum(acc[t]);
    const u32 warp = threadIdx.x >> 5;
    if (g.wpr > 1) {
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
    const bool first = g.valid && g.part == 0 && g.lane == 0;
    const u64 bias_at = e * m + glu_row(sg, m, g.r);
    if (sg.glu) {
        __shared__ float pair[8][NX];
        const u32 slot = warp / g.wpr;
        if (first) {
#pragma unroll
            for (u32 t = 0; t < NX; t++) pair[slot][t] = out_value(acc[t], r, bias, bias_dt, bias_at);
        }
        __syncthreads();
        const bool segs = glu_segs(sg);
        if (!first || (segs ? g.seg : g.r & 1u)) return;
        const u32 width = segs ? m : m / 2, c = segs ? g.r : g.r / 2;
#pragma unroll
        for (u32 t = 0; t < NX; t++) {
            if (t < nx) {
                out[((u64)job * nx + t) * width + c] =
                    glu_value(sg, pair[slot][t], pair[slot + 1][t]);
            }
        }
        return;
    }
    if (!first) return;
#pragma unroll
    for (u32 t = 0; t < NX; t++) {
        if (t < nx) {
            store_out(&out[((u64)job * nx + t) * m + g.r], acc[t], r, bias, bias_dt, bias_at,
                      accumulate);
        }
    }
}

// One block of work of gemv_dense: the row (or its W-th part) of warp
// `g`, every row of x at `xb` (global or shared memory).
template <int NX, int DT>
__device__ __forceinline__ void gemv_dense_rows(const GemvSegs& sg, const GemvRow& g,
                                                const float* xb, u64 e, u32 nx, u32 k, u32 wpr,
                                                int bias_dt, u32 job, float r, bool accumulate) {
    const void* w = g.w;
    const u64 wrow = (e * g.m + (g.valid ? glu_row(sg, g.m, g.r) : 0)) * k;
    float acc[NX];
#pragma unroll
    for (int t = 0; t < NX; t++) acc[t] = 0.0f;
    if (g.valid && (k & 7u) == 0) {
        const u32 step = 256 * wpr;
        // U chunks a step, all fetched before any is used; the per-lane
        // sum still runs over the chunks in ascending order. Loop bounds
        // are the warp's (its first chunk `base`), so lanes never split
        // between the loops: while all lanes' U chunks lie in the row, the
        // main loop; then the rest of the row, also U chunks in flight, in
        // a block of its own (lanes past the row fetch their last chunk
        // again, unused) so that the main loop keeps its registers.
        constexpr int U = Wt<DT>::UNROLL;
        const u32 lane_off = g.lane * 8;
        u32 base = g.part * 256;
        for (; base + 255 + (U - 1) * step < k; base += U * step) {
            const u32 c = base + lane_off;
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
        if (base < k) {
            const u32 c = base + lane_off;
            uint4 raw[U][Wt<DT>::WORDS];
#pragma unroll
            for (int u = 0; u < U; u++) {
                Wt<DT>::fetch(w, wrow + (c + u * step < k ? c + u * step : k - 8), raw[u]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (c + u * step >= k) continue;
                float wv[8];
                Wt<DT>::widen(raw[u], wv);
#pragma unroll
                for (u32 t = 0; t < NX; t++) {
                    if (t < nx) acc[t] += dot8(wv, xb + (u64)t * k + c + u * step);
                }
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
    gemv_store<NX>(sg, acc, bias_dt, e, job, nx, g, r, accumulate);
}

// A fused norm's x (one row, k a multiple of 8): the first `threads`
// threads of the block stage w_norm · x into xs (shared memory, k floats)
// and return their parts of Σ x² (norm_part, norm_factor).
__device__ __forceinline__ float stage_normed_x(const GemvSegs& sg, const float* x, u32 k,
                                                float* xs, u32 threads) {
    float ss = 0.0f;
    for (u32 c = threadIdx.x; c < k / 8; c += threads) {
        const float4 a = ((const float4*)x)[2 * c], b = ((const float4*)x)[2 * c + 1];
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float nw[8];
        load_w8(sg.norm, sg.norm_dt, 8 * c, nw);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            ss += v[i] * v[i];
            xs[8 * c + i] = nw[i] * v[i];
        }
    }
    return ss;
}

template <int NX, int DT>
__device__ __forceinline__ void gemv_dense(const GemvSegs& sg, const float* x, int bias_dt,
                                           const int* experts, u32 nx, u32 x_div, u32 k,
                                           u32 wpr) {
    // Weights do not depend on the previous kernel: ask L2 for this lane's
    // first U chunks before waiting for it (programmatic dependent launch),
    // unless experts (which it writes) pick the rows. Into L2, not into
    // registers held through the norm's staging as gemv_grouped_qx holds
    // its first fetch: that measured 429.0, 429.7 -> 412.5, 410.8 tok/s on
    // 16-layer Llama-8B bf16 (one call, alternated) and level on gpt-oss-20b.
    // The timeline put the loss in this kernel's one-row launches (the
    // down projection 39.5 -> 43.4 µs, o 12.8 -> 14.5), not the streamed
    // ones: same 64 registers, no spills, but the main loop issued all its
    // loads at the top instead of interleaving weights with x.
    {
        const GemvRow g = gemv_row(sg, wpr, blockIdx.y);
        if (experts == nullptr && g.valid && (k & 7u) == 0) {
#pragma unroll
            for (int u = 0; u < Wt<DT>::UNROLL; u++) {
                const u32 c = (g.part * 32 + g.lane) * 8 + u * 256 * wpr;
                if (c < k) {
                    prefetch_l2((const u8*)g.w + ((u64)glu_row(sg, g.m, g.r) * k + c) * Wt<DT>::SIZE);
                }
            }
        }
    }
    pdl_enter();
    const u32 job = blockIdx.x;
    const u64 e = experts ? (u64)experts[job] : 0;
    const float* xb = x + (u64)(job / x_div) * nx * k;
    // A fused norm (one row of x, k a multiple of 8): the block stages
    // w_norm · x in shared memory (dynamic, k floats) once and reads x
    // from there; each row's sum is scaled by r when stored. Every dense
    // launch is persistent (src/gemv.rs sizes its grid to the resident
    // blocks): each block takes blocks of work blockIdx.y, + gridDim.y,
    // ..., so the staging is paid once a block, not once per 8 rows.
    float r = 1.0f;
    if (sg.norm) {
        DYNAMIC_SHARED(uint4, shared_x);
        __shared__ float parts[8];
        float* xs = (float*)shared_x;
        norm_part(stage_normed_x(sg, xb, k, xs, blockDim.x), parts);
        __syncthreads();  // xs and the parts complete
        r = norm_factor(sg, parts, blockDim.x >> 5, k, xb);
        xb = xs;
        TS_PHASE(1);  // x normed into shared memory
    }
    u32 rows = 0;
#pragma unroll
    for (u32 i = 0; i < GEMV_MAX_SEGS; i++) {
        if (i < sg.count) rows += pick(sg.m, i);
    }
    const u32 per_block = (blockDim.x >> 5) / wpr;
    const u32 work = (rows + per_block - 1) / per_block;
    for (u32 vb = blockIdx.y; vb < work; vb += gridDim.y) {
        const GemvRow g = gemv_row(sg, wpr, vb);
        gemv_dense_rows<NX, DT>(sg, g, xb, e, nx, k, wpr, bias_dt, job, r, sg.accumulate != 0);
        if (wpr > 1 || sg.glu) __syncthreads();  // the next turn rewrites gemv_store's exchange
        TS_PHASE(3);  // this turn stored (warp 0's)
    }
    TS_BLOCK_END(9);  // every warp's turns stored
}

GEMV_KERNELS(gemv_f32, gemv_dense, DT_F32, 4)
GEMV_KERNELS(gemv_bf16, gemv_dense, DT_BF16, 4)
GEMV_KERNELS(gemv_f16, gemv_dense, DT_F16, 4)

// Streamed one-row GEMVs (`gemv_*_stream`: decode, bf16/f16 weights, one
// job, no experts; src/gemv.rs takes them for launches long enough to
// pay). A kernel boundary ends the weight stream of the kernels above: the
// next GEMV's loads start only once its blocks hold an SM and have passed
// the PDL wait, so every launch pays a ramp and a tail (ncu: a third of a
// short GEMV's cycles hold no warps). Here one warp a block (the producer,
// warp GS_WARPS) copies the block's weight rows into a ring of
// shared-memory stages with bulk asynchronous copies (cp.async.bulk,
// completing on an mbarrier), starting BEFORE the PDL wait: the weights do
// not depend on the previous kernel, so the ring fills while it drains (a
// block takes at most half an SM's shared memory, so it fits beside the
// previous kernel's). The GS_WARPS consumer warps wait for the previous
// kernel, stage x (or w_norm · x) in shared memory, then read the stages.
// A stage is a tile of GS_WARPS rows × kc values, one bulk copy a row (by
// the producer's lane of that row): warp w takes row w, its lanes 8 values
// at a time, and releases the stage on a second mbarrier so that the
// producer refills it. Block b takes the virtual rows [b·V/B, (b+1)·V/B)
// of the launch's V (in pairs for a glu launch, whose gate and up rows
// interleave: seg_of), tile by tile; each row's sum goes to shared memory,
// and the block writes its outputs at the end as gemv_store does (bias,
// norm factor, residual add, activation). A lane's 8-value dots run in
// ascending order over the row and the warp tree sums the lanes: the order
// of gemv_dense_rows with one warp a row when kc is a multiple of 256.
// The ring's helpers and GS_* are stream.cuh's.
#if __CUDA_ARCH__ >= 900
// Dynamic shared memory (src/gemv.rs sizes it): the ring (`stages` tiles
// of GS_WARPS · kc values), then x or w_norm · x (k floats), then the
// block's row sums.
template <int DT>
__device__ __forceinline__ void gemv_stream(const GemvSegs& sg, const float* x, int bias_dt, u32 k,
                                            u32 kc, u32 stages) {
    DYNAMIC_SHARED(uint4, shared_x);
    __shared__ u64 full[GS_MAX_STAGES], empty[GS_MAX_STAGES];
    __shared__ float parts[GS_WARPS];
    constexpr u32 SZ = Wt<DT>::SIZE;
    const u32 tile = GS_WARPS * kc * SZ;  // bytes a stage
    u8* ring = (u8*)shared_x;
    float* xs = (float*)(ring + stages * tile);
    float* res = xs + k;
    const bool pairs = glu_segs(sg);
    u32 v0, n;
    stream_rows(sg, pairs, v0, n);
    const u32 chunks = (k + kc - 1) / kc, groups = (n + GS_WARPS - 1) / GS_WARPS;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    ring_init(full, empty, stages);
    if (warp == GS_WARPS) {
        // The producer warp: stage i is tile i / chunks (GS_WARPS rows)
        // and chunk i % chunks of them, in slot i % stages, which it
        // refills once every consumer warp has released the stage before.
        // Lane w copies row w of each tile: one thread issuing every copy
        // (address arithmetic and all) could not keep the ring full.
        for (u32 g = 0; g < groups; g++) {
            const u32 nr = min((u32)GS_WARPS, n - g * GS_WARPS);
            const u8* src = nullptr;
            if (lane < nr) {
                u32 seg = 0, r = 0;
                seg_of(sg, v0 + g * GS_WARPS + lane, 1, seg, r);
                src = (const u8*)pick(sg.w, seg) + (u64)r * k * SZ;
            }
            for (u32 c = 0; c < chunks; c++) {
                const u32 i = g * chunks + c, slot = i % stages;
                if (i >= stages) mbar_wait(&empty[slot], (i / stages - 1) & 1u);
                const u32 c0 = c * kc, len = min(kc, k - c0);
                if (lane == 0) mbar_expect(&full[slot], nr * len * SZ);
                __syncwarp();  // the expected bytes before any copy completes
                if (lane < nr) {
                    bulk_copy(ring + slot * tile + lane * kc * SZ, src + c0 * SZ, len * SZ,
                              &full[slot]);
                }
            }
        }
        return;
    }
    pdl_enter();
    // x (or w_norm · x) in shared memory: every warp reads all of it, and
    // beside the ring little of L1 is left to hold it.
    float rf = 1.0f;
    if (sg.norm) {
        norm_part(stage_normed_x(sg, x, k, xs, GS_WARPS * 32), parts);
        consumers_sync();  // xs and the parts complete
        rf = norm_factor(sg, parts, GS_WARPS, k, x);
    } else {
        for (u32 c = threadIdx.x; c < k / 4; c += GS_WARPS * 32) {
            ((float4*)xs)[c] = ((const float4*)x)[c];
        }
        consumers_sync();
    }
    const float* xb = xs;
    for (u32 g = 0; g < groups; g++) {
        const u32 v = g * GS_WARPS + warp;  // this warp's row of the tile
        float acc = 0.0f;
        for (u32 c = 0; c < chunks; c++) {
            const u32 i = g * chunks + c, slot = i % stages;
            mbar_wait(&full[slot], (i / stages) & 1u);
            if (v < n) {
                const u32 c0 = c * kc, vecs = min(kc, k - c0) / 8;
                const uint4* wr = (const uint4*)(ring + slot * tile + warp * kc * SZ);
#pragma unroll 4
                for (u32 u = lane; u < vecs; u += 32) {
                    float wv[8];
                    Wt<DT>::widen(&wr[u], wv);
                    acc += dot8(wv, xb + c0 + 8 * u);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
        }
        if (v < n) {
            acc = warp_sum(acc);
            if (lane == 0) res[v] = acc;
        }
    }
    consumers_sync();  // every row's sum in res
    stream_store(sg, pairs, v0, n, rf, bias_dt, [&](u32 v) { return res[v]; });
}
#endif  // __CUDA_ARCH__ >= 900

#if __CUDA_ARCH__ >= 900
#define GEMV_STREAM_BODY(DT) gemv_stream<DT>(sg, x, bias_dt, k, kc, stages); /* consumers: pdl_enter */
#else
#define GEMV_STREAM_BODY(DT) __trap();
#endif
#define GEMV_STREAM_KERNEL(name, DT)                                                             \
    extern "C" __global__ void __launch_bounds__(GS_THREADS, 2)                                  \
        name(GemvSegs sg, const float* x, int bias_dt, u32 k, u32 kc, u32 stages) {              \
        GEMV_STREAM_BODY(DT)                                                                     \
    }
GEMV_STREAM_KERNEL(gemv_bf16_stream, DT_BF16)
GEMV_STREAM_KERNEL(gemv_f16_stream, DT_F16)
