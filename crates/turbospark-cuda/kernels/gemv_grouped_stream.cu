// Streamed one-row int8 GEMVs (`gemv_q8_stream`: decode, one job, no
// experts, integer activations; src/gemv.rs takes it where the ring fits).
// The `_qx` kernels (gemv_grouped.cu) keep a lane's next groups in
// registers, which takes the whole register file (two blocks of 128
// registers a thread): the next kernel's blocks cannot start beside them,
// and each warp waits a DRAM round trip a turn. Here, as in gemv_dense.cu's
// streamed kernels (stream.cuh), a producer warp copies the block's rows
// into a ring of shared-memory stages with bulk copies, starting BEFORE the
// PDL wait (weights do not depend on the previous kernel), while the
// GS_WARPS consumer warps wait, round x to codes in shared memory
// (grouped_formats.cuh's quantize_x, with the fused norm) and read the
// stages.
//
// A stage holds R whole rows (R = 8, 4, 2 or 1, the host's choice by the
// row's bytes), their codes then their scales. Rows that lie next to each
// other in a matrix go in one copy (a copy costs the copy engine a fixed
// ~110 cycles, so short ones would not keep up): a plain launch's stage is
// one run of rows, two where a segment ends inside it; a glu launch's
// virtual rows alternate gate and up (seg_of), so its stage holds the R/2
// gate rows, then the R/2 up rows: two runs. The stage's rows go to the
// warps in sets of up to QS_ROWS = 4 (as the `_qx` kernels' row quads: each
// x group read serves every row of the set), W warps a set, each its part
// of the groups, a lane a group at a time (its four x words and step, then
// each row's 32 code bytes and scale); a row's sum per group is exact in
// integers and scaled as the `_qx` kernels do (Σ_groups (scale · d) · n),
// the lanes' sums a tree of shuffles (quad_sum), the W parts summed in
// order. The block's sums go to shared memory and its outputs are written
// at the end as the dense streamed kernel writes them.

#define QS_ROWS 4

#if __CUDA_ARCH__ >= 900
// A group's 32 codes as F's words (int8: two 16-byte loads), from shared
// memory.
template <class F>
__device__ __forceinline__ void group_from_shared(const u8* p, typename F::Word* w) {
    static_assert(F::GROUP_BYTES == 32 && F::ZERO == 0, "int8 only (see the end of the file)");
    const uint4 a = ((const uint4*)p)[0], b = ((const uint4*)p)[1];
    w[0] = make_uint2(a.x, a.y); w[1] = make_uint2(a.z, a.w);
    w[2] = make_uint2(b.x, b.y); w[3] = make_uint2(b.z, b.w);
}

