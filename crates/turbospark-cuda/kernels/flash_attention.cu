// Flash attention for prefill (many query rows) on tensor cores, over the
// same ring KV store as attention.cu and with the same result as its
// `attn_partial` + `attn_combine` pair: visibility, GQA, scale, softcap
// before the mask, sinks in the denominator only, NaN (0/0) for a row that
// sees no key and has no sink (as the CPU and attn_combine).
//
// Geometry: one block = 4 warps = 64 query rows of one query head (grid
// ceil(n / 64) × heads); warp w owns rows 16w .. 16w + 15 of the block. The
// block walks the union of its rows' visible slot ranges in tiles of TILE
// key slots: all 128 threads stage the tile's K and V rows (f32 or bf16,
// from the store: kv_store.cuh; the bf16 store's kernels are named
// `..._bf16kv`) into shared memory as bf16 (see "Shared memory" below for
// how each form does it), then each warp computes (`fa_tile`, the same code
// for both forms), for its 16 rows, S = Q·Kᵀ (16 × TILE) with mma.sync m16n8k16, scales / softcaps /
// masks it, updates its online softmax and accumulates O += P·V (16 × HD)
// with mma.sync again. A warp skips the compute of a tile that lies
// outside all of its rows' slot ranges (the causal upper triangle).
//
// Numerics (the documented precision trade of the prefill path): the mma
// operands Q, K, P and V are bf16 (round to nearest even from f32; a bf16
// store's K and V as they are, which is the same rounding done earlier), every
// accumulation is f32 (the mma accumulators, the running max m, the
// running sum l, the rescaling), and scale, softcap, mask and exp are
// applied in f32 to the f32 accumulator. The softmax denominator sums the
// bf16-rounded P that multiplies V, so the weights of each row sum to
// exactly 1 up to f32 rounding. bf16 keeps 8 significant bits (unit
// roundoff 2^-8), so each q, k, p and v carries a relative error of up to
// 2^-8; in the weighted average they mostly cancel, and against the f32
// kernels the output differs by about 2.5e-3 of its rms per element
// (tests/flash_attention.rs asserts max |Δ| ≤ 2e-2 · rms).
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix
// fragments for mma.m16n8k16 with floating point type"), with
// g = groupID = lane >> 2 and t = threadID_in_group = lane & 3; each .b32
// register packs two bf16, the lower column / row index in the lower half:
//   A (16 × 16, row-major), 4 registers:
//     a0 = A[g][2t, 2t+1]      a1 = A[g+8][2t, 2t+1]
//     a2 = A[g][2t+8, 2t+9]    a3 = A[g+8][2t+8, 2t+9]
//   B (16 × 8, "col": column n = g holds k = 2t, 2t+1 and 2t+8, 2t+9):
//     b0 = B[2t, 2t+1][g]      b1 = B[2t+8, 2t+9][g]
//   C / D (16 × 8, f32), 4 registers:
//     c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
//
// S = Q·Kᵀ, n-tile j = keys 8j .. 8j+7, k-step kk = dims 16kk .. 16kk+15:
//   A = Q: qf[kk][0..3] as a0..a3 above with A[r][c] = q[row r][16kk + c],
//     converted once before the loop and kept in registers.
//   B[k][n] = K[key 8j + n][dim 16kk + k]: b0 is the pair of dims 16kk+2t,
//     16kk+2t+1 of key 8j+g, adjacent in the row-major bf16 tile `ks`; b1
//     the pair 8 dims further.
//   C: s[j][0..3] = S[g][8j+2t], S[g][8j+2t+1], S[g+8][8j+2t], S[g+8][8j+2t+1].
// O += P·V, k-step kk = keys 16kk .. 16kk+15, n-tile dj = dims 8dj .. 8dj+7:
//   A = P: the C layout of two adjacent S n-tiles is exactly the A layout:
//     a0 = P[g][16kk+2t, +1] = s[2kk][0, 1]      a1 = s[2kk][2, 3]
//     a2 = P[g][16kk+8+2t, +1] = s[2kk+1][0, 1]  a3 = s[2kk+1][2, 3]
//   B[k][n] = V[key 16kk + k][dim 8dj + n]: b0 pairs keys 16kk+2t, 16kk+2t+1
//     of dim 8dj+g, adjacent in the transposed bf16 tile `vt` ([dim][key]);
//     b1 the pair 8 keys further.
//   C: o[dj][0..3] = O[g][8dj+2t], O[g][8dj+2t+1], O[g+8][8dj+2t], O[g+8][8dj+2t+1].
// So each thread holds, of its warp's 16 rows, rows g ("a") and g+8 ("b");
// a row's values are spread over the 4 lanes of a quad (same g), which
// reduce with __shfl_xor_sync over lane bits 0 and 1.
//
// Order of operations per tile, for each row, in base 2 (exp(x) =
// 2^(x·log2 e): one ex2 a probability): s = scale · (q·k) (f32
// accumulator); if softcap > 0, s = softcap · tanh(s / softcap); s = s ·
// log2 e (without softcap folded into the scale: s = (scale · log2 e) ·
// (q·k)); s = −inf where the key is not visible; m' = max(m, max_j s_j);
// c = 2^(m − m'); p_j = bf16(2^(s_j − m')); l = l·c + Σ_j p_j; O = O·c +
// P·V; m = m'. (While m' is still −inf, exponents are taken against 0 so
// that 2^(−inf − (−inf)) never occurs: c = 0 and every p_j = 0.) A tile
// whose every slot every row of the warp sees skips the mask: its slots
// hold positions t0, t0 + 1, ... (checked as it is staged, at the barrier
// that publishes it) and lie in every row's span (the rows not wrapped). At the end, as attn_combine, with the sink in base 2 too
// (σ = sink · log2 e): M = max(m, σ), L = l·2^(m − M) + 2^(σ − M), out =
// O·2^(m − M) · (1/L); without, out = O · (1/l).
//
// Shared memory, by the store's dtype:
// - f32 store (`flash_attn_hdN`): one stage, static (≤ 48 KB): ks
//   [TILE][HD + 8] and vt [HD][TILE + 8] bf16, V transposed as it is
//   converted, so that a V fragment is two 32-bit reads. Every thread
//   loads its share of the tile, rounds it and stores it.
// - bf16 store (`..._bf16kv`): two stages in dynamic shared memory, each
//   ks and vs [TILE][HD + 8] bf16, filled by cp.async straight from the
//   store (its bits are the operands: nothing to convert), the next tile's
//   copies in flight while this one is computed; V fragments come
//   transposed out of the row-major tile by ldmatrix.trans. (Staging a
//   bf16 store through registers like the f32 one, with half the bytes and
//   the same count of loads, measured 42% slower on the H200 than the f32
//   store, for reasons not established; BENCHMARKS.md, eighteenth
//   session.) HD 64: 36 KB, HD 128: 68 KB, HD 256: 66 KB.
// In both, the padding of 8 bf16 (4 words) a row makes the fragment reads
// conflict-free (row stride ≡ 4 words mod 32 across the 8 groups or the 8
// rows of an ldmatrix phase, t adds 0..3). HD 64, 128: TILE 64; HD 256:
// TILE 32.

