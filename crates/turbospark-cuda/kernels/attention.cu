// Causal attention over the ring KV store.
//
// The store holds K and V `[capacity, kv_dim]`, f32 or bf16 (kv_store.cuh:
// every kernel here comes for each, the bf16 one named `..._bf16kv`), and
// `slot_pos[capacity]` (i64, −1 = empty): slot p % capacity holds position
// p (kernels/rope_kv.cu writes it, or a decode step's own kernel below,
// `attn_gqa_*_step`). A key at position k is visible to a query at position
// q when 0 ≤ k ≤ q and, for a sliding span (window > 0), q − k < window
// (crates/turbospark-cpu/src/attention.rs).
//
// Attention is split over the key slots (flash-decoding). `attn_gqa_*`
// (below) serves every head_dim that is a multiple of 4 and groups of up
// to 4-16 query heads per KV head; `attn_partial` the rest. Both write
// per-split partial results that `attn_combine` (attention_combine.cu,
// compiled after this file in one module: src/compile.rs) merges. `attn_partial`
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

// The slots [lo, hi) a query at `qpos` may see within [slot_lo, slot_hi):
// while the ring has not wrapped past it (slot = position), those up to its
// position and, for a sliding span, from its window's start; so a launch
// sized for the whole ring (a recorded decode step) reads only the live
// part.
__device__ __forceinline__ void visible_slots(i64 qpos, i64 window, u32 slot_lo, u32 slot_hi,
                                              u32 capacity, u32& lo, u32& hi) {
    lo = slot_lo;
    hi = slot_hi;
    if (qpos < (i64)capacity) {
        hi = min(hi, (u32)qpos + 1u);
        if (window > 0 && qpos + 1 > window) lo = max(lo, (u32)(qpos + 1 - window));
    }
}

// Slots [s0, s1) of split `split`: slots [slot_lo, slot_hi) are cut into
// splits of `per_split` slots, each narrowed to what the row can see. Once
// the ring has wrapped past a sliding span's query, its window's positions
// qpos + 1 − window ..= qpos lie on the arc of slots from a = (qpos + 1 −
// window) % capacity round to b = qpos % capacity (window ≤ capacity, so no
// two of them share a slot): a split keeps only its part of that arc, the
// hull of both parts where the arc's gap lies inside it (slot_pos tells
// those slots apart), and a split in the gap sees nothing. Without this a
// sliding layer past its ring's capacity (gpt-oss beyond 2,176 positions)
// would stage and score its whole ring each step, not its window.
__device__ __forceinline__ void split_slots(i64 qpos, i64 window, u32 slot_lo, u32 slot_hi,
                                            u32 per_split, u32 capacity, u32 split, u32& s0,
                                            u32& s1) {
    u32 lo, hi;
    visible_slots(qpos, window, slot_lo, slot_hi, capacity, lo, hi);
    s0 = max(slot_lo + split * per_split, lo);
    s1 = min(slot_lo + split * per_split + per_split, hi);
    if (qpos >= (i64)capacity && window > 0 && window <= (i64)capacity) {
        const u32 a = (u32)((qpos + 1 - window) % capacity);
        const u32 b = (u32)(qpos % capacity) + 1;  // the arc is [a, b), or [a, capacity) ∪ [0, b)
        if (a < b) {
            s0 = max(s0, a);
            s1 = min(s1, b);
        } else {
            const bool low = s0 < b, high = s1 > a;
            if (low && !high) s1 = min(s1, b);
            if (high && !low) s0 = max(s0, a);
            if (!low && !high) s1 = s0;
        }
        s1 = max(s1, s0);
    }
}

