// kernels/gemv_dense.cu and gemv_grouped_stream.cu run on the CPU
// (cuda_shim.h), against the host in f64 (gemv_check.h):
// - the dense GEMVs (`gemv_f32`, `gemv_bf16`, `gemv_f16` and their `_x1`
//   forms) with segments, biases, a fused norm and its normed row,
//   residual adds, both gate/up activations, expert jobs, rows not a
//   multiple of 8 values (the scalar path) and persistent blocks;
// - the streamed ones, whose producer warp fills a shared-memory ring with
//   bulk copies on mbarriers (emulated: copies land at the latest the GPU
//   may, so a stage read early or refilled before its release shows):
//   `gemv_bf16_stream`, `gemv_f16_stream` (stages of 8 rows × kc values)
//   and `gemv_q8_stream` (int8, stages of R whole rows, x rounded to int8
//   as the `_qx` kernels round it), over rings that wrap, segments that end
//   inside a stage, gate/up pairs, a fused norm and residual adds.
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include "cuda_shim.h"
#include "gemv_common.cuh"
#include "stream.cuh"
#include "gemv_dense.cu"
#include "grouped_formats.cuh"
#include "gemv_grouped_stream.cu"
#include "gemv_check.h"

typedef void (*Plain)(GemvSegs, const float*, int, const int*, u32, u32, u32, u32);
typedef void (*Stream)(GemvSegs, const float*, int, u32, u32, u32);

struct Dense {
    const char* name;
    int dt;
    Plain plain, x1;
    Stream stream;  // null: none (f32)
};
static const Dense DENSE[3] = {
    {"f32", DT_F32, gemv_f32, gemv_f32_x1, nullptr},
    {"bf16", DT_BF16, gemv_bf16, gemv_bf16_x1, gemv_bf16_stream},
    {"f16", DT_F16, gemv_f16, gemv_f16_x1, gemv_f16_stream},
};

