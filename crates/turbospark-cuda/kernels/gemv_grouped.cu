// Grouped formats (MXFP4, int8, int4): codes in groups of 32 values, one
// scale a group (int8/int4: a group of 32 << sg.scale_shift values).
// A weight byte here stands for 2-4 values, so x (f32) is 8-16 times the
// bytes of the weights it meets: reading x is what limits these kernels
// unless it is shared. Layout: each warp computes GR = 4 rows at once and
// four lanes share a group, each taking 8 of its values (a 4-byte word of
// MXFP4/int4 codes, 8 bytes of int8), so the warp's x reads are contiguous
// (coalesced) and each x value loaded is used for GR rows. A block is 8
// warps; W = `wpr` warps split a row quad's groups round-robin and meet in
// shared memory. Per lane: acc += scale · (8-value dot) — the CPU sums a
// group unscaled before scaling, so results differ by rounding order only.
// The formats and x's rounding are grouped_formats.cuh's.
#define GR 4

// acc[i][t] += s[i] · Σ_{8 values} w_i · x_t for one step of one lane.
template <int NX, class F>
__device__ __forceinline__ void grouped_step(const typename F::Word* raw,
                                             const typename F::Scale* s,
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
                acc[i][t] += F::value(s[i]) * d;
            }
        }
    }
}

// The row quad a warp of a grouped kernel computes: rows r0 .. r0 + GR of
// segment `seg` (r0 = m past the last segment: nothing is computed). A
// GLU_SEGS launch's quad is gate rows r0, r0 + 1 and up rows r0, r0 + 1,
// as rows 0, 2 (segment 0) and 1, 3 (segment 1): each pair meets in the
// warp's own registers, so no warp waits for another's loads to write its
// activations (pairing gate and up quads of neighbouring warps, which met
// at a barrier each turn, cost 3 µs of Llama-8B int4's 21 µs gate/up).
struct Quad {
    u32 lane, warp, part, m, r0;
    const u8* codes[2];      // row i's are codes[i & 1] (the same but for GLU_SEGS)
    const void* scales[2];
    const void* bias;        // the segment's (GLU_SEGS: the gate's; sg.bias[1] is up's)
    float* out;
    u64 e;      // expert of this job (0 without experts)
    u64 g0[GR];  // each row's first group; rows past m read the last row
    u32 shift;   // sg.scale_shift: group g's scale is scale g >> shift
    __device__ __forceinline__ const u8* codes_of(int i) const { return codes[i & 1]; }
    __device__ __forceinline__ const void* scales_of(int i) const { return scales[i & 1]; }
};

// Row i's scale for its group q, raw (a row's groups lie at g0[i] on in the
// codes, and their scales at (g0[i] + q) >> shift: rows are whole scale
// groups, so the flat index needs no row of its own).
template <class F>
__device__ __forceinline__ typename F::Scale scale_of(const Quad& d, int i, u64 q) {
    return F::scale(d.scales_of(i), (d.g0[i] + q) >> d.shift);
}

// `vb`: the block of work (blockIdx.y, or a persistent block's turn); `e`:
// the job's expert (0 without experts).
__device__ __forceinline__ Quad quad_at(const GemvSegs& sg, u64 e, u32 k, u32 wpr, u32 vb) {
    Quad d;
    d.lane = threadIdx.x & 31u;
    d.warp = threadIdx.x >> 5;
    d.part = d.warp % wpr;
    const u32 v0 = (vb * ((blockDim.x >> 5) / wpr) + d.warp / wpr) * GR;
    const u32 groups = k / 32;
    d.e = e;
    d.shift = sg.scale_shift;
    if (glu_segs(sg)) {
        // Virtual rows alternate gate and up (seg_of at one row).
        d.m = sg.m[0];
        d.r0 = min(v0 / 2, d.m);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            d.codes[i] = (const u8*)sg.w[i];
            d.scales[i] = sg.scales[i];
        }
        d.bias = sg.bias[0];
        d.out = sg.out[0];
#pragma unroll
        for (int i = 0; i < GR; i++) d.g0[i] = (u64)min(d.r0 + i / 2, d.m - 1) * groups;
        return d;
    }
    u32 seg = 0, r0 = 0;
    const bool any = seg_of(sg, v0, GR, seg, r0);
    d.m = pick(sg.m, seg);
    d.r0 = any ? r0 : d.m;
    d.codes[0] = d.codes[1] = (const u8*)pick(sg.w, seg);
    d.scales[0] = d.scales[1] = pick(sg.scales, seg);
    d.bias = pick(sg.bias, seg);
    d.out = pick(sg.out, seg);