#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS)
#define FA_THREADS (32 * FA_WARPS)

// What a block and its warps know before the first tile: the slot ranges,
// this thread's two rows and their positions, and Q as bf16 A fragments.
template <int HD>
struct FaRows {
    u32 wlo, whi;  // the warp's rows' visible slots, [wlo, whi)
    u32 blo, bhi;  // the block's: the union over its warps
    u32 alo, ahi;  // slots every row of the warp sees if slot = position (empty once wrapped)
    u32 ra, rb;    // rows g and g + 8 of the warp
    i64 pa, pb;    // their positions, −1 past n (such a row sees nothing)
    u32 qf[HD / 16][4];
};

// Slot range of each row: before the ring wraps (pos < capacity),
// position p sits in slot p, so the visible slots are
// [max(0, pos + 1 − window), pos + 1); once wrapped, the whole ring.
// Reduced over the warp's 16 rows (kept to skip tiles) and the block.
// Q is converted once and kept in registers.
template <int HD>
__device__ __forceinline__ void fa_rows(FaRows<HD>& r, u32* range, const float* q,
                                        const u32* positions, u32 n, u32 num_heads,
                                        u32 capacity, i64 window) {
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 g = lane >> 2, t = lane & 3u, head = blockIdx.y;
    const u32 wrow = blockIdx.x * FA_ROWS + warp * 16;  // the warp's first row
    u32 wlo = 0xffffffffu, whi = 0, alo = 0, ahi = 0xffffffffu;
    if (lane < 16 && wrow + lane < n) {
        const u32 p = positions[wrow + lane];
        if (p < capacity) {
            whi = p + 1;
            wlo = (window > 0 && (i64)p + 1 > window) ? (u32)((i64)p + 1 - window) : 0u;
            alo = wlo;
            ahi = whi;
        } else {
            wlo = 0;
            whi = capacity;
            ahi = 0;  // wrapped: a slot's position is not its index
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
        alo = max(alo, __shfl_xor_sync(0xffffffffu, alo, o));
        ahi = min(ahi, __shfl_xor_sync(0xffffffffu, ahi, o));
    }
    if (tid == 0) {
        range[0] = 0xffffffffu;
        range[1] = 0;
    }
    __syncthreads();
    if (lane == 0) {
        atomicMin(&range[0], wlo);
        atomicMax(&range[1], whi);
    }
    __syncthreads();
    r.wlo = wlo;
    r.whi = whi;
    r.alo = alo;
    r.ahi = ahi;
    r.blo = range[0];  // warp 0 always has a row: blo ≤ bhi
    r.bhi = range[1];
    r.ra = wrow + g;
    r.rb = wrow + g + 8;
    r.pa = r.ra < n ? (i64)positions[r.ra] : -1;
    r.pb = r.rb < n ? (i64)positions[r.rb] : -1;
    const u64 q_width = (u64)num_heads * HD;
    const float* qa = q + (u64)r.ra * q_width + (u64)head * HD;
    const float* qb = q + (u64)r.rb * q_width + (u64)head * HD;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const u32 c = 16 * kk + 2 * t;
        r.qf[kk][0] = r.ra < n ? fa_pack(qa[c], qa[c + 1]) : 0u;
        r.qf[kk][1] = r.rb < n ? fa_pack(qb[c], qb[c + 1]) : 0u;
        r.qf[kk][2] = r.ra < n ? fa_pack(qa[c + 8], qa[c + 9]) : 0u;
        r.qf[kk][3] = r.rb < n ? fa_pack(qb[c + 8], qb[c + 9]) : 0u;
    }
}