// Random values of `rows` rows exactly representable in the dtype
// (f16: magnitudes 2^−4 to 2^2).
static void fill_dense(int dt, u32 k, Seg& s, u64 rows, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> bits(0, 65535);
    const u64 n = rows * k;
    s.w.resize(n);
    s.codes.resize(n * (dt == DT_F32 ? 4 : 2));
    for (u64 i = 0; i < n; i++) {
        if (dt == DT_F32) {
            const float v = nd(rng);
            std::memcpy(&s.codes[4 * i], &v, 4);
            s.w[i] = v;
            continue;
        }
        u16 h;
        if (dt == DT_BF16) {
            h = f32_to_bf16(nd(rng));
        } else {
            const int b = bits(rng);
            h = (u16)((b & 0x83ff) | ((11 + b % 7) << 10));
        }
        std::memcpy(&s.codes[2 * i], &h, 2);
        s.w[i] = dt == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
}

// int8 rows as the --quant format: 32 codes in ±127 and an f16 scale a group.
static void fill_q8(u32 k, Seg& s, u64 rows, std::mt19937& rng) {
    std::uniform_int_distribution<int> code(-127, 127), mant(0, 1023);
    const u64 groups = rows * (k / 32);
    s.codes.resize(groups * 32);
    s.scales.resize(groups * 2);
    s.w.resize(rows * k);
    for (u64 g = 0; g < groups; g++) {
        const u16 h = (u16)((8 << 10) | mant(rng));
        std::memcpy(&s.scales[2 * g], &h, 2);
        for (u32 i = 0; i < 32; i++) {
            const int c = code(rng);
            s.codes[g * 32 + i] = (u8)(int8_t)c;
            s.w[g * 32 + i] = c * (double)f16_to_f32(h);
        }
    }
}

static bool run_dense(const Dense& d, const Case& c, u32 seed) {
    Launch l(c, seed, [&](Seg& s, u64 rows, std::mt19937& rng) { fill_dense(d.dt, c.k, s, rows, rng); });
    const Plain kernel = c.nx == 1 ? d.x1 : d.plain;
    launch(l.jobs, c.grid_y, 256,
           [&] { kernel(l.sg, l.x.data(), DT_F32, l.experts_ptr(), c.nx, c.x_div, c.k, c.wpr); },
           c.norm ? 4 * c.k : 0);
    const std::string name = std::string("gemv_") + d.name + (c.nx == 1 ? "_x1" : "");
    return l.check(name.c_str(), 0);
}

// A streamed launch: `blocks` blocks along y, `a` and `b` its ring's two
// numbers (values a row a stage and stages; int8: rows a stage and stages).
struct Ring {
    u32 blocks, a, b;
};

static size_t rows_of(const Case& c) {
    size_t n = 0;
    for (u32 m : c.m) n += m;
    return n;
}

static bool run_stream(const Dense& d, const Case& c, Ring r, u32 seed) {
    Launch l(c, seed, [&](Seg& s, u64 rows, std::mt19937& rng) { fill_dense(d.dt, c.k, s, rows, rng); });
    const size_t size = d.dt == DT_F32 ? 4 : 2;
    const size_t shared = (size_t)r.b * GS_WARPS * r.a * size + 4 * c.k + 4 * (rows_of(c) + 8);
    launch(1, r.blocks, GS_THREADS, [&] { d.stream(l.sg, l.x.data(), DT_F32, c.k, r.a, r.b); },
           shared);
    const std::string name = std::string("gemv_") + d.name + "_stream";
    return l.check(name.c_str(), 0);
}

static bool run_q8_stream(const Case& c, Ring r, u32 seed) {
    Launch l(c, seed, [&](Seg& s, u64 rows, std::mt19937& rng) { fill_q8(c.k, s, rows, rng); });
    const size_t row = c.k / 32 * 34;
    const size_t shared = (size_t)r.b * r.a * row + c.k + c.k / 32 * 4 + 4 * 8 * (rows_of(c) + 8);
    launch(1, r.blocks, GS_THREADS, [&] { gemv_q8_stream(l.sg, l.x.data(), DT_F32, c.k, r.a, r.b); },
           shared);
    return l.check("gemv_q8_stream", 127);
}

int main() {
    bool ok = true;
    u32 seed = 101;
    std::vector<Case> cases = shared_cases();
    Case odd{"100 values a row (the scalar path), wpr 2", {9}, 100, 1, 2, 1};
    odd.bias = true;
    cases.push_back(odd);
    for (const Dense& d : DENSE) {
        for (const Case& c : cases) ok &= run_dense(d, c, seed++);
    }
    // Streamed: rings of 3 or 2 stages over several tiles a block.
    Case sqkv{"q/k/v-like: 3 segments (40, 8, 8), 3 blocks, 3 stages", {40, 8, 8}, 512, 1, 1, 1};
    sqkv.bias = true;
    Case snorm{"fused norm, residual add, 37 rows, chunks of 256 + 128", {37}, 640, 1, 1, 1};
    snorm.norm = true;
    snorm.accumulate = true;
    Case smlp{"dense MLP gate/up (2 × 12), silu, 2 blocks", {12, 12}, 256, 1, 1, 1};
    smlp.glu = SEGS_SILU;
    smlp.bias = true;
    for (const Dense& d : DENSE) {
        if (!d.stream) continue;
        ok &= run_stream(d, sqkv, {3, 128, 3}, seed++);
        ok &= run_stream(d, snorm, {4, 256, 2}, seed++);
        ok &= run_stream(d, smlp, {2, 64, 3}, seed++);
    }
    Case qsegs{"int8 q/k/v-like: 3 segments (20, 7, 9), 8 rows a stage", {20, 7, 9}, 512, 1, 1, 1};
    qsegs.bias = true;
    Case qmlp{"int8 gate/up pairs (2 × 10), 2 rows a stage", {10, 10}, 256, 1, 1, 1};
    qmlp.glu = SEGS_SILU;
    qmlp.bias = true;
    Case qnorm{"int8 fused norm, residual add, 30 rows, 4 a stage", {30}, 256, 1, 1, 1};
    qnorm.norm = true;
    qnorm.accumulate = true;
    Case qone{"int8 one row a stage, 768 values, 11 rows", {11}, 768, 1, 1, 1};
    Case qdown{"int8 Llama-8B down: 14,336 values, 2 rows a stage, 6 deep", {13}, 14336, 1, 1, 1};
    qdown.bias = true;
    qdown.accumulate = true;
    ok &= run_q8_stream(qsegs, {3, 8, 2}, seed++);
    ok &= run_q8_stream(qmlp, {2, 2, 3}, seed++);
    ok &= run_q8_stream(qnorm, {2, 4, 2}, seed++);
    ok &= run_q8_stream(qone, {3, 1, 2}, seed++);
    ok &= run_q8_stream(qdown, {2, 2, 6}, seed++);
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
