// kernels/gemv_grouped.cu run on the CPU (cuda_shim.h): the grouped-format
// GEMVs (MXFP4, int8, int4 weights; 32 values and one scale a group) in
// both forms, against the host in f64:
// - the f32-activation kernels (`gemv_*`, `gemv_*_x1`: up to four rows of
//   x) against the dequantised weights times x;
// - the integer-activation kernels (`gemv_*_qx`) against the same sums
//   over x rounded as grouped_formats.cuh says (per 32 values, step
//   max|x| / X_MAX, ties to even), so that their integer sums are exact
//   and only the f32 order of the group sums differs: a code, scale, zero
//   point or lane mapping fault is O(1).
// Around the product: several segments of odd heights, biases, a fused
// RMSNorm (and its normed row), residual adds, gate/up activations (a
// dense MLP's two segments; an MoE expert's interleaved pairs), expert
// jobs with and without the early fetch, warps a row quad (wpr) of 1-4,
// and persistent blocks taking several turns.
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include <cstdio>
#include <random>
#include <string>

#include "cuda_shim.h"
#include "gemv_common.cuh"
#include "grouped_formats.cuh"
#include "gemv_grouped.cu"

typedef void (*Kernel)(GemvSegs, const float*, int, const int*, u32, u32, u32, u32);

// A format's host side: random codes and scales, and a group's values.
struct Format {
    const char* name;
    u32 group_bytes, scale_bytes, code_bytes;  // code_bytes: a rounded x value's
    int x_max;
    bool split;  // x codes of the even values, then the odd (int4)
    Kernel plain, x1, qx;
    // The value of code i of a group (its bytes) times its scale.
    double (*value)(const u8* group, u32 i);
    double (*scale)(const u8* scales, u64 g);
};

static const double E2M1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
static double mxfp4_value(const u8* c, u32 i) {
    const u32 n = (c[i / 2] >> (4 * (i % 2))) & 0xfu;
    return (n & 8u ? -1.0 : 1.0) * E2M1[n & 7u];
}
static double mxfp4_scale(const u8* s, u64 g) { return std::ldexp(1.0, (int)s[g] - 127); }
static double q8_value(const u8* c, u32 i) { return (double)(int8_t)c[i]; }
static double q4_value(const u8* c, u32 i) { return (double)((c[i / 2] >> (4 * (i % 2))) & 0xfu) - 8.0; }
static double f16_scale(const u8* s, u64 g) {
    u16 h;
    std::memcpy(&h, s + 2 * g, 2);
    return f16_to_f32(h);
}

static const Format FORMATS[3] = {
    {"mxfp4", 16, 1, 2, 32767, false, gemv_mxfp4, gemv_mxfp4_x1, gemv_mxfp4_qx, mxfp4_value,
     mxfp4_scale},
    {"int8", 32, 2, 1, 127, false, gemv_q8, gemv_q8_x1, gemv_q8_qx, q8_value, f16_scale},
    {"int4", 16, 2, 1, 127, true, gemv_q4, gemv_q4_x1, gemv_q4_qx, q4_value, f16_scale},
};

enum Glu { NONE, SEGS_SILU, EXPERT_PAIRS };

struct Case {
    const char* what;
    std::vector<u32> m;  // rows of each segment (an expert's, with experts)
    u32 k, nx, wpr, grid_y;  // grid_y: the integer kernels' persistent blocks
    bool bias = false, norm = false, accumulate = false;
    Glu glu = NONE;
    std::vector<int> experts = {};  // a job's expert (empty: one job, no experts)
    u32 num_experts = 0, x_div = 1;
    bool settled = false;
};

// x rounded per 32 values as quantize_rounds rounds it: codes and steps.
static void round_x(const Format& f, const std::vector<float>& v, std::vector<int>& codes,
                    std::vector<float>& steps) {
    codes.assign(v.size(), 0);
    steps.assign(v.size() / 32, 0.0f);
    for (size_t g = 0; g < v.size() / 32; g++) {
        float amax = 0.0f;
        for (u32 i = 0; i < 32; i++) amax = std::max(amax, std::fabs(v[g * 32 + i]));
        const float inv = amax > 0.0f ? (float)f.x_max / amax : 0.0f;
        for (u32 i = 0; i < 32; i++) codes[g * 32 + i] = (int)std::nearbyint(v[g * 32 + i] * inv);
        steps[g] = amax * (1.0f / (float)f.x_max);
    }
}