// The running state of a warp's 16 rows: O, and the running max and (this
// lane's part of the) sum of rows a and b.
template <int HD>
struct FaAcc {
    float o[HD / 8][4];
    float ma, mb, la, lb;
    __device__ __forceinline__ void init() {
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) o[dj][0] = o[dj][1] = o[dj][2] = o[dj][3] = 0.0f;
        ma = mb = NEG_INF;
        la = lb = 0.0f;
    }
};

// The tile's scores s (q·k, this thread's rows a and b) in base 2, scaled
// and softcapped, −inf where MASK and the key is not visible; xa, xb their
// maxima over this thread's keys.
template <bool MASK, int TILE, class Rows>
__device__ __forceinline__ void fa_scores(float (&s)[TILE / 8][4], const i64* sp, const Rows& r,
                                          float scale, float softcap, i64 window, float& xa,
                                          float& xb) {
    const u32 t = threadIdx.x & 3u;
    const float log2e = 1.4426950408889634f;
    const float direct = softcap > 0.0f ? scale : scale * log2e;
#pragma unroll
    for (int j = 0; j < TILE / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = s[j][e] * direct;
            if (softcap > 0.0f) x = softcap * tanhf(x / softcap) * log2e;
            if (MASK) {
                const i64 kp = sp[8 * j + 2 * t + (e & 1)];
                const i64 qp = e < 2 ? r.pa : r.pb;
                const bool seen = kp >= 0 && kp <= qp && (window <= 0 || qp - kp < window);
                x = seen ? x : NEG_INF;
            }
            s[j][e] = x;
            if (e < 2) {
                xa = fmaxf(xa, x);
            } else {
                xb = fmaxf(xb, x);
            }
        }
    }
}