// part_o [rows·heads, splits, head_dim], part_ml [rows·heads, splits, 2];
// the slots as `split_slots` gives them.
template <typename S>
__device__ __forceinline__ void attn_partial(float* part_o, float* part_ml, const float* q,
                                             const S* kc, const S* vc, const i64* slot_pos,
                                             const u32* positions, u32 num_heads, u32 group,
                                             u32 head_dim, u32 kv_dim, float scale,
                                             float softcap, i64 window, u32 slot_lo,
                                             u32 slot_hi, u32 per_split, u32 capacity) {
    const u32 rh = blockIdx.x, row = rh / num_heads, head = rh % num_heads;
    const u32 split = blockIdx.y, splits = gridDim.y;
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const i64 qpos = (i64)positions[row];
    u32 s0, s1;
    split_slots(qpos, window, slot_lo, slot_hi, per_split, capacity, split, s0, s1);
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
                    const S* kk = kc + (u64)s * kv_dim + kv_off;
#pragma unroll
                    for (int j = 0; j < ATT_PER_LANE; j++) {
                        const u32 d = lane + 32 * j;
                        if (d < head_dim) dot += qr[j] * kv_get(kk, d);
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
            const S* vv = vc + (u64)s * kv_dim + kv_off;
#pragma unroll
            for (int j = 0; j < ATT_PER_LANE; j++) {
                const u32 d = lane + 32 * j;
                if (d < head_dim) acc[j] = acc[j] * corr + p * kv_get(vv, d);
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

#define ATT_PARTIAL(name, S)                                                                     \
    extern "C" __global__ void name(float* part_o, float* part_ml, const float* q, const S* kc,  \
                                    const S* vc, const i64* slot_pos, const u32* positions,      \
                                    u32 num_heads, u32 group, u32 head_dim, u32 kv_dim,          \
                                    float scale, float softcap, i64 window, u32 slot_lo,         \
                                    u32 slot_hi, u32 per_split, u32 capacity) {                  \
        pdl_enter();                                                                             \
        attn_partial<S>(part_o, part_ml, q, kc, vc, slot_pos, positions, num_heads, group,       \
                        head_dim, kv_dim, scale, softcap, window, slot_lo, slot_hi, per_split,   \
                        capacity);                                                               \
    }
ATT_PARTIAL(attn_partial, float)
ATT_PARTIAL(attn_partial_bf16kv, u16)

// The GQA decode kernel: one block per (query row, KV head, split) and one
// warp per query head of the group, or two (P; launched with 32 · group ·
// P threads), so each key and value row is read from memory once for all
// the heads that share it (8 for gpt-oss, 4 for Llama-3-8B). The block
// walks its split's slots in tiles of T (T · head_dim ≤ 4096 values). Per
// tile:
// - all the block's threads copy the tile's key and value rows to shared
//   memory with asynchronous 16-byte copies, all in flight at once (a
//   decode step is bound by how many KV bytes are in flight), in the
//   store's dtype (a bf16 tile is half the bytes; values are widened as
//   they are used);
// - each warp scores the tile (its P-th part of it: TP = T / P keys) for
//   its own head: LPK = 32 / TP lanes share a key (every lane busy), each
//   dotting every LPK-th 16-byte chunk of the key row (4 values of an f32
//   store, 8 of a bf16 one) with the head's query, then meeting by
//   shuffles (key rows padded by LPK chunks: the lanes of a shared-memory
//   phase hit distinct banks);
// - online softmax over the tile: warp max, p = exp(score − m), the
//   output rescaled by exp(m_old − m_new);
// - values: each lane owns J consecutive dimensions; for each live slot it
//   reads them in one vector load and adds p (shuffled from the slot's
//   lane) times them.
// Each head's (first) warp then writes its partial (m, l, output). (The
// tensor-core form, P = 0, over a bf16 store with up to 8 heads a group:
// one warp a block scores and adds the tile for every head of the group
// with mma.sync instead, attention_mma.cuh; staging, visibility and the
// partials are the same.) Warps
// of one head, rather than warps that each take whole tiles for every
// head of the group: a decode step's attention is bound by the latency of
// each warp's chain of shared loads, shuffles and multiply-adds, not by
// bytes (ncu: 0.17 issued instructions a cycle per scheduler with two
// warps a block), and this makes each warp's chain `group` times shorter
// and gives the SMs `group` times more warps to overlap. J = ceil(head_dim / 32), G = the most query
// heads a group may have, S the store's element. Sums run in a different
// order from the CPU's (a dot in four interleaved pieces, a warp tree for
// the tile's max, per-lane denominators summed at the end, a pair's halves
// merged): equal up to f32 rounding. (Tiles of half the values, so twice
// the splits and warps, were slower: a block's time is its chain of
// dependent loads, not its share of the work; BENCHMARKS.md, eleventh
// session.)
#define GQA_TILE_VALUES 4096
// Two warps a query head (P = 2, the forms with head_dim 128 and 256 and
// four heads a group):
// each scores and adds half of every tile's keys (lanes a key doubled, so
// each lane's dot is half as long), and the pair merges its (m, l,
// output) once, at the end, through shared memory, as attn_combine merges
// two splits. A tile's chain after it lands (H200 timeline, Llama-8B:
// ~4.2 µs of the step kernel's ~6.5) is what a decode step waits for, and
// this halves it: Llama-8B int4 +2.7%. Their registers are capped at 40
// (GQA_BOUNDS: 48 warps an SM) so that as many blocks as before fit
// beside the streamed q/k/v GEMV they start under (PDL), and copy their
// first tile before its end: uncapped (64 registers) the bf16 model lost
// 1.6%, at 48 it lost 1.5%, at 40 it is level. Eight or more heads a
// group keep one warp a head, as a pair makes their blocks 16 warps or
// more: gpt-oss's head_dim 64 (g8) lost 2.1% with two (BENCHMARKS.md,
// thirty-second session), Qwen3-30B-A3B's 128 (g8) 1.7% (16 of its
// layers: 848.1, 844.7 tok/s against 831.9, 833.1; thirty-third).
// One warp a head keeps the one-argument bound: NVRTC 13 compiles
// `__launch_bounds__(n, 1)` differently (the head_dim-64 forms took 94-102
// registers instead of 40-62).
#define GQA_BOUNDS(G, P) GQA_BOUNDS_##P(G)
#define GQA_BOUNDS_0(G) __launch_bounds__(32)
#define GQA_BOUNDS_1(G) __launch_bounds__(32 * (G))
#define GQA_BOUNDS_2(G) __launch_bounds__(64 * (G), 24 / (G))

// The lanes 0, n, 2n, ... of a warp as a ballot mask: a whole tile's live
// slots, one bit each (n = LPK lanes a key).
__device__ constexpr u32 every_nth_lane(u32 n) {
    u32 m = 0;
    for (u32 b = 0; b < 32; b += n) m |= 1u << b;
    return m;
}

// A decode step's fused kernels (`attn_gqa_*_step`: one query row, the
// projections' q, k and v as they come out of the GEMVs) do, besides the
// GQA kernel's attention, what `rope_kv_write` would in a launch of its
// own:
// - each warp rotates its head's query in shared memory by the angles'
//   cosines and sines the block computed once (rope.cuh, so the same bits
//   as rope_kv.cu);
// - the block whose split holds this step's slot (position % capacity)
//   rotates the step's key, stores key and value and the slot's position
//   in the store, and stages them from shared memory instead of copying
//   the slot back (no other block reads that slot: it lies in no other
//   split).
// attn_combine then merges the splits as after the plain kernels. (Merging
// in the kernel instead, by the last block of each KV head to finish, was
// slower, over a full span's 68 splits and over a sliding window's six:
// BENCHMARKS.md, eighth and eleventh sessions.)
//
// The window form (`attn_gqa_*_window`, W > 0) serves a sliding span whose
// window fits W tiles: one block a KV head walks the window's positions
// (qpos + 1 − window ..= qpos, slot = position % capacity, so a wrapped
// ring is no longer the hull of its slots) instead of one split a tile
// over the whole ring. Every tile is copied before waiting for the
// projection, and the block normalises its own output, sink included,
// with no attn_combine launch: attn_combine's arithmetic for one split
// (M = max(m, sink), w = exp(m − M), out = acc · w / (l · w + exp(sink −
// M))). The tiles' scores, softmax and values are the split form's code.
// Must match `GqaStep` in src/attention.rs.
struct GqaStep {
    const float* k;       // this step's key row [kv_dim], not rotated
    const float* v;       // and its value row
    void* kc;             // the store (the kernel's kc and vc, written here)
    void* vc;
    i64* slot_pos;
    float* out;           // the window form's output [rows, heads·head_dim]
    const void* sinks;    // and its sinks (null: none), of dtype sinks_dt
    float factor;         // RoPE's attention factor
    u32 pairs;            // pairs of a head that rotate
    int sinks_dt;
    RopeFreqs freqs;
};

// The window form's normalisation of query head `qhead`'s (m, l) (its
// outputs are acc · w · inv): attn_combine's arithmetic for one split (its
// order, so its bits for the same (m, l, acc)). No live key and no sink
// gives 0/0 = NaN, as on the CPU.
__device__ __forceinline__ void one_split(float m, float l, const GqaStep& st, u32 qhead,
                                          float& w, float& inv) {
    float M = m, sink_term = 0.0f;
    if (st.sinks) {
        const float sink = load_w(st.sinks, st.sinks_dt, qhead);
        M = fmaxf(M, sink);
        sink_term = expf(sink - M);
    }
    w = m == NEG_INF ? 0.0f : expf(m - M);
    inv = 1.0f / (l * w + sink_term);
}

template <typename S, int J, int G, int P, bool STEP, int W>
__device__ __forceinline__ void attn_gqa(float* part_o, float* part_ml, const float* q,
                                         const S* kc, const S* vc, const i64* slot_pos,
                                         const u32* positions, u32 num_heads, u32 group,
                                         u32 head_dim, u32 kv_dim, float scale, float softcap,
                                         i64 window, u32 slot_lo, u32 slot_hi, u32 per_split,
                                         u32 capacity, u32 splits, const GqaStep& st) {
    constexpr u32 HD = 32 * J, H4 = HD / 4;
    constexpr u32 VEC = KV_VEC(S), CH = HD / VEC;  // values a chunk, chunks a row
    constexpr u32 T = GQA_TILE_VALUES / HD < 32 ? GQA_TILE_VALUES / HD : 32;
    constexpr bool MMA = P == 0;  // the tensor-core form (GqaMma): one warp a block
    constexpr u32 PW = MMA ? 1 : P;  // warps a head
    constexpr u32 TP = T / PW;  // keys a warp takes of each tile
    static_assert(P <= 2 && TP >= 1, "one or two warps a head, or one for the group");
    static_assert(!MMA || (sizeof(S) == 2 && G <= 8), "mma: a bf16 store, at most 8 heads");
    constexpr u32 LPK = 32 / TP;
    // Chunks a staged key and value row. The mma form pads both by one
    // chunk: rows 4 words apart mod 32 banks, so its fragment reads and
    // ldmatrix phases are conflict-free (flash_attention.cu's layout).
    constexpr u32 KS = MMA ? CH + 1 : CH + LPK;
    constexpr u32 VS = MMA ? CH + 1 : CH;
    static_assert(W == 0 || STEP, "the window form is a step form");
    constexpr u32 NB = W > 0 ? W : 1;  // tiles staged at once
    const u32 lane = threadIdx.x & 31u, head = (threadIdx.x >> 5) / PW;
    const u32 part = (threadIdx.x >> 5) % PW;  // which keys of a tile: part · TP on
    const u32 kv_heads = num_heads / group;
    const u32 row = blockIdx.x / kv_heads, kvh = blockIdx.x % kv_heads;
    const u32 split = blockIdx.y;
    __shared__ float4 qs[G * H4];
    __shared__ uint4 ks[NB * T * KS];
    __shared__ uint4 vs[NB * T * VS];
    // A split this row cannot see (past its position, outside its window:
    // most of a recorded step's splits early in a sequence, and of a
    // sliding layer's) writes nothing; attn_combine skips it. (positions
    // come from the host before any kernel of the step: the step form
    // reads them before waiting for the previous kernel.) The window form
    // walks rows [s0, s1) of positions, not slots: the window's.
    const i64 qpos = (i64)positions[row];
    u32 s0, s1;
    if constexpr (W > 0) {
        s0 = qpos + 1 > window ? (u32)(qpos + 1 - window) : 0u;
        s1 = (u32)qpos + 1;
    } else {
        split_slots(qpos, window, slot_lo, slot_hi, per_split, capacity, split, s0, s1);
        if (s0 >= s1) return;
    }
    // head_dim is a multiple of VEC (src/attention.rs): whole chunks.
    const u32 h4 = head_dim / 4, hc = head_dim / VEC, half = head_dim / 2;
    const u64 kv_off = (u64)kvh * head_dim;
    // The step's row when this block holds it (else none), and its slot:
    // its key and value come from `fresh`, not from the store. (The window
    // form always holds it: the window ends at qpos.)
    u32 cur = 0xffffffffu, cur_slot = 0;
    if (STEP) {
        cur_slot = (u32)(qpos % (i64)capacity);
        if (W > 0) {
            cur = (u32)qpos;
        } else if (cur_slot >= s0 && cur_slot < s1) {
            cur = cur_slot;
        }
    }
    // Copies of rows [t0, t0 + nk) of the store to shared memory, the
    // step's own slot left out: chunk c of row r for i = r · hc + c, the
    // block's threads striding over i.
    auto stage = [&](u32 t0, u32 nk) {
        if (head_dim == HD && blockDim.x % CH == 0) {
            // The variant's own head_dim (the usual case): each thread
            // keeps one column c and takes every rstep-th row, so its
            // source advances by an add a row, with no division or 64-bit
            // product per copy (ncu: the general loop below spent ~240
            // instructions a warp here, a sixth of the kernel).
            const u32 c = threadIdx.x % CH, rstep = blockDim.x / CH;
            const u64 src_step = (u64)rstep * kv_dim;
            u32 r = threadIdx.x / CH;
            u64 src = (u64)(t0 + r) * kv_dim + kv_off + VEC * c;
            for (; r < nk; r += rstep, src += src_step) {
                if (STEP && t0 + r == cur) continue;
                cp_async16(&ks[r * KS + c], kc + src);
                cp_async16(&vs[r * VS + c], vc + src);
            }
        } else {
            for (u32 i = threadIdx.x; i < nk * hc; i += blockDim.x) {
                const u32 r = i / hc, c = i % hc;
                if (STEP && t0 + r == cur) continue;
                const u64 src = (u64)(t0 + r) * kv_dim + kv_off + VEC * c;
                cp_async16(&ks[r * KS + c], kc + src);
                cp_async16(&vs[r * VS + c], vc + src);
            }
        }
    };
    // The window form's copies: positions [p0, p0 + nk) into staged tile
    // b. Their slots run from p0 % capacity and wrap once at most (nk ≤
    // window ≤ capacity).
    auto stage_window = [&](u32 b, u32 p0, u32 nk) {
        const u32 base = p0 % capacity;
        for (u32 i = threadIdx.x; i < nk * hc; i += blockDim.x) {
            const u32 r = i / hc, c = i % hc;
            if (p0 + r == cur) continue;
            const u32 s = base + r >= capacity ? base + r - capacity : base + r;
            const u64 src = (u64)s * kv_dim + kv_off + VEC * c;
            cp_async16(&ks[(b * T + r) * KS + c], kc + src);
            cp_async16(&vs[(b * T + r) * VS + c], vc + src);
        }
    };
    // The key this lane scores (the mma form: lane t checks key t's
    // visibility, and the warp's ballot tells every lane).
    const u32 key = MMA ? lane : part * TP + lane / LPK, sub = lane % LPK;
    // Whether this lane's key of the tile at row t0 (nk rows) is visible:
    // the step's own row holds position qpos, the others what slot_pos says.
    auto live_at = [&](u32 t0, u32 nk) {
        if (key >= nk) return false;
        const u32 r = t0 + key;
        const i64 kp = STEP && r == cur ? qpos : slot_pos[W > 0 ? r % capacity : r];
        return !(kp < 0 || kp > qpos || (window > 0 && qpos - kp >= window));
    };
    bool first_live = false;
    u32 live_tiles = 0;  // the window form's: bit b, this lane's key of tile b
    // The step's RoPE cosines and sines, one a pair (rope.cuh): every
    // head's query and the step's key rotate by the same angles, so the
    // block computes each once rather than every warp all of them.
    __shared__ float2 cs[STEP ? HD / 2 : 1];
    if constexpr (STEP) {
        // The store's other slots were written by earlier steps, not by
        // the previous kernel (the q/k/v projection): the first tile's
        // copies go out before waiting for it, so they overlap its end, as
        // do the first tile's slot positions (also written by earlier
        // steps: one dependent load fewer after the wait) and the angles
        // (the position comes from the host).
        if constexpr (W > 0) {
            for (u32 b = 0, t0 = s0; t0 < s1; b++, t0 += T) {
                stage_window(b, t0, min(T, s1 - t0));
                live_tiles |= (u32)live_at(t0, min(T, s1 - t0)) << b;
            }
        } else {
            stage(s0, min(T, s1 - s0));
            first_live = live_at(s0, min(T, s1 - s0));
        }
        for (u32 i = threadIdx.x; i < st.pairs; i += blockDim.x) {
            rope_cos_sin((u32)qpos, st.freqs.f[i], st.factor, cs[i].x, cs[i].y);
        }
        __syncthreads();
        pdl_enter();
    }
    // head_dim is a multiple of 4: the query is whole float4s. Only this
    // head's warps read it; its first writes (and rotates) it, and the
    // second reads it after the __syncthreads that lands the first tile.
    const u64 qh = (u64)row * num_heads + (u64)kvh * group + head;
    const float4* qrow = (const float4*)(q + qh * head_dim);
    float4* qq = qs + head * H4;
    if constexpr (MMA) {
        // The one warp stages (and rotates, below) every head of the group:
        // their rows are contiguous, and head_dim is HD (src/attention.rs).
        for (u32 c = lane; c < group * H4; c += 32) qs[c] = qrow[c];
    } else if (part == 0) {
        for (u32 c = lane; c < h4; c += 32) qq[c] = qrow[c];
    }
    __syncwarp();
    // The step's key and value as the store keeps them (rounded to its
    // dtype), so that this step scores them as later steps will.
    __shared__ uint4 fresh_k[STEP ? CH : 1], fresh_v[STEP ? CH : 1];
    if constexpr (STEP) {
        float* qf = (float*)qq;
        if constexpr (MMA) {
            // The one warp takes every head's pairs (i / pairs a head).
            for (u32 i = lane; i < group * st.pairs; i += 32) {
                const u32 h = i / st.pairs, pr = i - h * st.pairs;
                rotate_by(qf[h * HD + pr], qf[h * HD + pr + half], cs[pr].x, cs[pr].y);
            }
        } else {
            for (u32 i = lane; part == 0 && i < st.pairs; i += 32) {
                rotate_by(qf[i], qf[i + half], cs[i].x, cs[i].y);
            }
        }
        __syncwarp();
        if (cur != 0xffffffffu) {
            S *fk = (S*)fresh_k, *fv = (S*)fresh_v;
            S *kc_out = (S*)st.kc + (u64)cur_slot * kv_dim + kv_off;
            S *vc_out = (S*)st.vc + (u64)cur_slot * kv_dim + kv_off;
            const float *kr = st.k + kv_off, *vr = st.v + kv_off;
            for (u32 i = threadIdx.x; i < half; i += blockDim.x) {
                float a = kr[i], b = kr[i + half];
                if (i < st.pairs) rotate_by(a, b, cs[i].x, cs[i].y);
                const float c = vr[i], d = vr[i + half];
                kv_put(fk, i, a);
                kv_put(fk, i + half, b);
                kv_put(fv, i, c);
                kv_put(fv, i + half, d);
                kv_put(kc_out, i, a);
                kv_put(kc_out, i + half, b);
                kv_put(vc_out, i, c);
                kv_put(vc_out, i + half, d);
            }
            // Every KV head's block writes the same position.
            if (threadIdx.x == 0) st.slot_pos[cur_slot] = qpos;
            __syncthreads();  // fresh_k and fresh_v complete
        }
        if constexpr (W > 0) {
            // Every tile is in flight: the step's row goes in, then one
            // wait for them all.
            const u32 b = (cur - s0) / T, r = (cur - s0) % T;
            for (u32 c = threadIdx.x; c < hc; c += blockDim.x) {
                ks[(b * T + r) * KS + c] = fresh_k[c];
                vs[(b * T + r) * VS + c] = fresh_v[c];
            }
            cp_async_wait_all();
            __syncthreads();
        }
    }
    TS_PHASE(1);  // the query (and a step's key and value) in place

    GqaMma<MMA ? HD : 16, MMA ? T : 16> mm;  // the mma form's state
    if constexpr (MMA) mm.init((const float*)qs, group);
    // Per-lane denominator terms (each key's first lane holds its p); the
    // warp sums them once at the end.
    float m = NEG_INF, l = 0.0f, acc[J];
#pragma unroll
    for (int j = 0; j < J; j++) acc[j] = 0.0f;
    for (u32 t0 = s0, b = 0; t0 < s1; t0 += T, b++) {
        const u32 nk = min(T, s1 - t0);
        // This tile's staged rows (the split form has one buffer).
        const u32 buf = W > 0 ? b : 0u;
        bool live;
        if constexpr (W > 0) {
            live = (live_tiles >> b) & 1u;
        } else {
            if (!STEP || t0 != s0) stage(t0, nk);
            if (STEP && cur >= t0 && cur < t0 + nk) {
                for (u32 c = threadIdx.x; c < hc; c += blockDim.x) {
                    ks[(cur - t0) * KS + c] = fresh_k[c];
                    vs[(cur - t0) * VS + c] = fresh_v[c];
                }
            }
            live = STEP && t0 == s0 ? first_live : live_at(t0, nk);
            cp_async_wait_all();
            __syncthreads();
            TS_PHASE(2);  // a tile landed
        }
        const uint4* kt = ks + buf * T * KS;
        const S* vt = (const S*)(vs + buf * T * VS);
        if constexpr (MMA) {
            // Rows past the tile's keys hold what shared memory held: their
            // weights are 0, but 0 · NaN is not, so they are zeroed.
            uint4* vz = vs + buf * T * VS;
            for (u32 i = nk * VS + lane; i < T * VS; i += 32) vz[i] = make_uint4(0, 0, 0, 0);
            __syncwarp();
            const u32 mask = __ballot_sync(0xffffffffu, live);
            if (mask != 0) mm.tile((const u16*)kt, (const u16*)vt, mask, scale, softcap);
            __syncthreads();  // the next tile overwrites the staged rows
            continue;
        }
        // Four partial sums (value i of a chunk into component i % 4):
        // four short chains of dependent multiply-adds instead of one long
        // one.
        float4 d = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (live) {
            const uint4* kk = kt + key * KS;
#pragma unroll 8
            for (u32 c = sub; c < hc; c += LPK) dot_chunk<S>(kk[c], qq + c * (VEC / 4), d);
        }
        float sc = (d.x + d.y) + (d.z + d.w);
#pragma unroll
        for (u32 o = 1; o < LPK; o <<= 1) sc += __shfl_xor_sync(0xffffffffu, sc, o);
        // The score as the CPU forms it (scaled, softcapped), then the
        // tile's softmax step; p is the same in each of a key's lanes.
        float x = sc * scale;
        if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
        x = live ? x : NEG_INF;
        const float tmax = warp_max(x);
        if (tmax != NEG_INF) {  // some live slot in the tile (warp-uniform)
            const float mn = fmaxf(m, tmax);
            const float corr = expf(m - mn);  // 0 before the first live slot
            const float p = live ? expf(x - mn) : 0.0f;
            l = l * corr + (sub == 0 ? p : 0.0f);
#pragma unroll
            for (int j = 0; j < J; j++) acc[j] *= corr;
            m = mn;
            // Bit t · LPK: slot t0 + t is live.
            const u32 live_mask = __ballot_sync(0xffffffffu, live && sub == 0);
            if (head_dim == HD && live_mask == every_nth_lane(LPK)) {
                // A whole tile, every slot live (all but the first and last
                // tiles of a row's keys): the same sums in the same order
                // with no per-slot test or bound, fully unrolled (ncu: the
                // tested loop below took ~15 instructions a slot, a third
                // of the kernel; this takes J + 2).
#pragma unroll
                for (u32 t = 0; t < TP; t++) {
                    const float pt = __shfl_sync(0xffffffffu, p, t * LPK);
                    float v[J];
                    load_j<J>(vt + (part * TP + t) * HD + lane * J, v);
#pragma unroll
                    for (int j = 0; j < J; j++) acc[j] += pt * v[j];
                }
            } else {
                // This warp's rows of the tile: nk of one warp a head; a
                // pair's TP each, the live mask skipping those past nk.
                const u32 mine = P > 1 ? TP : nk;
#pragma unroll 4
                for (u32 t = 0; t < mine; t++) {
                    if (!((live_mask >> (t * LPK)) & 1u)) continue;
                    const float pt = __shfl_sync(0xffffffffu, p, t * LPK);
                    float v[J];
                    if (lane * J < head_dim) {
                        load_j<J>(vt + (part * TP + t) * HD + lane * J, v);
                    } else {
#pragma unroll
                        for (int j = 0; j < J; j++) v[j] = 0.0f;
                    }
#pragma unroll
                    for (int j = 0; j < J; j++) acc[j] += pt * v[j];
                }
            }
        }
        if (W == 0) __syncthreads();  // the next tile overwrites the staged rows
    }
    TS_PHASE(3);  // the products (warp 0's)
    if constexpr (MMA) {
        // Head g's (the quad's) partial, or the window form's output.
        const float sum = mm.sum();
        const u32 g = lane >> 2;
        if (g >= group) return;
        if constexpr (W > 0) {
            float w, inv;
            one_split(mm.m, sum, st, kvh * group + g, w, inv);
            mm.write(st.out + (qh + g) * head_dim, w, inv);
        } else {
            const u64 out = (qh + g) * splits + split;
            mm.write(part_o + out * head_dim, 1.0f, 1.0f);
            if ((lane & 3u) == 0) {
                part_ml[out * 2] = mm.m;
                part_ml[out * 2 + 1] = sum;
            }
        }
        return;
    }
    // No live slot: m = −inf, l = 0, output 0, which the combine skips.
    l = warp_sum(l);
    if constexpr (P > 1) {
        // The second warp's (m, l, output) through shared memory into the
        // first's, as attn_combine merges two splits; the first goes on
        // alone.
        __shared__ float mg[P > 1 ? G * (HD + 2) : 1];
        float* h = mg + head * (HD + 2);
        if (part == 1) {
#pragma unroll
            for (int j = 0; j < J; j++) h[lane * J + j] = acc[j];
            if (lane == 0) {
                h[HD] = m;
                h[HD + 1] = l;
            }
        }
        __syncthreads();
        if (part == 1) return;
        const float m1 = h[HD], l1 = h[HD + 1], mn = fmaxf(m, m1);
        if (mn != NEG_INF) {
            const float c0 = expf(m - mn), c1 = expf(m1 - mn);
            l = l * c0 + l1 * c1;
#pragma unroll
            for (int j = 0; j < J; j++) acc[j] = acc[j] * c0 + h[lane * J + j] * c1;
            m = mn;
        }
    }
    if constexpr (W > 0) {
        float w, inv;
        one_split(m, l, st, kvh * group + head, w, inv);
        float* dst = st.out + qh * head_dim;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const u32 d = lane * J + j;
            if (d < head_dim) dst[d] = acc[j] * w * inv;
        }
        return;
    }
    const u64 out = qh * splits + split;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const u32 d = lane * J + j;
        if (d < head_dim) part_o[out * head_dim + d] = acc[j];
    }
    if (lane == 0) {
        part_ml[out * 2] = m;
        part_ml[out * 2 + 1] = l;
    }
}

#define ATT_GQA_ARGS(S)                                                                          \
    float *part_o, float *part_ml, const float *q, const S *kc, const S *vc,                     \
        const i64 *slot_pos, const u32 *positions, u32 num_heads, u32 group, u32 head_dim,       \
        u32 kv_dim, float scale, float softcap, i64 window, u32 slot_lo, u32 slot_hi,            \
        u32 per_split, u32 capacity, u32 splits
#define ATT_GQA_PASS                                                                             \
    part_o, part_ml, q, kc, vc, slot_pos, positions, num_heads, group, head_dim, kv_dim, scale,  \
        softcap, window, slot_lo, slot_hi, per_split, capacity, splits

// (head_dim, group) bounds: ≤ 64 with up to 8 or 16 query heads a group,
// ≤ 128 with 4 or 8, ≤ 256 with 4; the smaller group where it fits, as its
// kernel needs fewer registers (src/attention.rs picks, and launches
// 32 · group · P threads). Each comes as the attention alone and as a
// decode step's fused kernel (GqaStep), each over an f32 store and a bf16
// one.
#define ATT_GQA_FORMS(name, S, J, G, P)                                                          \
    extern "C" __global__ void GQA_BOUNDS(G, P) name(ATT_GQA_ARGS(S)) {                          \
        pdl_enter();                                                                             \
        attn_gqa<S, J, G, P, false, 0>(ATT_GQA_PASS, GqaStep{});                                 \
    }                                                                                            \
    extern "C" __global__ void GQA_BOUNDS(G, P) name##_step(ATT_GQA_ARGS(S), GqaStep st) {       \
        attn_gqa<S, J, G, P, true, 0>(ATT_GQA_PASS, st); /* calls pdl_enter */                   \
    }