static bool run(const Format& f, const Case& c, bool qx, u32 seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    const u32 segs = c.m.size(), groups = c.k / 32;
    const u32 jobs = c.experts.empty() ? 1 : c.experts.size();
    const u32 experts = c.experts.empty() ? 1 : c.num_experts;
    const u32 x_rows = (jobs + c.x_div - 1) / c.x_div * c.nx;
    // Weights: each segment [experts · m, k] of codes and scales; MXFP4
    // scales 2^(−3..2), f16 ones 2^−7 · (1 + j / 1024).
    std::vector<std::vector<u8>> codes(segs), scales(segs);
    std::vector<std::vector<float>> bias(segs);
    for (u32 s = 0; s < segs; s++) {
        const u64 rows = (u64)experts * c.m[s];
        codes[s].resize(rows * groups * f.group_bytes);
        for (auto& b : codes[s]) b = (u8)byte(rng);
        if (f.group_bytes == 32) {
            for (auto& b : codes[s]) b = b == 0x80 ? 0x81 : b;  // int8 codes in ±127
        }
        scales[s].resize(rows * groups * f.scale_bytes);
        for (u64 g = 0; g < rows * groups; g++) {
            if (f.scale_bytes == 1) {
                scales[s][g] = (u8)(124 + byte(rng) % 6);
            } else {
                const u16 h = (u16)((8 << 10) | (byte(rng) * 4));  // 2^−7 · (1 + j/1024)
                std::memcpy(&scales[s][2 * g], &h, 2);
            }
        }
        bias[s].resize(rows);
        for (auto& b : bias[s]) b = nd(rng);
    }
    std::vector<float> x(x_rows * c.k), norm_w(c.k);
    for (auto& v : x) v = nd(rng);
    for (auto& v : norm_w) v = 1.0f + 0.5f * nd(rng);
    // Outputs: with a glu, half the rows of each job (the first segment's
    // buffer for a dense MLP's two segments).
    auto out_rows = [&](u32 s) { return c.glu == EXPERT_PAIRS ? c.m[s] / 2 : c.m[s]; };
    std::vector<std::vector<float>> out(segs), before(segs);
    for (u32 s = 0; s < segs; s++) {
        out[s].resize((u64)jobs * c.nx * out_rows(s));
        for (auto& v : out[s]) v = c.accumulate ? nd(rng) : NAN;
        before[s] = out[s];
    }
    std::vector<float> normed(c.k, NAN);

    GemvSegs sg{};
    for (u32 s = 0; s < segs; s++) {
        sg.w[s] = codes[s].data();
        sg.scales[s] = scales[s].data();
        sg.bias[s] = c.bias ? bias[s].data() : nullptr;
        sg.out[s] = out[s].data();
        sg.m[s] = c.m[s];
    }
    sg.count = segs;
    sg.norm = c.norm ? norm_w.data() : nullptr;
    sg.normed = c.norm ? normed.data() : nullptr;
    sg.norm_dt = DT_F32;
    sg.eps = 1e-5f;
    sg.accumulate = c.accumulate;
    sg.glu = c.glu == SEGS_SILU ? GLU_SEGS_SILU : c.glu == EXPERT_PAIRS ? GLU_CLAMPED_PAIRS : GLU_NONE;
    sg.glu_alpha = 1.702f;
    sg.glu_limit = 7.0f;
    sg.experts_settled = c.settled;
    const int* ex = c.experts.empty() ? nullptr : c.experts.data();
    const Kernel kernel = qx ? f.qx : c.nx == 1 ? f.x1 : f.plain;
    const size_t shared = qx ? (size_t)c.k * f.code_bytes + groups * 4 : 0;
    // The f32 kernels take one block of work each (8 / wpr row quads); the
    // integer ones loop over theirs (c.grid_y blocks).
    u32 quads = 0;
    for (u32 rows : c.m) quads += (rows + GR - 1) / GR;
    const u32 grid_y = qx ? c.grid_y : (quads + 8 / c.wpr - 1) / (8 / c.wpr);
    launch(jobs, grid_y, 256, [&] { kernel(sg, x.data(), DT_F32, ex, c.nx, c.x_div, c.k, c.wpr); },
           shared);

    // The host, in f64: each row's sum over x as the kernel reads it.
    double worst = 0.0, rms = 0.0;
    u64 count = 0;
    std::vector<std::vector<double>> ref(segs);
    double r = 1.0;  // the fused norm's factor
    std::vector<float> xin = x;
    if (c.norm) {
        double ss = 0.0;
        for (float v : x) ss += (double)v * v;
        r = 1.0 / std::sqrt(ss / c.k + sg.eps);
        for (u32 i = 0; i < c.k; i++) xin[i] = x[i] * norm_w[i];  // rounded as the kernel's codes
    }
    auto row_sum = [&](u32 s, u64 wrow, const float* xr) {
        double sum = 0.0;
        if (!qx) {
            for (u32 g = 0; g < groups; g++) {
                const u8* grp = &codes[s][(wrow * groups + g) * f.group_bytes];
                for (u32 i = 0; i < 32; i++) {
                    sum += f.value(grp, i) * f.scale(scales[s].data(), wrow * groups + g) * xr[g * 32 + i];
                }
            }
            return sum;
        }
        std::vector<int> xc;
        std::vector<float> xs;
        round_x(f, std::vector<float>(xr, xr + c.k), xc, xs);
        for (u32 g = 0; g < groups; g++) {
            const u8* grp = &codes[s][(wrow * groups + g) * f.group_bytes];
            double n = 0.0;
            for (u32 i = 0; i < 32; i++) n += f.value(grp, i) * xc[g * 32 + i];
            sum += n * f.scale(scales[s].data(), wrow * groups + g) * xs[g];
        }
        return sum * r;
    };
    for (u32 s = 0; s < segs; s++) ref[s].assign(out[s].size(), 0.0);
    for (u32 job = 0; job < jobs; job++) {
        const u64 e = c.experts.empty() ? 0 : (u64)c.experts[job];
        for (u32 t = 0; t < c.nx; t++) {
            const float* xr = xin.data() + ((u64)(job / c.x_div) * c.nx + t) * c.k;
            for (u32 s = 0; s < segs; s++) {
                for (u32 row = 0; row < c.m[s]; row++) {
                    const u64 wrow = e * c.m[s] + row;
                    double v = row_sum(s, wrow, xr) + (c.bias ? bias[s][wrow] : 0.0);
                    if (c.glu == NONE) {
                        const u64 o = ((u64)job * c.nx + t) * c.m[s] + row;
                        ref[s][o] = v + (c.accumulate ? before[s][o] : 0.0);
                    } else if (c.glu == EXPERT_PAIRS && row % 2 == 1) {
                        // gpt-oss's clamped SwiGLU of (gate = row − 1, up = row).
                        const u64 g_row = wrow - 1;
                        double g = row_sum(s, g_row, xr) + (c.bias ? bias[s][g_row] : 0.0);
                        double u = v;
                        g = std::min(g, 7.0);
                        u = std::min(std::max(u, -7.0), 7.0);
                        ref[s][((u64)job * c.nx + t) * (c.m[s] / 2) + row / 2] =
                            (u + 1.0) * g / (1.0 + std::exp(-g * 1.702));
                    } else if (c.glu == SEGS_SILU && s == 1) {
                        const double g = row_sum(0, e * c.m[0] + row, xr) + (c.bias ? bias[0][row] : 0.0);
                        ref[0][(u64)job * c.m[0] + row] = g / (1.0 + std::exp(-g)) * v;
                    }
                }
            }
        }
    }
    const u32 checked = c.glu == SEGS_SILU ? 1 : segs;
    for (u32 s = 0; s < checked; s++) {
        for (size_t i = 0; i < ref[s].size(); i++) {
            rms += ref[s][i] * ref[s][i];
            count++;
        }
    }
    rms = std::sqrt(rms / count);
    for (u32 s = 0; s < checked; s++) {
        for (size_t i = 0; i < ref[s].size(); i++) {
            const double e = std::fabs(out[s][i] - ref[s][i]) / rms;
            worst = std::isnan(e) ? INFINITY : std::max(worst, e);
        }
    }
    // The normed row block (0, 0) writes: w · (x · r).
    double normed_err = 0.0;
    if (c.norm && qx) {
        for (u32 i = 0; i < c.k; i++) {
            const double want = norm_w[i] * (x[i] * r);
            const double e = std::fabs(normed[i] - want) / (std::fabs(want) + 1e-3);
            normed_err = std::isnan(e) ? INFINITY : std::max(normed_err, e);
        }
    }
    // f32 sums in another order: ~1e-6 of the rms.
    const bool ok = worst <= 2e-5 && normed_err <= 1e-5;
    std::printf("%-5s %-4s %-52s max|do|/rms %.2e", f.name, qx ? "qx" : c.nx == 1 ? "x1" : "x4",
                c.what, worst);
    if (c.norm && qx) std::printf(" (normed %.1e)", normed_err);
    std::printf(" %s\n", ok ? "ok" : "FAIL");
    return ok;
}