// One staged tile of TILE keys into the warp's rows: ks is the K tile
// ([key][HD + 8] bf16), sp its slot positions (−1: nothing), unmasked
// whether every row sees every key of it (warp-uniform), and
// vfrag(kk, dj, b) gives the B fragments of P·V for keys 16kk.. and dims
// 8dj.. (b[0], b[1]) and 8dj + 8.. (b[2], b[3]), from wherever the form
// keeps V. The order of operations is the file's; both forms run this.
template <int HD, int TILE, class VFrag>
__device__ __forceinline__ void fa_tile(const FaRows<HD>& r, FaAcc<HD>& a, bool unmasked,
                                        const u16* ks, const i64* sp, float scale,
                                        float softcap, i64 window, VFrag vfrag) {
    // S = Q·Kᵀ.
    float s[TILE / 8][4];
    fa_scores_qk<HD, TILE>(s, r.qf, ks);

    // Scale (to base 2), softcap, mask; the tile's row maxima.
    float xa = NEG_INF, xb = NEG_INF;
    if (unmasked) {
        fa_scores<false, TILE>(s, sp, r, scale, softcap, window, xa, xb);
    } else {
        fa_scores<true, TILE>(s, sp, r, scale, softcap, window, xa, xb);
    }
    xa = fa_quad_max(xa);
    xb = fa_quad_max(xb);
    const float na = fmaxf(a.ma, xa), nb = fmaxf(a.mb, xb);
    const float ba = na == NEG_INF ? 0.0f : na, bb = nb == NEG_INF ? 0.0f : nb;
    const float ca = exp2f(a.ma - ba), cb = exp2f(a.mb - bb);  // 0 before the first key
    a.ma = na;
    a.mb = nb;

    // P = exp(S − m) as bf16 A fragments; l sums the rounded values.
    u32 pf[TILE / 8][2];
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int j = 0; j < TILE / 8; j++) {
        const u32 p0 = fa_pack(exp2f(s[j][0] - ba), exp2f(s[j][1] - ba));
        const u32 p1 = fa_pack(exp2f(s[j][2] - bb), exp2f(s[j][3] - bb));
        sa += bf16_to_f32((u16)(p0 & 0xffffu)) + bf16_to_f32((u16)(p0 >> 16));
        sb += bf16_to_f32((u16)(p1 & 0xffffu)) + bf16_to_f32((u16)(p1 >> 16));
        pf[j][0] = p0;
        pf[j][1] = p1;
    }
    a.la = a.la * ca + sa;
    a.lb = a.lb * cb + sb;
#pragma unroll
    for (int dj = 0; dj < HD / 8; dj++) {
        a.o[dj][0] *= ca;
        a.o[dj][1] *= ca;
        a.o[dj][2] *= cb;
        a.o[dj][3] *= cb;
    }

    // O += P·V, two n-tiles of dims a fragment read.
