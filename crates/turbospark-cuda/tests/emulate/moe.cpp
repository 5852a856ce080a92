// kernels/moe.cu run on the CPU (cuda_shim.h), against the host:
// - moe_route: a token's top-k experts (value descending, ties to the
//   lower index) and their weights in the three modes (softmax of the k
//   picks; of all, then pick; of all, pick, renormalise), ascending by
//   expert, over gpt-oss's, Qwen3's and Mixtral's expert counts, with tied
//   logits;
// - moe_norm_route: the same from the residual row, with the RMSNorm and
//   the bf16 router (one bulk copy a block) in the launch; its normed row;
//   its ticket back at 0 for the next launch (run twice);
// - moe_combine, moe_gather, moe_act_rows, moe_combine_rows: the weighted
//   sum into the residual, the grouped path's gather, activation and sum.
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include <algorithm>
#include <numeric>
#include <random>

#include "cuda_shim.h"
#include "moe.cu"
#include "report.h"

// The host's routing of one token: picks and weights, ascending by expert.
static void host_route(const float* lg, u32 n, u32 k, int mode, std::vector<int>& e,
                       std::vector<double>& w) {
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lg[a] > lg[b]; });
    order.resize(k);
    double max = -INFINITY, all = 0.0, picked = 0.0;
    for (u32 i = 0; i < n; i++) max = std::max(max, (double)lg[i]);
    for (u32 i = 0; i < n; i++) all += std::exp(lg[i] - max);
    const double top = lg[order[0]];
    for (int i : order) picked += std::exp(lg[i] - (mode == 0 ? top : max));
    std::sort(order.begin(), order.end());
    e = order;
    w.clear();
    for (int i : order) {
        const double p = std::exp(lg[i] - (mode == 0 ? top : max));
        w.push_back(mode == 0 ? p / picked : mode == 1 ? p / all : p / picked);
    }
}

// Routing's outputs against the host's for `rows` tokens; false on a
// different pick or a weight off by more than f32 rounding.
static double route_error(const std::vector<float>& lg, u32 rows, u32 n, u32 k, int mode,
                          const std::vector<int>& sel_e, const std::vector<float>& sel_w) {
    double worst = 0.0;
    for (u32 r = 0; r < rows; r++) {
        std::vector<int> e;
        std::vector<double> w;
        host_route(&lg[r * n], n, k, mode, e, w);
        for (u32 j = 0; j < k; j++) {
            if (sel_e[r * k + j] != e[j]) return INFINITY;
            worst = std::max(worst, std::fabs(sel_w[r * k + j] - w[j]));
        }
    }
    return worst;
}

static bool route_cases(std::mt19937& rng) {
    bool ok = true;
    struct {
        const char* what;
        u32 experts, k;
    } shapes[] = {{"gpt-oss-20b: 4 of 32", 32, 4},
                  {"gpt-oss-120b, Qwen3-30B-A3B: 8 of 128", 128, 8},
                  {"Mixtral: 2 of 8", 8, 2}};
    for (auto sh : shapes) {
        for (int mode = 0; mode < 3; mode++) {
            const u32 rows = 5;
            // Logits on a grid of 0.25 over a narrow range: many ties.
            std::uniform_int_distribution<int> step(-6, 6);
            std::vector<float> lg(rows * sh.experts);
            for (auto& v : lg) v = 0.25f * step(rng);
            std::vector<int> sel_e(rows * sh.k, -1);
            std::vector<float> sel_w(rows * sh.k, NAN);
            // Two tokens a block (warps), the last block half full.
            launch((rows + 1) / 2, 1, 64, [&] {
                moe_route(sel_e.data(), sel_w.data(), lg.data(), rows, sh.experts, sh.k, mode);
            });
            const std::string what = std::string("moe_route ") + sh.what + ", mode " +
                                     std::to_string(mode) + ", tied logits";
            ok &= report(what.c_str(), route_error(lg, rows, sh.experts, sh.k, mode, sel_e, sel_w),
                         1e-6);
        }
    }
    return ok;
}

