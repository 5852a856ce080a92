// Flash attention for prefill (many query rows) on tensor cores, over the
// same ring KV store as attention.cu and with the same result as its
// `attn_partial` + `attn_combine` pair: visibility, GQA, scale, softcap
// before the mask, sinks in the denominator only, NaN (0/0) for a row that
// sees no key and has no sink (as the CPU and attn_combine).
//
// Geometry: one block = 4 warps = 64 query rows of one query head (grid
// ceil(n / 64) × heads); warp w owns rows 16w .. 16w + 15 of the block. The
// block walks the union of its rows' visible slot ranges in tiles of TILE
// key slots: all 128 threads load the tile's K and V rows (f32 or bf16,
// from the store: kv_store.cuh; the bf16 store's kernels are named
// `..._bf16kv`) into shared memory as bf16, then each warp computes, for its 16
// rows, S = Q·Kᵀ (16 × TILE) with mma.sync m16n8k16, scales / softcaps /
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
// Order of operations per tile, for each row: s = scale · (q·k) (f32
// accumulator); if softcap > 0, s = softcap · tanh(s / softcap); s = −inf
// where the key is not visible; m' = max(m, max_j s_j); c = exp(m − m');
// p_j = bf16(exp(s_j − m')); l = l·c + Σ_j p_j; O = O·c + P·V; m = m'.
// (While m' is still −inf, exponents are taken against 0 so that
// exp(−inf − (−inf)) never occurs: c = 0 and every p_j = 0.)
// At the end, as attn_combine: with a sink, M = max(m, sink),
// L = l·exp(m − M) + exp(sink − M), out = O·exp(m − M) · (1/L); without,
// out = O · (1/l).
//
// Shared memory (static, ≤ 48 KB): ks [TILE][HD + 8] and vt [HD][TILE + 8]
// bf16; the padding of 8 bf16 (4 words) makes the fragment reads
// conflict-free (row stride ≡ 4 words mod 32 across the 8 groups, t adds
// 0..3). HD 64, 128: TILE 64 (18 KB, 35 KB); HD 256: TILE 32 (37 KB).

#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS)
#define FA_THREADS (32 * FA_WARPS)

// Two f32 as packed bf16 (round to nearest even), `lo` in the lower half.
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