#define ATT_GQA_KERNEL(name, J, G, P)                                                            \
    ATT_GQA_FORMS(name, float, J, G, P)                                                          \
    ATT_GQA_FORMS(name##_bf16kv, u16, J, G, P)
ATT_GQA_KERNEL(attn_gqa_hd64_g8, 2, 8, 1)
ATT_GQA_KERNEL(attn_gqa_hd64_g16, 2, 16, 1)
ATT_GQA_KERNEL(attn_gqa_hd128_g4, 4, 4, 2)
ATT_GQA_KERNEL(attn_gqa_hd128_g8, 4, 8, 1)
ATT_GQA_KERNEL(attn_gqa_hd256_g4, 8, 4, 2)
// The tensor-core forms (GqaMma): over a bf16 store, head_dim exactly HD.
ATT_GQA_FORMS(attn_gqa_hd64_g8_bf16kv_mma, u16, 2, 8, 0)
ATT_GQA_FORMS(attn_gqa_hd128_g4_bf16kv_mma, u16, 4, 4, 0)
ATT_GQA_FORMS(attn_gqa_hd128_g8_bf16kv_mma, u16, 4, 8, 0)

// The window forms, W tiles of 32 slots (W · 32 positions) staged at once:
// over a bf16 store with head_dim ≤ 64 only (one warp a head), where 4
// tiles (gpt-oss's window of 128) take 34 KB of the 48 KB a block may have
// statically. A wider head's tile is twice the bytes, an f32 store's too,
// and no family pairs those with so short a window.
#define ATT_GQA_WINDOW(name, J, G, W)                                                            \
    extern "C" __global__ void GQA_BOUNDS(G, 1) name##_window(ATT_GQA_ARGS(u16), GqaStep st) {   \
        attn_gqa<u16, J, G, 1, true, W>(ATT_GQA_PASS, st); /* calls pdl_enter */                 \
    }
ATT_GQA_WINDOW(attn_gqa_hd64_g8_bf16kv, 2, 8, 4)
ATT_GQA_WINDOW(attn_gqa_hd64_g16_bf16kv, 2, 16, 4)
// The tensor-core window form (GqaMma): gpt-oss's shapes.
extern "C" __global__ void GQA_BOUNDS(8, 0) attn_gqa_hd64_g8_bf16kv_mma_window(ATT_GQA_ARGS(u16),
                                                                              GqaStep st) {
    attn_gqa<u16, 2, 8, 0, true, 4>(ATT_GQA_PASS, st); /* calls pdl_enter */
}
