// Causal attention over the ring KV store.
//
// The store holds f32 K and V `[capacity, kv_dim]` and `slot_pos[capacity]`
// (i64, −1 = empty): slot p % capacity holds position p (kernels/rope_kv.cu
// writes it). A key at position k is visible to a query at position q when
// 0 ≤ k ≤ q and, for a sliding span (window > 0), q − k < window
// (crates/turbospark-cpu/src/attention.rs).
//
// Attention is split over the key slots (flash-decoding): `attn_partial`
// runs one block per (query row, head, split); each of its 4 warps walks a
// strided subset of the split's slots with an online softmax (running max m,
// denominator l, unnormalised output), warps merge in shared memory, and the
// block writes (m, l, o). `attn_combine` merges the splits, adds the sink
// logit to the denominator only, and normalises. Scores are f32
// q·k · scale, softcapped before the mask as the CPU does; the max-shifted
// exponentials equal the CPU's two-pass softmax up to rounding.

#define ATT_MAX_HD 256
#define ATT_WARPS 4
#define ATT_PER_LANE (ATT_MAX_HD / 32)

// Keys a warp scores per step: their loads are independent, so four rows
// of K (and then of V) are in flight at once instead of one.
#define ATT_KEYS 4

// part_o [rows·heads, splits, head_dim], part_ml [rows·heads, splits, 2].
// Slots [slot_lo, slot_hi) are cut into splits of `per_split` slots; each
// row narrows that to the slots its own position can see (while the ring
// has not wrapped past it: slot = position), so a launch sized for the
// whole ring (a recorded decode step) reads only the live part.
extern "C" __global__ void attn_partial(float* part_o, float* part_ml, const float* q,
                                        const float* kc, const float* vc, const i64* slot_pos,
                                        const u32* positions, u32 num_heads, u32 group,
                                        u32 head_dim, u32 kv_dim, float scale, float softcap,
                                        i64 window, u32 slot_lo, u32 slot_hi, u32 per_split,
                                        u32 capacity) {
    const u32 rh = blockIdx.x, row = rh / num_heads, head = rh % num_heads;
    const u32 split = blockIdx.y, splits = gridDim.y;
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const i64 qpos = (i64)positions[row];
    u32 lo = slot_lo, hi = slot_hi;
    if (qpos < (i64)capacity) {
        hi = min(hi, (u32)qpos + 1u);
        if (window > 0 && qpos + 1 > window) lo = max(lo, (u32)(qpos + 1 - window));
    }
    const u32 s0 = max(slot_lo + split * per_split, lo);
    const u32 s1 = min(slot_lo + split * per_split + per_split, hi);
    const float* qv = q + (u64)rh * head_dim;
    const u64 kv_off = (u64)(head / group) * head_dim;

    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++) {
        const u32 d = lane + 32 * j;
        qr[j] = d < head_dim ? qv[d] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    // Warp w takes slots s0 + w, s0 + w + ATT_WARPS, ...: ATT_KEYS of them
    // per step, scored independently, then folded into (m, l, acc) in slot
    // order.
    for (u32 base = s0 + warp; base < s1; base += ATT_WARPS * ATT_KEYS) {
        float sc[ATT_KEYS];
        bool live[ATT_KEYS];
#pragma unroll
        for (int t = 0; t < ATT_KEYS; t++) {
            const u32 s = base + t * ATT_WARPS;
            live[t] = false;
            float dot = 0.0f;
            if (s < s1) {
                const i64 kp = slot_pos[s];
                live[t] = !(kp < 0 || kp > qpos || (window > 0 && qpos - kp >= window));
                if (live[t]) {
                    const float* kk = kc + (u64)s * kv_dim + kv_off;
#pragma unroll
                    for (int j = 0; j < ATT_PER_LANE; j++) {
                        const u32 d = lane + 32 * j;
                        if (d < head_dim) dot += qr[j] * kk[d];
                    }
                }
            }
            sc[t] = warp_sum(dot) * scale;
            if (softcap > 0.0f) sc[t] = softcap * tanhf(sc[t] / softcap);
        }
#pragma unroll
        for (int t = 0; t < ATT_KEYS; t++) {
            if (!live[t]) continue;
            const u32 s = base + t * ATT_WARPS;
            const float mn = fmaxf(m, sc[t]);
            const float corr = expf(m - mn);  // 0 for the first visible key
            const float p = expf(sc[t] - mn);
            l = l * corr + p;
            const float* vv = vc + (u64)s * kv_dim + kv_off;
#pragma unroll
            for (int j = 0; j < ATT_PER_LANE; j++) {
                const u32 d = lane + 32 * j;
                if (d < head_dim) acc[j] = acc[j] * corr + p * vv[d];
            }
            m = mn;
        }
    }

    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float so[ATT_WARPS][ATT_MAX_HD];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++) {
        const u32 d = lane + 32 * j;
        if (d < head_dim) so[warp][d] = acc[j];
    }
    __syncthreads();
    float bm = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) bm = fmaxf(bm, sm[w]);
    float f[ATT_WARPS];
    float bl = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm[w] == NEG_INF ? 0.0f : expf(sm[w] - bm);  // empty warps weigh nothing
        bl += sl[w] * f[w];
    }
    const u64 out = (u64)rh * splits + split;
    for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) o += so[w][d] * f[w];
        part_o[out * head_dim + d] = o;
    }
    if (threadIdx.x == 0) {
        part_ml[out * 2] = bm;
        part_ml[out * 2 + 1] = bl;
    }
}

// Most splits one (row, head) may have (the combine's shared weights).
#define ATT_MAX_SPLITS 256

// out [rows, heads·head_dim]; one block per (row, head). `sinks` (one logit
// per head, dtype sinks_dt) is null when the layer has none. The first
// thread computes each split's weight exp(m_s − M) and 1 / L once; every
// thread then sums its output dimensions over the splits.
extern "C" __global__ void attn_combine(float* out, const float* part_o, const float* part_ml,
                                        const void* sinks, int sinks_dt, u32 num_heads,
                                        u32 head_dim, u32 splits) {
    const u32 rh = blockIdx.x, head = rh % num_heads;
    const float* ml = part_ml + (u64)rh * splits * 2;
    __shared__ float wgt[ATT_MAX_SPLITS];
    __shared__ float inv;
    if (threadIdx.x == 0) {
        float M = NEG_INF;
        for (u32 s = 0; s < splits; s++) M = fmaxf(M, ml[2 * s]);
        float L = 0.0f;
        if (sinks) {
            const float sink = load_w(sinks, sinks_dt, head);
            M = fmaxf(M, sink);
            L = expf(sink - M);
        }
        for (u32 s = 0; s < splits; s++) {
            // Splits that saw no visible key weigh nothing.
            wgt[s] = ml[2 * s] != NEG_INF ? expf(ml[2 * s] - M) : 0.0f;
            L += ml[2 * s + 1] * wgt[s];
        }
        // No visible key and no sink gives 0/0 = NaN, as on the CPU.
        inv = 1.0f / L;
    }
    __syncthreads();
    const float* po = part_o + (u64)rh * splits * head_dim;
    for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (u32 s = 0; s < splits; s++) {
            if (wgt[s] != 0.0f) o += po[(u64)s * head_dim + d] * wgt[s];
        }
        out[(u64)rh * head_dim + d] = o * inv;
    }
}