// c += a · b for one m16n8k16 tile (bf16 operands, f32 accumulator).
__device__ __forceinline__ void fa_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                       u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Over the 4 lanes of a quad (the lanes holding one row).
__device__ __forceinline__ float fa_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float fa_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// out, q [n, num_heads·HD]; kc, vc [capacity, kv_dim]; slot_pos [capacity];
// positions [n]; query head h reads KV head h / group at columns
// (h / group)·HD ..; window 0 = full span; softcap 0 = none; sinks null =
// none (else one logit per query head, dtype sinks_dt).
template <typename S, int HD, int TILE>
__device__ __forceinline__ void flash_attn(float* out, const float* q, const S* kc,
                                           const S* vc, const i64* slot_pos,
                                           const u32* positions, const void* sinks, int sinks_dt,
                                           u32 n, u32 num_heads, u32 group, u32 kv_dim,
                                           u32 capacity, float scale, float softcap, i64 window) {
    static_assert(HD % 16 == 0 && TILE % 16 == 0, "mma tiles");
    constexpr int KS = HD + 8;    // bf16 per row of ks
    constexpr int VS = TILE + 8;  // bf16 per row of vt
    __shared__ __align__(16) u16 ks[TILE * KS];  // K tile, [key][dim]
    __shared__ __align__(16) u16 vt[HD * VS];    // V tile transposed, [dim][key]
    __shared__ i64 sp[TILE];                     // slot_pos of the tile, −1 past the range
    __shared__ u32 range[2];                     // the block's slot range [lo, hi)

    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 g = lane >> 2, t = lane & 3u;
    const u32 head = blockIdx.y;
    const u32 wrow = blockIdx.x * FA_ROWS + warp * 16;  // the warp's first row
    const u64 q_width = (u64)num_heads * HD;
    const u64 kv_off = (u64)(head / group) * HD;

    // Slot range of each row: before the ring wraps (pos < capacity),
    // position p sits in slot p, so the visible slots are
    // [max(0, pos + 1 − window), pos + 1); once wrapped, the whole ring.
    // Reduced over the warp's 16 rows (kept to skip tiles) and the block.
    u32 wlo = 0xffffffffu, whi = 0;
    if (lane < 16 && wrow + lane < n) {
        const u32 p = positions[wrow + lane];
        if (p < capacity) {
            whi = p + 1;
            wlo = (window > 0 && (i64)p + 1 > window) ? (u32)((i64)p + 1 - window) : 0u;
        } else {
            wlo = 0;
            whi = capacity;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
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
    const u32 blo = range[0], bhi = range[1];  // warp 0 always has a row: blo ≤ bhi

    // This thread's two rows; a row past n sees nothing (position −1) and
    // stores nothing.
    const u32 ra = wrow + g, rb = wrow + g + 8;
    const i64 pa = ra < n ? (i64)positions[ra] : -1;
    const i64 pb = rb < n ? (i64)positions[rb] : -1;

    // Q as bf16 A fragments, once.
    u32 qf[HD / 16][4];
    {
        const float* qa = q + (u64)ra * q_width + (u64)head * HD;
        const float* qb = q + (u64)rb * q_width + (u64)head * HD;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const u32 c = 16 * kk + 2 * t;
            qf[kk][0] = ra < n ? fa_pack(qa[c], qa[c + 1]) : 0u;
            qf[kk][1] = rb < n ? fa_pack(qb[c], qb[c + 1]) : 0u;
            qf[kk][2] = ra < n ? fa_pack(qa[c + 8], qa[c + 9]) : 0u;
            qf[kk][3] = rb < n ? fa_pack(qb[c + 8], qb[c + 9]) : 0u;
        }
    }

    float o[HD / 8][4];
#pragma unroll
    for (int dj = 0; dj < HD / 8; dj++) o[dj][0] = o[dj][1] = o[dj][2] = o[dj][3] = 0.0f;
    // Running max and (this lane's part of the) sum of rows a and b.
    float ma = NEG_INF, mb = NEG_INF, la = 0.0f, lb = 0.0f;

    const bool k_pairs = (kv_dim & 1u) == 0;  // pair loads of K are aligned
    for (u32 t0 = blo; t0 < bhi; t0 += TILE) {
        __syncthreads();  // every warp is done with the previous tile
        for (u32 i = tid; i < TILE; i += FA_THREADS) {
            const u32 s = t0 + i;
            sp[i] = s < bhi ? slot_pos[s] : -1;
        }
        // K rows: thread i converts dims (d, d+1) of key i / (HD/2).
        for (u32 i = tid; i < TILE * HD / 2; i += FA_THREADS) {
            const u32 key = i / (HD / 2), d = 2 * (i % (HD / 2)), s = t0 + key;
            u32 w = 0;
            if (s < bhi) w = kv_bf16_pair(kc + (u64)s * kv_dim + kv_off + d, k_pairs);
            *(u32*)&ks[key * KS + d] = w;
        }
        // V rows, transposed: thread i converts dim d of keys (key, key+1).
        for (u32 i = tid; i < TILE / 2 * HD; i += FA_THREADS) {
            const u32 d = i % HD, key = 2 * (i / HD), s = t0 + key;
            // Widened and rounded again (exact for a bf16 store), so that
            // both stores' pairs take one pack instruction.
            const S* vr = vc + (u64)s * kv_dim + kv_off + d;
            const float v0 = s < bhi ? kv_get(vr, 0) : 0.0f;
            const float v1 = s + 1 < bhi ? kv_get(vr, kv_dim) : 0.0f;
            *(u32*)&vt[d * VS + key] = fa_pack(v0, v1);
        }
        __syncthreads();
        // Uniform over the warp: no row of it sees any slot of this tile.
        if (t0 >= whi || t0 + TILE <= wlo) continue;

        // S = Q·Kᵀ.
        float s[TILE / 8][4];
#pragma unroll
        for (int j = 0; j < TILE / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
            for (int j = 0; j < TILE / 8; j++) {
                const u32* kr = (const u32*)&ks[(8 * j + g) * KS + 16 * kk + 2 * t];
                fa_mma(s[j], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], kr[0], kr[4]);
            }
        }

        // Scale, softcap, mask; the tile's row maxima.
        float xa = NEG_INF, xb = NEG_INF;
#pragma unroll
        for (int j = 0; j < TILE / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const i64 kp = sp[8 * j + 2 * t + (e & 1)];
                const i64 qp = e < 2 ? pa : pb;
                float x = s[j][e] * scale;
                if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
                const bool seen = kp >= 0 && kp <= qp && (window <= 0 || qp - kp < window);
                x = seen ? x : NEG_INF;
                s[j][e] = x;
                if (e < 2) {
                    xa = fmaxf(xa, x);
                } else {
                    xb = fmaxf(xb, x);
                }
            }
        }
        xa = fa_quad_max(xa);
        xb = fa_quad_max(xb);
        const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
        const float ba = na == NEG_INF ? 0.0f : na, bb = nb == NEG_INF ? 0.0f : nb;
        const float ca = expf(ma - ba), cb = expf(mb - bb);  // 0 before the first key
        ma = na;
        mb = nb;

        // P = exp(S − m) as bf16 A fragments; l sums the rounded values.
        u32 pf[TILE / 8][2];
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int j = 0; j < TILE / 8; j++) {
            const u32 p0 = fa_pack(expf(s[j][0] - ba), expf(s[j][1] - ba));
            const u32 p1 = fa_pack(expf(s[j][2] - bb), expf(s[j][3] - bb));
            sa += bf16_to_f32((u16)(p0 & 0xffffu)) + bf16_to_f32((u16)(p0 >> 16));
            sb += bf16_to_f32((u16)(p1 & 0xffffu)) + bf16_to_f32((u16)(p1 >> 16));
            pf[j][0] = p0;
            pf[j][1] = p1;
        }
        la = la * ca + sa;
        lb = lb * cb + sb;
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) {
            o[dj][0] *= ca;
            o[dj][1] *= ca;
            o[dj][2] *= cb;
            o[dj][3] *= cb;
        }

        // O += P·V.
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) {
#pragma unroll
            for (int dj = 0; dj < HD / 8; dj++) {
                const u32* vr = (const u32*)&vt[(8 * dj + g) * VS + 16 * kk + 2 * t];
                fa_mma(o[dj], pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1],
                       vr[0], vr[4]);
            }
        }
    }

    // Normalise as attn_combine does.
    la = fa_quad_sum(la);
    lb = fa_quad_sum(lb);
    float fa, fb;
    if (sinks) {
        const float sink = load_w(sinks, sinks_dt, head);
        const float Ma = fmaxf(ma, sink), Mb = fmaxf(mb, sink);
        const float wa = expf(ma - Ma), wb = expf(mb - Mb);  // 0 when no key was seen
        fa = wa * (1.0f / (la * wa + expf(sink - Ma)));
        fb = wb * (1.0f / (lb * wb + expf(sink - Mb)));
    } else {
        fa = 1.0f / la;  // no key seen: 0 · inf = NaN, as attn_combine and the CPU
        fb = 1.0f / lb;
    }
    if (ra < n) {
        float* oa = out + (u64)ra * q_width + (u64)head * HD + 2 * t;
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) {
            oa[8 * dj] = o[dj][0] * fa;
            oa[8 * dj + 1] = o[dj][1] * fa;
        }
    }
    if (rb < n) {
        float* ob = out + (u64)rb * q_width + (u64)head * HD + 2 * t;
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) {
            ob[8 * dj] = o[dj][2] * fb;
            ob[8 * dj + 1] = o[dj][3] * fb;
        }
    }
}

#define FLASH_ATTN_FORM(name, S, HD, TILE)                                                       \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                     \
        name(float* out, const float* q, const S* kc, const S* vc, const i64* slot_pos,         \
             const u32* positions, const void* sinks, int sinks_dt, u32 n, u32 num_heads,        \
             u32 group, u32 kv_dim, u32 capacity, float scale, float softcap, i64 window) {      \
        pdl_enter();                                                                             \
        flash_attn<S, HD, TILE>(out, q, kc, vc, slot_pos, positions, sinks, sinks_dt, n,         \
                                num_heads, group, kv_dim, capacity, scale, softcap, window);     \
    }
// Each over an f32 store and a bf16 one.
#define FLASH_ATTN(name, HD, TILE)                                                               \
    FLASH_ATTN_FORM(name, float, HD, TILE)                                                       \
    FLASH_ATTN_FORM(name##_bf16kv, u16, HD, TILE)

FLASH_ATTN(flash_attn_hd64, 64, 64)
FLASH_ATTN(flash_attn_hd128, 128, 64)
FLASH_ATTN(flash_attn_hd256, 256, 32)