#pragma unroll
    for (int kk = 0; kk < TILE / 16; kk++) {
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj += 2) {
            u32 b[4];
            vfrag(kk, dj, b);
            fa_mma(a.o[dj], pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1],
                   b[0], b[1]);
            fa_mma(a.o[dj + 1], pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0],
                   pf[2 * kk + 1][1], b[2], b[3]);
        }
    }
}

// Normalise as attn_combine does, and store rows a and b.
template <int HD>
__device__ __forceinline__ void fa_store(float* out, const FaRows<HD>& r, FaAcc<HD>& a,
                                         const void* sinks, int sinks_dt, u32 n,
                                         u32 num_heads) {
    const u32 t = threadIdx.x & 3u, head = blockIdx.y;
    const float la = fa_quad_sum(a.la), lb = fa_quad_sum(a.lb);
    float fa, fb;
    if (sinks) {
        const float sink = load_w(sinks, sinks_dt, head) * 1.4426950408889634f;  // base 2
        const float Ma = fmaxf(a.ma, sink), Mb = fmaxf(a.mb, sink);
        const float wa = exp2f(a.ma - Ma), wb = exp2f(a.mb - Mb);  // 0 when no key was seen
        fa = wa * (1.0f / (la * wa + exp2f(sink - Ma)));
        fb = wb * (1.0f / (lb * wb + exp2f(sink - Mb)));
    } else {
        fa = 1.0f / la;  // no key seen: 0 · inf = NaN, as attn_combine and the CPU
        fb = 1.0f / lb;
    }
    const u64 q_width = (u64)num_heads * HD;
    if (r.ra < n) {
        float* oa = out + (u64)r.ra * q_width + (u64)head * HD + 2 * t;
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) {
            oa[8 * dj] = a.o[dj][0] * fa;
            oa[8 * dj + 1] = a.o[dj][1] * fa;
        }
    }
    if (r.rb < n) {
        float* ob = out + (u64)r.rb * q_width + (u64)head * HD + 2 * t;
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) {
            ob[8 * dj] = a.o[dj][2] * fb;
            ob[8 * dj + 1] = a.o[dj][3] * fb;
        }
    }
}

// out, q [n, num_heads·HD]; kc, vc [capacity, kv_dim]; slot_pos [capacity];
// positions [n]; query head h reads KV head h / group at columns
// (h / group)·HD ..; window 0 = full span; softcap 0 = none; sinks null =
// none (else one logit per query head, dtype sinks_dt).
#define FA_PARAMS_OF(S)                                                                        \
    float *out, const float *q, const S *kc, const S *vc, const i64 *slot_pos,                 \
        const u32 *positions, const void *sinks, int sinks_dt, u32 n, u32 num_heads, u32 group, \
        u32 kv_dim, u32 capacity, float scale, float softcap, i64 window

