// The host side of the GEMV emulations (gemv_grouped.cpp, gemv_dense.cpp):
// a launch's segments of random weights in a kernel format with their
// values in f64, x, and the outputs the kernels must give, in f64:
//   out[job·nx + t, r] = Σ_c x̂[c] · W[e(job)·m + r, c] · nf + bias (+ held)
// with x̂ = x (f32-activation kernels) or x rounded as grouped_formats.cuh
// rounds it, code · step (integer-activation kernels), taken through the
// fused norm's weights first, and nf the norm's factor (1 without); then
// the gate/up activations. What a kernel sums exactly, the reference sums
// exactly; what differs is f32 rounding order (~1e-6 of the rms), so a
// code, scale, row or lane mapping fault is O(1).
#pragma once
#include <cstdio>
#include <random>
#include <string>
#include <vector>

enum Glu { NONE, SEGS_SILU, EXPERT_PAIRS };

struct Case {
    const char* what;
    std::vector<u32> m;  // rows of each segment (an expert's, with experts)
    u32 k, nx, wpr, grid_y;  // grid_y: a persistent launch's blocks along y
    bool bias = false, norm = false, accumulate = false;
    Glu glu = NONE;
    std::vector<int> experts = {};  // a job's expert (empty: one job, no experts)
    u32 num_experts = 0, x_div = 1;
    bool settled = false;  // the experts were final a launch before
};

// One segment's weights as the kernel reads them, and their values.
struct Seg {
    std::vector<u8> codes, scales;
    std::vector<double> w;  // [experts · m, k]
    std::vector<float> bias;
};

// A launch's inputs, outputs (with what they held) and segment table.
struct Launch {
    const Case& c;
    std::vector<Seg> segs;
    std::vector<float> x, norm_w, normed;
    std::vector<std::vector<float>> out, held;
    GemvSegs sg{};
    u32 jobs, experts;

    // `fill(seg, rows, rng)` makes a segment's codes, scales and values.
    template <class Fill>
    Launch(const Case& cs, u32 seed, Fill fill) : c(cs) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        jobs = c.experts.empty() ? 1 : c.experts.size();
        experts = c.experts.empty() ? 1 : c.num_experts;
        segs.resize(c.m.size());
        for (size_t s = 0; s < segs.size(); s++) {
            const u64 rows = (u64)experts * c.m[s];
            fill(segs[s], rows, rng);
            segs[s].bias.resize(rows);
            for (auto& b : segs[s].bias) b = nd(rng);
        }
        x.resize((jobs + c.x_div - 1) / c.x_div * c.nx * c.k);
        for (auto& v : x) v = nd(rng);
        norm_w.resize(c.k);
        for (auto& v : norm_w) v = 1.0f + 0.5f * nd(rng);
        normed.assign(c.k, NAN);
        out.resize(segs.size());
        for (size_t s = 0; s < segs.size(); s++) {
            out[s].resize((u64)jobs * c.nx * out_rows(s));
            for (auto& v : out[s]) v = c.accumulate ? nd(rng) : NAN;
        }
        held = out;
        for (size_t s = 0; s < segs.size(); s++) {
            sg.w[s] = segs[s].codes.data();
            sg.scales[s] = segs[s].scales.data();
            sg.bias[s] = c.bias ? segs[s].bias.data() : nullptr;
            sg.out[s] = out[s].data();
            sg.m[s] = c.m[s];
        }
        sg.count = segs.size();
        sg.norm = c.norm ? norm_w.data() : nullptr;
        sg.normed = c.norm ? normed.data() : nullptr;
        sg.norm_dt = DT_F32;
        sg.eps = 1e-5f;
        sg.accumulate = c.accumulate;
        sg.glu = c.glu == SEGS_SILU      ? GLU_SEGS_SILU
                 : c.glu == EXPERT_PAIRS ? GLU_CLAMPED_PAIRS
                                         : GLU_NONE;
        sg.glu_alpha = 1.702f;
        sg.glu_limit = 7.0f;
        sg.experts_settled = c.settled;
    }
    const int* experts_ptr() const { return c.experts.empty() ? nullptr : c.experts.data(); }
    u32 out_rows(size_t s) const { return c.glu == EXPERT_PAIRS ? c.m[s] / 2 : c.m[s]; }
    // Row quads (4 rows, segments padded to them) of the launch.
    u32 quads() const {
        u32 q = 0;
        for (u32 rows : c.m) q += (rows + 3) / 4;
        return q;
    }

    // Checks the outputs (and the normed row) against the host; `round`
    // maps a row of x (k values) to what the kernel multiplies, x_max
    // codes a group (0: the f32 x itself). Prints one line.
    bool check(const char* kernel, int x_max) const {
        double nf = 1.0;
        std::vector<float> xin = x;
        if (c.norm) {
            double ss = 0.0;
            for (u32 i = 0; i < c.k; i++) ss += (double)x[i] * x[i];
            nf = 1.0 / std::sqrt(ss / c.k + sg.eps);
            for (u32 i = 0; i < c.k; i++) xin[i] = x[i] * norm_w[i];  // as the kernels round it
        }
        auto rounded = [&](const float* xr) {
            std::vector<double> v(xr, xr + c.k);
            if (x_max == 0) return v;
            // quantize_rounds: step max|x| / X_MAX, codes ties to even.
            for (u32 g = 0; g < c.k / 32; g++) {
                float amax = 0.0f;
                for (u32 i = 0; i < 32; i++) amax = std::max(amax, std::fabs(xr[g * 32 + i]));
                const float inv = amax > 0.0f ? (float)x_max / amax : 0.0f;
                const float step = amax * (1.0f / (float)x_max);
                for (u32 i = 0; i < 32; i++) {
                    v[g * 32 + i] = std::nearbyint(xr[g * 32 + i] * inv) * (double)step;
                }
            }
            return v;
        };
        std::vector<std::vector<double>> want(segs.size());
        for (size_t s = 0; s < segs.size(); s++) want[s].assign(out[s].size(), 0.0);
        for (u32 job = 0; job < jobs; job++) {
            const u64 e = c.experts.empty() ? 0 : (u64)c.experts[job];
            for (u32 t = 0; t < c.nx; t++) {
                const std::vector<double> xr =
                    rounded(xin.data() + ((u64)(job / c.x_div) * c.nx + t) * c.k);
                auto sum = [&](size_t s, u64 wrow) {
                    double v = 0.0;
                    for (u32 i = 0; i < c.k; i++) v += segs[s].w[wrow * c.k + i] * xr[i];
                    return v * nf + (c.bias ? segs[s].bias[wrow] : 0.0);
                };
                for (size_t s = 0; s < segs.size(); s++) {
                    for (u32 row = 0; row < c.m[s]; row++) {
                        const u64 wrow = e * c.m[s] + row;
                        const u64 o = ((u64)job * c.nx + t) * out_rows(s);
                        if (c.glu == NONE) {
                            want[s][o + row] = sum(s, wrow) + (c.accumulate ? held[s][o + row] : 0.0);
                        } else if (c.glu == EXPERT_PAIRS && row % 2 == 1) {
                            // gpt-oss's clamped SwiGLU of gate row − 1, up row.
                            const double g = std::min(sum(s, wrow - 1), 7.0);
                            const double u = std::min(std::max(sum(s, wrow), -7.0), 7.0);
                            want[s][o + row / 2] = (u + 1.0) * g / (1.0 + std::exp(-g * 1.702));
                        } else if (c.glu == SEGS_SILU && s == 0) {
                            const double g = sum(0, wrow), u = sum(1, wrow);
                            want[0][o + row] = g / (1.0 + std::exp(-g)) * u;
                        }
                    }
                }
            }
        }
        // A dense MLP's activation is segment 0's output alone.
        const size_t checked = c.glu == SEGS_SILU ? 1 : segs.size();
        double rms = 0.0, worst = 0.0;
        u64 count = 0;
        for (size_t s = 0; s < checked; s++) {
            for (double v : want[s]) rms += v * v, count++;
        }
        rms = std::sqrt(rms / count);
        for (size_t s = 0; s < checked; s++) {
            for (size_t i = 0; i < want[s].size(); i++) {
                const double e = std::fabs(out[s][i] - want[s][i]) / rms;
                worst = std::isnan(e) ? INFINITY : std::max(worst, e);
            }
        }
        // The normed row the launch writes, w · (x · nf), where it asks.
        double normed_err = 0.0;
        const bool writes_normed = c.norm && sg.normed != nullptr;
        if (writes_normed) {
            for (u32 i = 0; i < c.k; i++) {
                const double w = norm_w[i] * (x[i] * nf);
                const double e = std::fabs(normed[i] - w) / (std::fabs(w) + 1e-3);
                normed_err = std::isnan(e) ? INFINITY : std::max(normed_err, e);
            }
        }
        const bool ok = worst <= 2e-5 && normed_err <= 1e-5;
        std::printf("%-22s %-52s max|do|/rms %.2e", kernel, c.what, worst);
        if (writes_normed) std::printf(" (normed %.1e)", normed_err);
        std::printf(" %s\n", ok ? "ok" : "FAIL");
        return ok;
    }
};