// The warp's sums of four rows' partials a[0..3] in 6 shuffles where four
// warp_sums take 20 (a consumer sums its rows once a stage, after one
// group a lane on 4,096-value rows, so the shuffles were much of its work;
// H200, Llama-8B int8: 285.0 → 287.7 tok/s, BENCHMARKS.md thirteenth):
// lanes swap halves (xor 16: rows 0-1 stay in the low half, 2-3 in the
// high), then single rows (xor 8), so each eight lanes hold one row, which
// xor 4, 2, 1 sum. Returns row lane / 8's sum (every lane of the eight
// holds it), added in a different tree order than warp_sum's.
__device__ __forceinline__ float quad_sum(const float (&a)[QS_ROWS], u32 lane) {
    static_assert(QS_ROWS == 4, "a lane's eighth of the warp holds one row");
    const bool h16 = lane & 16u, h8 = lane & 8u;
    float k0 = h16 ? a[2] : a[0], k1 = h16 ? a[3] : a[1];
    k0 += __shfl_xor_sync(0xffffffffu, h16 ? a[0] : a[2], 16);
    k1 += __shfl_xor_sync(0xffffffffu, h16 ? a[1] : a[3], 16);
    float v = h8 ? k1 : k0;
    v += __shfl_xor_sync(0xffffffffu, h8 ? k0 : k1, 8);
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Where virtual row i of a stage of nr rows lies in the stage: in order,
// or for glu pairs the gate rows (even i) first, then the up rows.
__device__ __forceinline__ u32 stage_pos(bool pairs, u32 i, u32 nr) {
    return pairs ? (i & 1u) * (nr / 2) + i / 2 : i;
}

// Dynamic shared memory (src/gemv/stream.rs sizes it): the ring (`stages`
// stages of R rows' codes and scales), then x's codes (k / 8 XWords) and
// steps (k / 32 floats), then each row's parts (`wpr` a row).
template <class F>
__device__ __forceinline__ void gemv_qx_stream(const GemvSegs& sg, const float* x, int bias_dt,
                                               u32 k, u32 R, u32 stages) {
    typedef typename F::XWord XWord;
    DYNAMIC_SHARED(uint4, shared_x);
    __shared__ u64 full[GS_MAX_STAGES], empty[GS_MAX_STAGES];
    __shared__ float parts[GS_WARPS];
    const u32 groups = k / 32, shift = sg.scale_shift;
    // Bytes of a row's codes and of its f16 scales (one a 32 << shift
    // values): multiples of 16, as bulk copies need (the host takes k a
    // multiple of 256 << shift).
    const u32 row_codes = groups * F::GROUP_BYTES, row_scales = (groups >> shift) * 2;
    const u32 tile = R * (row_codes + row_scales);
    u8* ring = (u8*)shared_x;
    XWord* xq = (XWord*)(ring + stages * tile);
    float* xd = (float*)(xq + k / 8);
    // A warp takes up to QS_ROWS rows of a stage at once (each x group it
    // reads serves them all), `wpr` warps a set of rows, each its part of
    // their groups.
    const u32 grs = min(R, (u32)QS_ROWS), wpr = GS_WARPS / (R / grs);
    const u32 set = (threadIdx.x >> 5) / wpr, part = (threadIdx.x >> 5) % wpr;
    float* res = xd + groups;  // [row of the block][part]
    const bool pairs = glu_segs(sg);
    u32 v0, n;
    stream_rows(sg, pairs, v0, n);
    const u32 tiles = (n + R - 1) / R;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    ring_init(full, empty, stages);
    if (warp == GS_WARPS) {
        // The producer: tile t in slot t % stages, refilled once every
        // consumer warp has released it. Its lane 0 issues the tile's
        // copies, a run of neighbouring rows each (codes, then scales).
        if (lane != 0) return;
        for (u32 t = 0; t < tiles; t++) {
            const u32 slot = t % stages, nr = min(R, n - t * R);
            if (t >= stages) mbar_wait(&empty[slot], (t / stages - 1) & 1u);
            mbar_expect(&full[slot], nr * (row_codes + row_scales));
            u8* st = ring + slot * tile;
            // Rows in stage order: run [p0, p) of segment seg from row r0.
            u32 p0 = 0, seg0 = 0, r0 = 0;
            for (u32 p = 0; p <= nr; p++) {
                u32 seg = 0, r = 0;
                if (p < nr) {
                    // The virtual row at stage position p.
                    const u32 i = pairs ? (p < nr / 2 ? 2 * p : 2 * (p - nr / 2) + 1) : p;
                    seg_of(sg, v0 + t * R + i, 1, seg, r);
                }
                if (p > p0 && (p == nr || seg != seg0 || r != r0 + (p - p0))) {
                    const u32 len = p - p0;
                    bulk_copy(st + p0 * row_codes,
                              (const u8*)pick(sg.w, seg0) + (u64)r0 * row_codes, len * row_codes,
                              &full[slot]);
                    bulk_copy(st + R * row_codes + p0 * row_scales,
                              (const u8*)pick(sg.scales, seg0) + (u64)r0 * row_scales,
                              len * row_scales, &full[slot]);
                    p0 = p;
                }
                if (p == p0) {
                    seg0 = seg;
                    r0 = r;
                }
            }
        }
        return;
    }
    pdl_enter();
    const float ss = quantize_x<F>(x, k, xq, xd, sg, GS_WARPS * 32);
    if (sg.norm) norm_part(ss, parts);
    consumers_sync();  // the codes (and the norm's parts) complete
    const float rf = sg.norm ? norm_factor(sg, parts, GS_WARPS, k, x) : 1.0f;
    TS_PHASE(1);  // x rounded (and normed)
    for (u32 t = 0; t < tiles; t++) {
        const u32 slot = t % stages, nr = min(R, n - t * R);
        mbar_wait(&full[slot], (t / stages) & 1u);
        const u8* st = ring + slot * tile;
        // This warp's rows of the stage (virtual order) and where they lie.
        const u8* codes[QS_ROWS];
        const u16* scales[QS_ROWS];
#pragma unroll
        for (u32 j = 0; j < QS_ROWS; j++) {
            const u32 p = stage_pos(pairs, min(set * grs + j, nr - 1), nr);
            codes[j] = st + p * row_codes;
            scales[j] = (const u16*)(st + R * row_codes + p * row_scales);
        }
        float acc[QS_ROWS] = {};
        if (set * grs < nr) {
            for (u32 q = part * 32 + lane; q < groups; q += 32 * wpr) {
                XWord xw[4];
#pragma unroll
                for (int j = 0; j < 4; j++) xw[j] = xq[j * groups + q];
                const float xs = xd[q];
#pragma unroll
                for (u32 r = 0; r < QS_ROWS; r++) {
                    if (r < grs) {
                        typename F::Word w[4];
                        group_from_shared<F>(codes[r] + q * F::GROUP_BYTES, w);
                        int nsum = 0;
#pragma unroll
                        for (int j = 0; j < 4; j++) nsum = F::dot_x(w[j], xw[j], nsum);
                        acc[r] += (F::value(scales[r][q >> shift]) * xs) * F::to_float(nsum);
                    }
                }
            }
        }
        // Row r's sum in lane 8r (rows past grs summed zeros).
        const float a = quad_sum(acc, lane);
        const u32 r = lane >> 3, i = set * grs + r;
        if ((lane & 7u) == 0 && r < grs && i < nr) res[(t * R + i) * wpr + part] = a;
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
        if (t == 0) TS_PHASE(2);  // the first stage's rows summed (warp 0's)
    }
    consumers_sync();  // every row's parts in res
    TS_PHASE(3);  // every stage's rows summed
    // A row's parts summed in order.
    stream_store(sg, pairs, v0, n, rf, bias_dt, [&](u32 v) {
        float s = 0.0f;
        for (u32 w = 0; w < wpr; w++) s += res[v * wpr + w];
        return s;
    });
    TS_PHASE(4);  // stored
}
#define GEMV_QX_STREAM_BODY(F) gemv_qx_stream<F>(sg, x, bias_dt, k, rows, stages);
#else
#define GEMV_QX_STREAM_BODY(F) __trap();
#endif  // __CUDA_ARCH__ >= 900

#define GEMV_QX_STREAM_KERNEL(name, F)                                                           \
    extern "C" __global__ void __launch_bounds__(GS_THREADS, 2)                                  \
        name(GemvSegs sg, const float* x, int bias_dt, u32 k, u32 rows, u32 stages) {            \
        GEMV_QX_STREAM_BODY(F) /* consumers: pdl_enter */                                        \
    }
// Int4 keeps the `_qx` kernels. Streamed (this kernel on Q4, with a 16-byte
// group load and the zero-point term of the `_qx` kernels; equal to them
// within 2e-5 in the tests) it read at most ~1.9 TB/s on the H200, even
// over the 295 MB lm_head (157 µs; ncu: 14% of warp slots active, 1.2
// instructions a cycle an SM): Llama-8B int4 313 against 385 tok/s. Neither
// more copies nor cheaper consumers lifted it (BENCHMARKS.md, twelfth and
// thirteenth sessions): copies cut into 4 KB pieces over the producer's
// lanes fell to 234 (int8: 205, against 274 unstreamed), 16-row stages
// with quad_sum reached 321.
GEMV_QX_STREAM_KERNEL(gemv_q8_stream, Q8)