int main() {
    std::vector<Case> cases;
    Case three{"q/k/v-like: 3 segments (13, 6, 9), biases, 2 turns", {13, 6, 9}, 256, 1, 1, 1};
    three.bias = true;
    cases.push_back(three);
    Case normed{"fused norm, residual add, 37 rows, wpr 2", {37}, 512, 1, 2, 2};
    normed.norm = true;
    normed.accumulate = true;
    cases.push_back(normed);
    Case mlp{"dense MLP gate/up (2 × 10), silu, wpr 4", {10, 10}, 256, 1, 4, 3};
    mlp.glu = SEGS_SILU;
    mlp.bias = true;
    cases.push_back(mlp);
    Case moe{"MoE gate/up pairs: jobs of experts 2, 0, 2 of 3", {12}, 256, 1, 2, 2};
    moe.glu = EXPERT_PAIRS;
    moe.bias = true;
    moe.experts = {2, 0, 2};
    moe.num_experts = 3;
    moe.x_div = 3;
    cases.push_back(moe);
    Case down{"MoE down: jobs of experts 1, 3 of 4, early fetch", {9}, 320, 1, 1, 1};
    down.experts = {1, 3};
    down.num_experts = 4;
    down.settled = true;
    down.bias = true;
    cases.push_back(down);
    bool ok = true;
    u32 seed = 11;
    for (const Format& f : FORMATS) {
        for (const Case& c : cases) ok &= run(f, c, true, seed++);
        for (const Case& c : cases) {
            if (c.norm) continue;  // the f32 kernels take no norm
            ok &= run(f, c, false, seed++);
        }
        Case rows{"three rows of x, 11 rows, bias, residual add", {11}, 256, 3, 2, 2};
        rows.bias = true;
        rows.accumulate = true;
        ok &= run(f, rows, false, seed++);
    }
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
