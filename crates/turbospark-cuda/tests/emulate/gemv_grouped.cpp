// kernels/gemv_grouped.cu run on the CPU (cuda_shim.h): the grouped-format
// GEMVs (MXFP4, int8, int4 weights; 32 values and one scale a group) in
// both forms, against the host in f64 (gemv_check.h): the f32-activation
// kernels (`gemv_*`, `gemv_*_x1`: up to four rows of x) over x itself, the
// integer-activation ones (`gemv_*_qx`) over x rounded as they round it,
// so that their integer sums are exact. Around the product: segments of
// odd heights, biases, a fused RMSNorm and its normed row, residual adds,
// both gate/up activations, expert jobs with and without the early fetch,
// warps a row quad (wpr) of 1-4, and persistent blocks taking turns.
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include "cuda_shim.h"
#include "gemv_common.cuh"
#include "grouped_formats.cuh"
#include "gemv_grouped.cu"
#include "gemv_check.h"

typedef void (*Kernel)(GemvSegs, const float*, int, const int*, u32, u32, u32, u32);

// A format's kernels and its groups' host side.
struct Format {
    const char* name;
    u32 group_bytes, scale_bytes, code_bytes;  // code_bytes: a rounded x value's
    int x_max;
    Kernel plain, x1, qx;
    double (*value)(const u8* group, u32 i);  // value i of a group's codes
    double (*scale)(const u8* scales, u64 g);
};

static const double E2M1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
// MXFP4 and int4: byte j holds values 2j (low nibble) and 2j + 1.
static u32 nibble(const u8* c, u32 i) { return (c[i / 2] >> (4 * (i % 2))) & 0xfu; }
static double mxfp4_value(const u8* c, u32 i) {
    return (nibble(c, i) & 8u ? -1.0 : 1.0) * E2M1[nibble(c, i) & 7u];
}
static double e8m0_scale(const u8* s, u64 g) { return std::ldexp(1.0, (int)s[g] - 127); }
static double q8_value(const u8* c, u32 i) { return (double)(int8_t)c[i]; }
static double q4_value(const u8* c, u32 i) { return (double)nibble(c, i) - 8.0; }
static double f16_scale(const u8* s, u64 g) {
    u16 h;
    std::memcpy(&h, s + 2 * g, 2);
    return f16_to_f32(h);
}

static const Format FORMATS[3] = {
    {"mxfp4", 16, 1, 2, 32767, gemv_mxfp4, gemv_mxfp4_x1, gemv_mxfp4_qx, mxfp4_value, e8m0_scale},
    {"int8", 32, 2, 1, 127, gemv_q8, gemv_q8_x1, gemv_q8_qx, q8_value, f16_scale},
    {"int4", 16, 2, 1, 127, gemv_q4, gemv_q4_x1, gemv_q4_qx, q4_value, f16_scale},
};

// Random codes and scales of `rows` rows (MXFP4 scales 2^(−3..2), f16
// ones 2^−7 · (1 + j / 1024); int8 codes in ±127) and their values.
static void fill(const Format& f, u32 k, Seg& s, u64 rows, std::mt19937& rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    const u64 groups = rows * (k / 32);
    s.codes.resize(groups * f.group_bytes);
    for (auto& b : s.codes) b = (u8)byte(rng);
    if (f.group_bytes == 32) {
        for (auto& b : s.codes) b = b == 0x80 ? 0x81 : b;
    }
    s.scales.resize(groups * f.scale_bytes);
    for (u64 g = 0; g < groups; g++) {
        if (f.scale_bytes == 1) {
            s.scales[g] = (u8)(124 + byte(rng) % 6);
        } else {
            const u16 h = (u16)((8 << 10) | (byte(rng) * 4));
            std::memcpy(&s.scales[2 * g], &h, 2);
        }
    }
    s.w.resize(rows * k);
    for (u64 g = 0; g < groups; g++) {
        for (u32 i = 0; i < 32; i++) {
            s.w[g * 32 + i] = f.value(&s.codes[g * f.group_bytes], i) * f.scale(s.scales.data(), g);
        }
    }
}

static bool run(const Format& f, const Case& c, bool qx, u32 seed) {
    Launch l(c, seed, [&](Seg& s, u64 rows, std::mt19937& rng) { fill(f, c.k, s, rows, rng); });
    const Kernel kernel = qx ? f.qx : c.nx == 1 ? f.x1 : f.plain;
    // The integer kernels round x into shared memory and loop over their
    // blocks of work (c.grid_y blocks); the f32 ones take one each.
    const size_t shared = qx ? (size_t)c.k * f.code_bytes + c.k / 32 * 4 : 0;
    const u32 grid_y = qx ? c.grid_y : (l.quads() + 8 / c.wpr - 1) / (8 / c.wpr);
    launch(l.jobs, grid_y, 256,
           [&] { kernel(l.sg, l.x.data(), DT_F32, l.experts_ptr(), c.nx, c.x_div, c.k, c.wpr); },
           shared);
    const std::string name = std::string(f.name) + (qx ? "_qx" : c.nx == 1 ? "_x1" : "");
    return l.check(name.c_str(), qx ? f.x_max : 0);
}

int main() {
    bool ok = true;
    u32 seed = 11;
    for (const Format& f : FORMATS) {
        for (const Case& c : shared_cases()) {
            if (c.nx == 1) ok &= run(f, c, true, seed++);  // the integer kernels take one row
            if (!c.norm) ok &= run(f, c, false, seed++);   // the f32 ones take no norm
        }
    }
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