// Over an f32 store: one stage, converted through registers.
template <int HD, int TILE>
__device__ __forceinline__ void flash_attn_f32(FA_PARAMS_OF(float)) {
    static_assert(HD % 16 == 0 && TILE % 16 == 0, "mma tiles");
    constexpr int KS = HD + 8;    // bf16 per row of ks
    constexpr int VS = TILE + 8;  // bf16 per row of vt
    __shared__ __align__(16) u16 ks[TILE * KS];  // K tile, [key][dim]
    __shared__ __align__(16) u16 vt[HD * VS];    // V tile transposed, [dim][key]
    __shared__ i64 sp[TILE];                     // slot_pos of the tile, −1 past the range
    __shared__ u32 range[2];                     // the block's slot range [lo, hi)
    const u32 tid = threadIdx.x, lane = tid & 31u, g = lane >> 2, t = lane & 3u;
    const u64 kv_off = (u64)(blockIdx.y / group) * HD;
    FaRows<HD> r;
    fa_rows<HD>(r, range, q, positions, n, num_heads, capacity, window);
    FaAcc<HD> a;
    a.init();
    const bool k_pairs = (kv_dim & 1u) == 0;  // pair loads of K are aligned
    for (u32 t0 = r.blo; t0 < r.bhi; t0 += TILE) {
        __syncthreads();  // every warp is done with the previous tile
        for (u32 i = tid; i < TILE; i += FA_THREADS) {
            const u32 s = t0 + i;
            sp[i] = s < r.bhi ? slot_pos[s] : -1;
        }
        // K rows: thread i converts dims (d, d+1) of key i / (HD/2).
        for (u32 i = tid; i < TILE * HD / 2; i += FA_THREADS) {
            const u32 key = i / (HD / 2), d = 2 * (i % (HD / 2)), s = t0 + key;
            u32 w = 0;
            if (s < r.bhi) w = kv_bf16_pair(kc + (u64)s * kv_dim + kv_off + d, k_pairs);
            *(u32*)&ks[key * KS + d] = w;
        }
        // V rows, transposed: thread i converts dim d of keys (key, key+1).
        for (u32 i = tid; i < TILE / 2 * HD; i += FA_THREADS) {
            const u32 d = i % HD, key = 2 * (i / HD), s = t0 + key;
            const float* vr = vc + (u64)s * kv_dim + kv_off + d;
            const float v0 = s < r.bhi ? vr[0] : 0.0f;
            const float v1 = s + 1 < r.bhi ? vr[kv_dim] : 0.0f;
            *(u32*)&vt[d * VS + key] = fa_pack(v0, v1);
        }
        // The tile published; whether its slots hold positions t0, t0 + 1, ...
        const bool exact = __syncthreads_and(tid >= TILE || sp[tid] == (i64)(t0 + tid));
        // Uniform over the warp: no row of it sees any slot of this tile.
        if (t0 >= r.whi || t0 + TILE <= r.wlo) continue;
        const bool unmasked = exact && t0 >= r.alo && t0 + TILE <= r.ahi;
        fa_tile<HD, TILE>(r, a, unmasked, ks, sp, scale, softcap, window, [&](int kk, int dj, u32* b) {
            const u32* v0 = (const u32*)&vt[(8 * dj + g) * VS + 16 * kk + 2 * t];
            const u32* v1 = (const u32*)&vt[(8 * dj + 8 + g) * VS + 16 * kk + 2 * t];
            b[0] = v0[0];
            b[1] = v0[4];
            b[2] = v1[0];
            b[3] = v1[4];
        });
    }
    fa_store<HD>(out, r, a, sinks, sinks_dt, n, num_heads);
}