#pragma unroll
    for (int i = 0; i < GR; i++) {
        d.g0[i] = (d.e * d.m + glu_row(sg, d.m, min(d.r0 + i, d.m - 1))) * groups;
    }
    return d;
}

__device__ __forceinline__ Quad quad_of(const GemvSegs& sg, const int* experts, u32 k, u32 wpr,
                                        u32 vb) {
    return quad_at(sg, experts ? (u64)experts[blockIdx.x] : 0, k, wpr, vb);
}

// A row quad's W warps exchange partial sums in grouped_store. They meet at
// a barrier of their own (named barrier 1 + team), not the block's: a
// block-wide barrier each turn would hold every warp to the slowest warp's
// loads, and the warps' loads are what keeps DRAM busy.
__device__ __forceinline__ void team_sync(u32 wpr) {
    if (wpr > 1) {
        named_barrier(1 + (threadIdx.x >> 5) / wpr, 32 * wpr);
    }
}

// Sums each row's partials over the lanes, then over the quad's W warps in
// warp order, and stores them (with the bias, row i's in lane i of `bias`:
// bias_rows) from the quad's first lane;
// a glu launch's quad is two (gate, up) pairs, whose activations it writes.
// With `held` (NX = 1, accumulate), lane i holds what row i's output held,
// loaded before the products (held_rows) so the store need not wait for
// it: a one-turn launch's last round trip (Llama-8B int4's o projection
// spent 0.8 µs of 8.7 on it). gemv_dense.cu's store does not: the same
// there measured 1% slower on Llama-8B bf16 and level on gpt-oss-20b.
template <int NX>
__device__ __forceinline__ void grouped_store(const GemvSegs& sg, float (*acc)[NX], const Quad& d,
                                              float bias, u32 nx, u32 wpr, float r,
                                              bool accumulate, const float* held = nullptr) {
    __shared__ float part_sum[8][GR][NX];
#pragma unroll
    for (int i = 0; i < GR; i++) {
#pragma unroll
        for (u32 t = 0; t < NX; t++) acc[i][t] = warp_sum(acc[i][t]);
    }
    if (wpr > 1) {
        if (d.lane == 0) {
#pragma unroll
            for (int i = 0; i < GR; i++) {
#pragma unroll
                for (u32 t = 0; t < NX; t++) part_sum[d.warp][i][t] = acc[i][t];
            }
        }
        team_sync(wpr);
        if (d.part == 0) {
#pragma unroll
            for (int i = 0; i < GR; i++) {
#pragma unroll
                for (u32 t = 0; t < NX; t++) {
                    float v = part_sum[d.warp][i][t];
                    for (u32 w = 1; w < wpr; w++) v += part_sum[d.warp + w][i][t];
                    acc[i][t] = v;
                }
            }
        }
    }
    const u32 job = blockIdx.x;
    float b[GR], prev[GR];
#pragma unroll
    for (int i = 0; i < GR; i++) b[i] = __shfl_sync(0xffffffffu, bias, i);
    if (held) {
#pragma unroll
        for (int i = 0; i < GR; i++) prev[i] = __shfl_sync(0xffffffffu, *held, i);
    }
    if (d.part != 0 || d.lane != 0) return;
    if (glu_segs(sg)) {
        // Rows 0, 1 are gate and up of pair r0; rows 2, 3 of pair r0 + 1
        // (NX = 1: one row of x with a fused norm).
#pragma unroll
        for (int i = 0; i < GR; i += 2) {
            const u32 c = d.r0 + i / 2;
            if (c < d.m) {
                const float g = acc[i][0] * r + b[i];
                const float u = acc[i + 1][0] * r + b[i + 1];
                d.out[(u64)job * d.m + c] = glu_value(sg, g, u);
            }
        }
        return;
    }
    if (sg.glu) {
#pragma unroll
        for (int i = 0; i < GR; i += 2) {
            const u32 row = d.r0 + i;  // gate; row + 1 is its up (m is even)
            if (row >= d.m) break;
#pragma unroll
            for (u32 t = 0; t < NX; t++) {
                if (t < nx) {
                    const float g = acc[i][t] * r + b[i];
                    const float u = acc[i + 1][t] * r + b[i + 1];
                    d.out[((u64)job * nx + t) * (d.m / 2) + row / 2] = glu_value(sg, g, u);
                }
            }
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < GR; i++) {
        const u32 row = d.r0 + i;
        if (row >= d.m) break;
#pragma unroll
        for (u32 t = 0; t < NX; t++) {
            if (t < nx) {
                float* out = &d.out[((u64)job * nx + t) * d.m + row];
                // The CPU's order: the product scaled, the bias, then
                // what out held.
                float v = acc[i][t] * r + b[i];
                if (held) {
                    v += prev[i];
                } else if (accumulate) {
                    v += *out;
                }
                *out = v;
            }
        }
    }
}

// The bias of row i of quad `d` as grouped_store adds it (0 without one),
// in lane i of the quad's first warp: read as the quad starts, its round
// trip (a DRAM one: a step's biases have left L2 by the next step) hidden
// by the weights' rather than on the store's path after the products.
__device__ __forceinline__ float bias_rows(const GemvSegs& sg, const Quad& d, int bias_dt) {
    const u32 i = d.lane;
    if (d.part != 0 || i >= GR) return 0.0f;
    if (glu_segs(sg)) {
        // Rows 0, 2 are gates (segment 0's bias), 1, 3 ups (segment 1's).
        const u32 c = d.r0 + i / 2;
        const void* bias = (i & 1) ? sg.bias[1] : d.bias;
        return bias && c < d.m ? load_w(bias, bias_dt, c) : 0.0f;
    }
    const u32 row = d.r0 + i;
    if (!d.bias || row >= d.m) return 0.0f;
    return load_w(d.bias, bias_dt, d.e * d.m + glu_row(sg, d.m, row));
}

template <int NX, class F>
__device__ __forceinline__ void gemv_grouped(const GemvSegs& sg, const float* x, int bias_dt,
                                             const int* experts, u32 nx, u32 x_div, u32 k,
                                             u32 wpr) {
    pdl_enter();
    const Quad d = quad_of(sg, experts, k, wpr, blockIdx.y);
    const float bias = bias_rows(sg, d, bias_dt);
    const u32 groups = k / 32, sub = d.lane & 3u;
    const float* xb = x + (u64)(blockIdx.x / x_div) * nx * k;
    float acc[GR][NX];
#pragma unroll
    for (int i = 0; i < GR; i++) {
#pragma unroll
        for (u32 t = 0; t < NX; t++) acc[i][t] = 0.0f;
    }
    if (d.r0 < d.m) {
        const u32 step = 8 * wpr;  // groups a step of the row quad's warps covers
        u32 q = d.part * 8 + (d.lane >> 2);
        constexpr int U = F::UNROLL;
        for (; q + (U - 1) * step < groups; q += U * step) {
            typename F::Word raw[U][GR];
            typename F::Scale s[U][GR];
#pragma unroll
            for (int u = 0; u < U; u++) {
#pragma unroll
                for (int i = 0; i < GR; i++) {
                    raw[u][i] = F::fetch(d.codes_of(i), d.g0[i] + q + u * step, sub);
                    s[u][i] = scale_of<F>(d, i, q + u * step);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                grouped_step<NX, F>(raw[u], s[u], xb + (u64)(q + u * step) * 32 + 8 * sub, nx, k, acc);
            }
        }
        // The last steps one at a time: fetching them together (as the
        // integer-activation kernel does) makes the one-row variants spill.
        for (; q < groups; q += step) {
            typename F::Word raw[GR];
            typename F::Scale s[GR];
#pragma unroll
            for (int i = 0; i < GR; i++) {
                raw[i] = F::fetch(d.codes_of(i), d.g0[i] + q, sub);
                s[i] = scale_of<F>(d, i, q);
            }
            grouped_step<NX, F>(raw, s, xb + (u64)q * 32 + 8 * sub, nx, k, acc);
        }
    }
    grouped_store<NX>(sg, acc, d, bias, nx, wpr, 1.0f, sg.accumulate != 0);
}

// The E2M1 lookup needs more registers: three blocks per SM.
GEMV_KERNELS(gemv_mxfp4, gemv_grouped, Mxfp4, 3)
GEMV_KERNELS(gemv_q8, gemv_grouped, Q8, 4)
GEMV_KERNELS(gemv_q4, gemv_grouped, Q4, 4)

// What the output rows of quad `d` hold, row i in lane i of its first
// warp (grouped_store's `held`): read as the quad starts, its round trip
// hidden by the weights'.
__device__ __forceinline__ float held_rows(const Quad& d) {
    const u32 row = d.r0 + d.lane;
    return d.part == 0 && d.lane < GR && row < d.m ? d.out[(u64)blockIdx.x * d.m + row] : 0.0f;
}

// The integer-activation kernels (the scheme: grouped_formats.cuh).
// A lane's group in each of the GR rows, raw: codes and scales.
template <class F>
struct GroupWords {
    typename F::Word w[GR][4];
    typename F::Scale s[GR];
    __device__ __forceinline__ void fetch(const Quad& d, u32 q) {
#pragma unroll
        for (int i = 0; i < GR; i++) {
            F::fetch_group(d.codes_of(i), d.g0[i] + q, w[i]);
            s[i] = scale_of<F>(d, i, q);
        }
    }
    // The lines `fetch` will read, into L2.
    static __device__ __forceinline__ void prefetch(const Quad& d, u32 q) {
#pragma unroll
        for (int i = 0; i < GR; i++) {
            prefetch_l2(d.codes_of(i) + (d.g0[i] + q) * F::GROUP_BYTES);
            prefetch_l2((const u8*)d.scales_of(i) +
                        ((d.g0[i] + q) >> d.shift) * sizeof(typename F::Scale));
        }
    }
};

// Groups a lane has in flight at once (GR rows each). Four (the row's rest
// two at a time, no spills) measured slower on the H200 in alternating
// processes: Llama-8B int4 381 -> 364 tok/s, int8 272 -> 264, gpt-oss-20b
// 433 -> 421. Three (128 registers, no spills; one round of loads a row
// of gpt-oss's 90 groups) also: gpt-oss-20b 541.8 -> 533.3, Llama-8B int4
// with 16 layers 955.1 -> 914.0 (one call, 2026-12-03).
#define QX_UNROLL 2

template <class F>
__device__ __forceinline__ void gemv_grouped_qx(const GemvSegs& sg, const float* x, int bias_dt,
                                                const int* experts, u32 nx, u32 x_div, u32 k,
                                                u32 wpr) {
    typedef typename F::XWord XWord;
    DYNAMIC_SHARED(uint4, shared_x);
    XWord* xq = (XWord*)shared_x;
    float* xd = (float*)(xq + k / 8);
    const u32 groups = k / 32, step = 32 * wpr;  // groups a step of a quad's warps covers
    constexpr int U = QX_UNROLL;
    // Weights do not depend on the previous kernel: the first turn's first
    // fetch (U steps) is issued before waiting for it (programmatic
    // dependent launch), so that its round trip overlaps the wait and x's
    // rounding; unless experts pick the rows that the previous kernel may
    // still be writing (`sg.experts_settled` says they were written before
    // it: an MoE's down, two launches after its routing). The expert is
    // then read past L1 (the read after the wait must not find this one's
    // line) and checked after the wait: the early fetch is used only for
    // the expert the job turns out to have (gpt-oss-20b, one call,
    // alternated: 522.3, 522.2 -> 530.0, 528.8 tok/s).
    // Into registers (`raw`, kept for the turn's first fetch: `early`)
    // where they stay clear of the rounding's (int4, MXFP4), else into L2
    // (int8: its 32-byte groups held through the rounding spill 1 KB; one
    // of its two steps held measured level, 651.0, 651.9 -> 651.2, 650.5
    // on 16-layer Llama int8). Registers against L2 on the H200, one call,
    // alternated: Llama-8B int4 with 16 layers 956.0, 956.5 -> 997.9,
    // 991.6 tok/s (the L2 round trip after the rounding was on every
    // launch's path).
    constexpr bool IN_REGS = sizeof(GroupWords<F>) * U <= 192;
    GroupWords<F> raw[U];
    bool early = false;
    u64 e_early = 0;
    if (experts == nullptr || sg.experts_settled) {
        if (experts) e_early = (u64)__ldcg(experts + blockIdx.x);
        const Quad d = quad_at(sg, e_early, k, wpr, blockIdx.y);  // r0 = m past the rows
        const u32 q = d.part * 32 + d.lane;
        if (d.r0 < d.m && q < groups) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const u32 qu = q + u * step < groups ? q + u * step : q;
                if (IN_REGS) {
                    raw[u].fetch(d, qu);
                } else {
                    GroupWords<F>::prefetch(d, qu);
                }
            }
            early = IN_REGS;
        }
    }
    pdl_enter();
    const float* xr = x + (u64)(blockIdx.x / x_div) * k;
    const float ss = quantize_x<F>(xr, k, xq, xd, sg, blockDim.x);
    __shared__ float parts[8];
    if (sg.norm) norm_part(ss, parts);
    __syncthreads();  // the codes (and the norm's parts) complete
    const float r = sg.norm ? norm_factor(sg, parts, blockDim.x >> 5, k, xr) : 1.0f;
    TS_PHASE(1);  // x rounded (and normed)
    // Persistent: this block takes blocks of work blockIdx.y, + gridDim.y,
    // ... of the job, reusing the rounded x (the same count for every warp
    // of the block, so the exchange in grouped_store stays in step).
    u32 quads = 0;
#pragma unroll
    for (u32 i = 0; i < GEMV_MAX_SEGS; i++) {
        if (i < sg.count) quads += (pick(sg.m, i) + GR - 1) / GR;
    }
    const u32 per_block = (blockDim.x >> 5) / wpr;
    const u32 work = (quads + per_block - 1) / per_block;
    for (u32 vb = blockIdx.y; vb < work; vb += gridDim.y) {
        const Quad d = quad_of(sg, experts, k, wpr, vb);
        if (d.e != e_early) early = false;  // fetched for another expert
        const bool add = sg.accumulate != 0;
        const float held = add ? held_rows(d) : 0.0f;
        const float bias = bias_rows(sg, d, bias_dt);
        float acc[GR][1];
#pragma unroll
        for (int i = 0; i < GR; i++) acc[i][0] = 0.0f;
        // Group q of the GR rows. Its x codes are read once; with a zero
        // point (int4, MXFP4) the group's sum takes ZERO · Σ x codes off.
        auto group_at = [&](const GroupWords<F>& g, u32 q) {
            XWord xw[4];
#pragma unroll
            for (int j = 0; j < 4; j++) xw[j] = xq[j * groups + q];
            const float xs = xd[q];
            int xoff = 0;
            if (F::ZERO) {
#pragma unroll
                for (int j = 0; j < 4; j++) xoff = x_sum(xw[j], xoff);
                xoff *= F::ZERO;
            }
#pragma unroll
            for (int i = 0; i < GR; i++) {
                int n = -xoff;
#pragma unroll
                for (int j = 0; j < 4; j++) n = F::dot_x(g.w[i][j], xw[j], n);
                acc[i][0] += (F::value(g.s[i]) * xs) * F::to_float(n);
            }
        };
        if (d.r0 < d.m) {
            // The main loop runs while every lane's U steps lie in the row
            // (a count the warp shares, so its lanes never split between
            // the loops); the rest of the row, at most U steps, is also in
            // flight at once, in a block of its own so that the main loop
            // keeps its registers.
            const u32 first = d.part * 32, span = 32 + (U - 1) * step;
            const u32 full = groups >= first + span ? (groups - first - span) / (U * step) + 1 : 0;
            u32 q = first + d.lane;
            for (u32 it = 0; it < full; it++, q += U * step) {
                if (!early) {
#pragma unroll
                    for (int u = 0; u < U; u++) raw[u].fetch(d, q + u * step);
                }
                early = false;
#pragma unroll
                for (int u = 0; u < U; u++) group_at(raw[u], q + u * step);
            }
            if (q < groups) {
                if (!early) {
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        raw[u].fetch(d, q + u * step < groups ? q + u * step : q);
                    }
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (q + u * step < groups) group_at(raw[u], q + u * step);
                }
            }
        }
        early = false;  // only the first turn's first fetch came early
        TS_PHASE(2);  // this turn's products (warp 0's), before the exchange
        grouped_store<1>(sg, acc, d, bias, 1, wpr, r, add, add ? &held : nullptr);
        team_sync(wpr);  // the next turn rewrites the team's exchanges
        TS_PHASE(3);  // this turn stored
    }
    TS_BLOCK_END(9);  // every warp's turns stored
}

#define GEMV_QX_KERNEL(name, F, minb)                                                            \
    extern "C" __global__ void __launch_bounds__(256, minb) name(GEMV_ARGS) {                   \
        gemv_grouped_qx<F>(GEMV_PASS); /* calls pdl_enter */                                     \
    }

// Two blocks an SM: 16 warps with U groups of 4 rows each in flight. Three
// (80 registers) measured slower on the H200: Llama-8B int4 380 -> 358
// tok/s, int8 271 -> 243, gpt-oss-20b level.
GEMV_QX_KERNEL(gemv_mxfp4_qx, Mxfp4, 2)
GEMV_QX_KERNEL(gemv_q8_qx, Q8, 2)
GEMV_QX_KERNEL(gemv_q4_qx, Q4, 2)
