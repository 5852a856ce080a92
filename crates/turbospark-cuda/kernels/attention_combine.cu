// Merging a decode row's attention splits (flash-decoding's second pass):
// the split kernels of attention.cu each wrote a partial (m, l,
// unnormalised output) per (row, head, split); `attn_combine` weighs them by
// exp(m_s − M), adds the sink logit to the denominator only, and
// normalises, as the CPU's two-pass softmax does up to rounding. Compiled
// after attention.cu in one module (src/compile.rs), whose `split_slots`
// tells it which splits wrote something; a module of its own compiled the
// combine to different code (1,584 instructions against 1,600), so it
// stays where its code was measured.

// Most splits one (row, head) may have (the combine's shared weights).
#define ATT_MAX_SPLITS 256

// out [rows, heads·head_dim]; one block per (row, head). `sinks` (one logit
// per head, dtype sinks_dt) is null when the layer has none; the slot
// arguments are the partial kernel's, to tell which splits it wrote. Thread
// s holds split s's (m, l) (splits ≤ ATT_MAX_SPLITS = the block's threads),
// read once: the block's max M, then each split's weight exp(m_s − M) and
// the denominator L (block reductions). Thread t takes column t % cols (a
// float4 of dimensions when head_dim is a multiple of 4, else one) and every
// (threads / cols)-th split from t / cols. Its first ATT_COMBINE_EARLY rows
// are loaded with the (m, l) pairs, before any weight is known (a row does
// not depend on them), so the kernel waits on one round of loads after the
// partial kernel, not two; further rows go ATT_COMBINE_UNROLL at a time. The
// phases' sums meet in shared memory in phase order. Launched with
// ATT_COMBINE_THREADS threads (≥ head_dim: MAX_HEAD_DIM). A row is added
// only where its split's weight is non-zero: splits that wrote nothing
// (their rows are stale) weigh nothing. (Extra blocks here asking L2 for
// the output projection's lines while attention runs measured level on
// the H200: BENCHMARKS.md, twelfth session.)
#define ATT_COMBINE_THREADS 256
#define ATT_COMBINE_EARLY 12
#define ATT_COMBINE_UNROLL 4
static_assert(ATT_MAX_SPLITS <= ATT_COMBINE_THREADS, "a combine thread per split");

// Column c of split s's partial row (a float4, or one value in .x).
__device__ __forceinline__ float4 combine_row(const float* po, u32 s, u32 head_dim, u32 c,
                                              bool vec) {
    if (vec) return ((const float4*)(po + (u64)s * head_dim))[c];
    return make_float4(po[(u64)s * head_dim + c], 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ void add_weighted(float4& o, float4 v, float w) {
    o.x += v.x * w;
    o.y += v.y * w;
    o.z += v.z * w;
    o.w += v.w * w;
}

extern "C" __global__ void __launch_bounds__(ATT_COMBINE_THREADS)
    attn_combine(float* out, const float* part_o, const float* part_ml, const void* sinks,
                 int sinks_dt, u32 num_heads, u32 head_dim, u32 splits, const u32* positions,
                 i64 window, u32 slot_lo, u32 slot_hi, u32 per_split, u32 capacity,
                 int release_first) {
    const u32 rh = blockIdx.x, head = rh % num_heads;
    // The sink is a weight and the position comes from the host: both are
    // read before waiting for the previous kernel, and so is which splits
    // this row can see. Splits with no slot it can see wrote nothing
    // (attn_gqa), and one that saw no visible key wrote m = −inf: both
    // weigh nothing.
    const float sink = sinks ? load_w(sinks, sinks_dt, head) : NEG_INF;
    const i64 qpos = (i64)positions[rh / num_heads];
    bool seen = false;
    if (threadIdx.x < splits) {
        u32 s0, s1;
        split_slots(qpos, window, slot_lo, slot_hi, per_split, capacity, threadIdx.x, s0, s1);
        seen = s0 < s1;
    }
    const float* ml = part_ml + (u64)rh * splits * 2;
    const float* po = part_o + (u64)rh * splits * head_dim;
    const bool vec = (head_dim & 3u) == 0;
    const u32 cols = vec ? head_dim / 4 : head_dim;
    const u32 phases = blockDim.x / cols, phase = threadIdx.x / cols, c = threadIdx.x % cols;
    const bool active = phase < phases;
    // `release_first` (where int4 weights were uploaded: src/lib.rs
    // `int4_linears`) lets the output projection after this launch start
    // before the wait: its blocks then take the SMs the attention step
    // leaves and fetch their first weights while it still runs, instead of
    // only once this launch has waited. It reads nothing else before its
    // own wait, which still waits for this launch to end.
    pdl_enter(release_first != 0);
    float ms = NEG_INF, ls = 0.0f;
    if (seen) {
        ms = ml[2 * threadIdx.x];
        ls = ml[2 * threadIdx.x + 1];
    }
    float4 early[ATT_COMBINE_EARLY];
#pragma unroll
    for (int u = 0; u < ATT_COMBINE_EARLY; u++) {
        const u32 s = phase + u * phases;
        early[u] = active && s < splits ? combine_row(po, s, head_dim, c, vec)
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    TS_PHASE(1);  // the first rows asked for (warp 0's)
    __shared__ float wgt[ATT_MAX_SPLITS];
    __shared__ float warp_maxes[32];
    __shared__ float4 phase_sum[ATT_COMBINE_THREADS];
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    float M = warp_max(ms);
    if (lane == 0) warp_maxes[warp] = M;
    __syncthreads();
    M = NEG_INF;
    for (u32 w = 0; w < (blockDim.x >> 5); w++) M = fmaxf(M, warp_maxes[w]);
    float sink_term = 0.0f;
    if (sinks) {
        M = fmaxf(M, sink);
        sink_term = expf(sink - M);
    }
    const float w = ms == NEG_INF ? 0.0f : expf(ms - M);
    if (threadIdx.x < splits) wgt[threadIdx.x] = w;
    // No visible key and no sink gives 0/0 = NaN, as on the CPU. (block_sum
    // synchronises, so wgt is complete after it.)
    const float inv = 1.0f / (block_sum(ls * w) + sink_term);
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active) {
#pragma unroll
        for (int u = 0; u < ATT_COMBINE_EARLY; u++) {
            const u32 s = phase + u * phases;
            const float ws = s < splits ? wgt[s] : 0.0f;
            if (ws != 0.0f) add_weighted(o, early[u], ws);
        }
        constexpr int U = ATT_COMBINE_UNROLL;
        for (u32 base = phase + ATT_COMBINE_EARLY * phases; base < splits; base += U * phases) {
            float ww[U];
            float4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const u32 s = base + u * phases;
                ww[u] = s < splits ? wgt[s] : 0.0f;
                v[u] = ww[u] != 0.0f ? combine_row(po, s, head_dim, c, vec)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (ww[u] != 0.0f) add_weighted(o, v[u], ww[u]);
            }
        }
    }
    phase_sum[threadIdx.x] = o;
    __syncthreads();
    TS_PHASE(2);  // every split merged
    if (phase != 0) return;
    for (u32 p = 1; p < phases; p++) {
        const float4 v = phase_sum[p * cols + c];
        o.x += v.x;
        o.y += v.y;
        o.z += v.z;
        o.w += v.w;
    }
    float* dst = out + (u64)rh * head_dim;
    if (vec) {
        ((float4*)dst)[c] = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
    } else {
        dst[c] = o.x * inv;
    }
}