// Over a bf16 store: two stages copied by cp.async (16-byte chunks: the
// head's offset is whole chunks as HD is a multiple of 8, and so is a row,
// kv_dim, as src/flash_attention.rs asserts), the next tile's in flight
// while this one is computed. Its dynamic shared memory, 2 · STAGE bf16, is launched by
// src/flash_attention.rs (`bf16_store_shared`, the same formula).
template <int HD, int TILE>
__device__ __forceinline__ void flash_attn_bf16(FA_PARAMS_OF(u16)) {
    static_assert(HD % 16 == 0 && TILE % 16 == 0, "mma tiles");
    constexpr int KS = HD + 8;                  // bf16 per row of a K or V tile
    constexpr u32 STAGE = 2 * TILE * KS;         // bf16 per stage: K, then V
    constexpr u32 CHUNKS = TILE * (HD / 8);      // 16-byte chunks of one tile
    DYNAMIC_SHARED(uint4, fa_dynamic);
    u16* const stages = (u16*)fa_dynamic;
    __shared__ i64 sp[2][TILE];
    __shared__ u32 range[2];
    const u32 tid = threadIdx.x, lane = tid & 31u;
    const u64 kv_off = (u64)(blockIdx.y / group) * HD;
    FaRows<HD> r;
    fa_rows<HD>(r, range, q, positions, n, num_heads, capacity, window);
    FaAcc<HD> a;
    a.init();
    // Tile t0's slots into stage b; slots past the range read as nothing
    // (position −1, K and V zero, as the f32 form stages them).
    auto issue = [&](u32 t0, u32 b) {
        u16* ks = stages + b * STAGE;
        u16* vs = ks + TILE * KS;
        for (u32 i = tid; i < TILE; i += FA_THREADS) {
            const u32 s = t0 + i;
            if (s < r.bhi) {
                cp_async8(&sp[b][i], slot_pos + s);
            } else {
                sp[b][i] = -1;
            }
        }
        // Rolled (8 turns at HD 128): a copy is issued, not waited on, so
        // unrolling would buy no overlap.
#pragma unroll 1
        for (u32 i = tid; i < CHUNKS; i += FA_THREADS) {
            const u32 key = i / (HD / 8), c = 8 * (i % (HD / 8)), s = t0 + key;
            const bool live = s < r.bhi;
            const u64 at = live ? (u64)s * kv_dim + kv_off + c : 0;
            cp_async16_or_zero(&ks[key * KS + c], kc + at, live);
            cp_async16_or_zero(&vs[key * KS + c], vc + at, live);
        }
        cp_async_commit();
    };
    // ldmatrix row addresses: lane l gives row l % 8 of matrix l / 8, whose
    // keys are 16kk + 8·(m % 2) .. and dims 8dj + 8·(m / 2) ..: the B
    // fragments of dims 8dj .. and 8dj + 8 .. in one instruction.
    const u32 m = lane >> 3, row = (lane & 7u) + 8 * (m & 1u), col = 8 * (m >> 1);
    const u32 tiles = (r.bhi - r.blo + TILE - 1) / TILE;
    if (tiles > 0) issue(r.blo, 0);
    for (u32 it = 0; it < tiles; it++) {
        const u32 t0 = r.blo + it * TILE, b = it & 1u;
        if (it + 1 < tiles) {
            issue(t0 + TILE, b ^ 1u);  // its stage was computed last turn
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        // Stage b complete, every thread's copies (a thread sees its own
        // after the wait); whether its slots hold positions t0, t0 + 1, ...
        const bool exact = __syncthreads_and(tid >= TILE || sp[b][tid] == (i64)(t0 + tid));
        // Uniform over the warp: no row of it sees any slot of this tile.
        if (!(t0 >= r.whi || t0 + TILE <= r.wlo)) {
            const u16* ks = stages + b * STAGE;
            const u16* vs = ks + TILE * KS;
            const bool unmasked = exact && t0 >= r.alo && t0 + TILE <= r.ahi;
            fa_tile<HD, TILE>(r, a, unmasked, ks, sp[b], scale, softcap, window,
                              [&](int kk, int dj, u32* f) {
                                  fa_ldsm_x4_trans(&vs[(16 * kk + row) * KS + 8 * dj + col], f);
                              });
        }
        __syncthreads();  // every warp is done with stage b before it is refilled
    }
    fa_store<HD>(out, r, a, sinks, sinks_dt, n, num_heads);
}

#define FLASH_ATTN_FORM(name, form, S_, HD, TILE)                                              \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) name(FA_PARAMS_OF(S_)) {           \
        pdl_enter();                                                                             \
        form<HD, TILE>(out, q, kc, vc, slot_pos, positions, sinks, sinks_dt, n, num_heads,       \
                       group, kv_dim, capacity, scale, softcap, window);                         \
    }
// Each over an f32 store and a bf16 one.
#define FLASH_ATTN(name, HD, TILE)                                                               \
    FLASH_ATTN_FORM(name, flash_attn_f32, float, HD, TILE)                                       \
    FLASH_ATTN_FORM(name##_bf16kv, flash_attn_bf16, u16, HD, TILE)

FLASH_ATTN(flash_attn_hd64, 64, 64)
FLASH_ATTN(flash_attn_hd128, 128, 64)
FLASH_ATTN(flash_attn_hd256, 256, 32)