static bool norm_route_case(std::mt19937& rng, u32 hidden, u32 experts, u32 k, int mode,
                            u32 blocks) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(hidden), norm_w(hidden), bias(experts);
    for (auto& v : x) v = nd(rng);
    for (auto& v : norm_w) v = 1.0f + 0.3f * nd(rng);
    for (auto& v : bias) v = 0.5f * nd(rng);
    std::vector<u16> router(experts * hidden);
    for (auto& v : router) v = f32_to_bf16(0.05f * nd(rng));
    std::vector<float> normed(hidden, NAN), glogits(experts, NAN);
    std::vector<int> sel_e(k, -1);
    std::vector<float> sel_w(k, NAN);
    u32 ticket = 0;
    const u32 per = (experts + blocks - 1) / blocks;
    const size_t shared = (size_t)per * hidden * 2 + 4 * hidden + 4 * experts;
    bool ok = true;
    for (int replay = 0; replay < 2; replay++) {
        launch(blocks, 1, NR_WARPS * 32, [&] {
            moe_norm_route(sel_e.data(), sel_w.data(), normed.data(), x.data(), norm_w.data(),
                           DT_F32, 1e-5f, router.data(), DT_BF16, bias.data(), DT_F32, hidden,
                           experts, k, mode, glogits.data(), &ticket);
        }, shared);
        ok &= ticket == 0;
    }
    // The host: normed = w · (x · r); logits = normed · router + bias.
    double ss = 0.0;
    for (float v : x) ss += (double)v * v;
    const double r = 1.0 / std::sqrt(ss / hidden + 1e-5);
    double normed_err = 0.0;
    std::vector<double> xn(hidden);
    for (u32 i = 0; i < hidden; i++) {
        xn[i] = norm_w[i] * (x[i] * r);
        normed_err = std::max(normed_err, std::fabs(normed[i] - xn[i]) / (std::fabs(xn[i]) + 1e-3));
    }
    std::vector<float> lg(experts);
    double logit_err = 0.0;
    for (u32 e = 0; e < experts; e++) {
        double s = bias[e];
        for (u32 i = 0; i < hidden; i++) s += xn[i] * bf16_to_f32(router[e * hidden + i]);
        logit_err = std::max(logit_err, std::fabs(glogits[e] - s));
        lg[e] = glogits[e];  // the picks from the kernel's own logits (ties aside)
    }
    char what[128];
    std::snprintf(what, sizeof what, "moe_norm_route %u of %u, hidden %u, %u blocks, mode %d", k,
                  experts, hidden, blocks, mode);
    const double err = std::max({normed_err, logit_err * 1e-2,
                                 route_error(lg, 1, experts, k, mode, sel_e, sel_w)});
    return report(what, ok ? err : INFINITY, 1e-5);
}