// The launches both GEMV programs check: q/k/v-like segments, a fused norm
// with a residual add, a dense MLP's gate/up, an MoE's gate/up pairs and
// its down (jobs of chosen experts, the down's fetched early), and several
// rows of x. `grid_y` is a persistent launch's blocks (several turns each).
inline std::vector<Case> shared_cases() {
    // (what, rows a segment, k, rows of x, wpr, grid_y)
    Case qkv{"q/k/v-like: 3 segments (13, 6, 9), biases, turns", {13, 6, 9}, 256, 1, 1, 1};
    qkv.bias = true;
    Case normed{"fused norm, residual add, 37 rows, wpr 2", {37}, 512, 1, 2, 2};
    normed.norm = true;
    normed.accumulate = true;
    Case mlp{"dense MLP gate/up (2 × 10), silu, wpr 4", {10, 10}, 256, 1, 4, 2};
    mlp.glu = SEGS_SILU;
    mlp.bias = true;
    Case moe{"MoE gate/up pairs: jobs of experts 2, 0, 2 of 3", {12}, 256, 1, 2, 2};
    moe.glu = EXPERT_PAIRS;
    moe.bias = true;
    moe.experts = {2, 0, 2};
    moe.num_experts = 3;
    moe.x_div = 3;
    Case down{"MoE down: jobs of experts 1, 3 of 4, early fetch", {9}, 320, 1, 1, 1};
    down.experts = {1, 3};
    down.num_experts = 4;
    down.settled = true;
    down.bias = true;
    Case rows{"three rows of x, 11 rows, bias, residual add", {11}, 256, 3, 2, 2};
    rows.bias = true;
    rows.accumulate = true;
    // The real widths' tails: gpt-oss's hidden size (90 groups, not a
    // multiple of a warp's 32 lanes) and Llama-8B's MLP width.
    Case oss{"gpt-oss's 2,880 values a row (90 groups), bias, wpr 2", {11}, 2880, 1, 2, 1};
    oss.bias = true;
    Case wide{"Llama-8B's 14,336 values a row, residual add", {5}, 14336, 1, 1, 1};
    wide.accumulate = true;
    return {qkv, normed, mlp, moe, down, rows, oss, wide};
}
