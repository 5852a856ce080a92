// The tensor-core form of the GQA decode kernel (attention.cu's attn_gqa
// with P = 0): one warp's tile of every query head of a group, on mma.sync
// (mma.cuh). Put in front of attention.cu (src/compile.rs), after mma.cuh.
// The tile's arithmetic only: staging, visibility and the split's partials
// are attn_gqa's.

// The tensor-core form (P = 0 of attn_gqa): one warp computes a tile for
// every head of the group with mma.sync m16n8k16 (the fragment layouts are
// flash_attention.cu's, g = lane / 4, t = lane % 4). S = Q·Kᵀ takes the
// group's heads as rows, each head's query split in two bf16 parts, q = hi
// + lo (hi = bf16(q), lo = bf16(q − hi)): hi in row g and lo in row g + 8
// of the same A fragment, so one mma gives both products, and s = q_hi·k +
// q_lo·k carries ~16 significant bits of q (the keys are bf16 as stored,
// exact). P = exp(s − m) is split the same way for O += P·V: rows g and
// g + 8 of O accumulate P_hi·V and P_lo·V, added at the end. So the result
// is the one-warp-a-head form's up to ~2⁻¹⁶ relative, where a single bf16
// operand would be off by ~2⁻⁹ (flash_attention.cu's trade, which decode
// does not make). Each lane holds head g's scores of keys 8j + 2t, 8j + 2t
// + 1 and its outputs' dims 8dj + 2t, 8dj + 2t + 1; the quad of lanes with
// the same g reduces them. Rows of heads past `group` hold zeros and are
// not stored. Why: the other forms spend a tile's ~2 µs on each warp's
// chain of shared loads, shuffles and multiply-adds; here a tile is 64
// mma and a few shuffles, in a block of one warp.
__device__ __forceinline__ float bf16_lower(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_upper(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// Two f32 as packed bf16 hi parts (`fa_pack`) and the packed bf16 of what
// each leaves (exact differences in f32).
__device__ __forceinline__ void split_pack(float a, float b, u32& hi, u32& lo) {
    hi = fa_pack(a, b);
    lo = fa_pack(a - bf16_lower(hi), b - bf16_upper(hi));
}

template <int HD, int T>
struct GqaMma {
    static constexpr u32 RS = HD + 8;  // bf16 a staged row (KS, VS chunks of attn_gqa)
    u32 qa[HD / 16][4];  // Q's A fragments (a0 .. a3: hi, lo, hi, lo)
    float o[HD / 8][4];  // c0, c1: P_hi·V of head g; c2, c3: P_lo·V
    float m, l;          // head g's running max, and this lane's part of its sum

    // The group's rotated queries `qs` ([group][HD] f32) as A fragments.
    __device__ __forceinline__ void init(const float* qs, u32 group) {
        const u32 lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float2 v = g < group ? *(const float2*)&qs[g * HD + 16 * kk + 8 * h + 2 * t]
                                           : make_float2(0.0f, 0.0f);
                split_pack(v.x, v.y, qa[kk][2 * h], qa[kk][2 * h + 1]);
            }
        }
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) o[dj][0] = o[dj][1] = o[dj][2] = o[dj][3] = 0.0f;
        m = NEG_INF;
        l = 0.0f;
    }

    // One staged tile (ks, vs: [T][RS] bf16; vs zero past the tile's
    // keys) whose live keys are the bits of `mask` (not 0). The order of
    // the other forms: the score scaled, softcapped, masked; the tile's
    // max; p = exp(s − m), the running sums rescaled by exp(m_old − m).
    __device__ __forceinline__ void tile(const u16* ks, const u16* vs, u32 mask, float scale,
                                         float softcap) {
        const u32 lane = threadIdx.x & 31u, t = lane & 3u;
        float s[T / 8][4];
        fa_scores_qk<HD, T>(s, qa, ks);  // rows g: q_hi·k, g + 8: q_lo·k
        float x[T / 8][2], xm = NEG_INF;
#pragma unroll
        for (int j = 0; j < T / 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = (s[j][e] + s[j][e + 2]) * scale;  // q_hi·k + q_lo·k
                if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
                v = (mask >> (8 * j + 2 * t + e)) & 1u ? v : NEG_INF;
                x[j][e] = v;
                xm = fmaxf(xm, v);
            }
        }
        const float mn = fmaxf(m, fa_quad_max(xm));  // finite: a key is live
        const float corr = expf(m - mn);               // 0 before the first live key
        m = mn;
        u32 ph[T / 8], pl[T / 8];
        float ps = 0.0f;
#pragma unroll
        for (int j = 0; j < T / 8; j++) {
            const float p0 = expf(x[j][0] - mn), p1 = expf(x[j][1] - mn);
            ps += p0 + p1;
            split_pack(p0, p1, ph[j], pl[j]);
        }
        l = l * corr + ps;
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) {
#pragma unroll
            for (int e = 0; e < 4; e++) o[dj][e] *= corr;
        }
        // ldmatrix row addresses (flash_attention.cu): lane l gives row
        // l % 8 of matrix l / 8, the B fragments of dims 8dj .. and 8dj + 8 ..
        const u32 mi = lane >> 3, row = (lane & 7u) + 8 * (mi & 1u), col = 8 * (mi >> 1);
#pragma unroll
        for (int kk = 0; kk < T / 16; kk++) {
#pragma unroll
            for (int dj = 0; dj < HD / 8; dj += 2) {
                u32 b[4];
                fa_ldsm_x4_trans(&vs[(16 * kk + row) * RS + 8 * dj + col], b);
                fa_mma(o[dj], ph[2 * kk], pl[2 * kk], ph[2 * kk + 1], pl[2 * kk + 1], b[0], b[1]);
                fa_mma(o[dj + 1], ph[2 * kk], pl[2 * kk], ph[2 * kk + 1], pl[2 * kk + 1], b[2],
                       b[3]);
            }
        }
    }

    // Head g's sum over the quad's lanes (every lane must call it).
    __device__ __forceinline__ float sum() const { return fa_quad_sum(l); }

    // Head g's output row at `dst` (its dims 8dj + 2t, + 1 from this
    // lane), each value times w, then times inv (the window form's
    // normalisation; 1 and 1 leave the partial exact).
    __device__ __forceinline__ void write(float* dst, float w, float inv) const {
        const u32 t = threadIdx.x & 3u;
#pragma unroll
        for (int dj = 0; dj < HD / 8; dj++) {
            *(float2*)&dst[8 * dj + 2 * t] = make_float2((o[dj][0] + o[dj][2]) * w * inv,
                                                         (o[dj][1] + o[dj][3]) * w * inv);
        }
    }
};