static bool sums_cases(std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const u32 rows = 3, k = 4, hidden = 40, width = 24;
    bool ok = true;
    // moe_combine: out[r] += Σ_j y[r·k + j] · w[r·k + j].
    std::vector<float> y(rows * k * hidden), w(rows * k), out(rows * hidden);
    for (auto& v : y) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    for (auto& v : out) v = nd(rng);
    std::vector<float> held = out;
    launch(2, 1, 64, [&] { moe_combine(out.data(), y.data(), w.data(), rows, k, hidden); });
    double err = 0.0;
    for (u32 r = 0; r < rows; r++) {
        for (u32 c = 0; c < hidden; c++) {
            double o = 0.0;
            for (u32 j = 0; j < k; j++) o += y[(r * k + j) * hidden + c] * (double)w[r * k + j];
            err = std::max(err, std::fabs(out[r * hidden + c] - (held[r * hidden + c] + o)));
        }
    }
    ok &= report("moe_combine: 3 rows of 4 experts into the residual", err, 1e-5);
    // moe_gather: rows of x picked by token, f32 and bf16.
    std::vector<float> x(5 * hidden);
    for (auto& v : x) v = nd(rng);
    const std::vector<int> row_token = {4, 0, 4, 2};
    std::vector<float> g32(row_token.size() * hidden);
    std::vector<u16> g16(row_token.size() * hidden);
    launch(3, 1, 32, [&] { moe_gather(g32.data(), x.data(), row_token.data(), 4, hidden, 0); });
    launch(3, 1, 32, [&] { moe_gather(g16.data(), x.data(), row_token.data(), 4, hidden, 1); });
    err = 0.0;
    for (u32 r = 0; r < 4; r++) {
        for (u32 c = 0; c < hidden; c++) {
            const float v = x[row_token[r] * hidden + c];
            err = std::max(err, (double)std::fabs(g32[r * hidden + c] - v));
            err = std::max(err, g16[r * hidden + c] == f32_to_bf16(v) ? 0.0 : INFINITY);
        }
    }
    ok &= report("moe_gather: 4 rows by token, f32 and bf16", err, 0.0);
    // moe_act_rows: both activations, the row's expert's gate_up bias first.
    std::vector<float> gu(4 * 2 * width), bias(3 * 2 * width), act(4 * width);
    for (auto& v : gu) v = 3.0f * nd(rng);
    for (auto& v : bias) v = nd(rng);
    const std::vector<int> row_expert = {2, 0, 1, 2};
    for (int a = 0; a < 2; a++) {
        launch(2, 1, 64, [&] {
            moe_act_rows(act.data(), gu.data(), row_expert.data(), bias.data(), DT_F32, 4, width, a,
                         1.702f, 7.0f, 0);
        });
        err = 0.0;
        for (u32 r = 0; r < 4; r++) {
            for (u32 c = 0; c < width; c++) {
                const u32 gi = a == 0 ? c : 2 * c, ui = a == 0 ? width + c : 2 * c + 1;
                const u32 b = row_expert[r] * 2 * width;
                double g = (double)gu[r * 2 * width + gi] + bias[b + gi];
                double u = (double)gu[r * 2 * width + ui] + bias[b + ui];
                double want;
                if (a == 0) {
                    want = g / (1.0 + std::exp(-g)) * u;
                } else {
                    g = std::min(g, 7.0);
                    u = std::min(std::max(u, -7.0), 7.0);
                    want = (u + 1.0) * g / (1.0 + std::exp(-g * 1.702));
                }
                err = std::max(err, std::fabs(act[r * width + c] - want) / (std::fabs(want) + 1.0));
            }
        }
        ok &= report(a == 0 ? "moe_act_rows: SwiGLU halves, biases by row expert"
                            : "moe_act_rows: gpt-oss's clamped pairs, biases by row expert",
                     err, 1e-5);
    }
    // moe_combine_rows: slots' rows (−1: none) plus their expert's down bias.
    const std::vector<int> slot_row = {3, -1, 0, 1, 2, 5, 4, 7, 6, -1, 9, 8};
    const std::vector<int> sel_e = {0, 1, 2, 3, 0, 2, 1, 3, 0, 1, 2, 3};
    std::vector<float> yr(10 * hidden), dbias(4 * hidden);
    for (auto& v : yr) v = nd(rng);
    for (auto& v : dbias) v = nd(rng);
    out = held;
    launch(2, 1, 64, [&] {
        moe_combine_rows(out.data(), yr.data(), slot_row.data(), sel_e.data(), w.data(),
                         dbias.data(), DT_F32, rows, k, hidden);
    });
    err = 0.0;
    for (u32 r = 0; r < rows; r++) {
        for (u32 c = 0; c < hidden; c++) {
            double o = 0.0;
            for (u32 j = 0; j < k; j++) {
                const u32 s = r * k + j;
                if (slot_row[s] < 0) continue;
                o += ((double)yr[slot_row[s] * hidden + c] + dbias[sel_e[s] * hidden + c]) * w[s];
            }
            err = std::max(err, std::fabs(out[r * hidden + c] - (held[r * hidden + c] + o)));
        }
    }
    ok &= report("moe_combine_rows: slots' rows and down biases, a slot empty", err, 1e-5);
    return ok;
}

int main() {
    std::mt19937 rng(5);
    bool ok = route_cases(rng);
    ok &= norm_route_case(rng, 2880, 32, 4, 0, 32);  // gpt-oss-20b, a row a block
    ok &= norm_route_case(rng, 2048, 128, 8, 2, 40);  // Qwen3-30B-A3B, rows split unevenly
    ok &= norm_route_case(rng, 512, 8, 2, 0, 3);
    ok &= sums_cases(rng);
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
