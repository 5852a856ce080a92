// kernels/sample.cu run on the CPU (cuda_shim.h), against the host's rules
// (crates/turbospark-backend: `argmax`, scores.rs's summaries and draw):
// argmax_rows and argmax_feed (first maximum, NaN never wins, a row of NaN
// gives 0; the feed's token, position, ring entry and its counters back
// at 0), score_stats, scores_above, bucket_members, score_buckets (plain
// and f32-rounded weights, a Keep with a last kept score) and draw_weights
// (a walk to u · total; no candidate and +inf rows refused), over rows
// with NaN, −inf and +inf and chunks that split the row unevenly.
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include <algorithm>
#include <random>
#include <set>
#include <string>

#include "cuda_shim.h"
#include "sample.cu"
#include "report.h"

static std::mt19937 rng(17);

// A row of logits with ties at its maximum, NaN and −inf among them.
static std::vector<float> logits(u32 n, bool nan_only = false) {
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = nan_only ? NAN : nd(rng);
    if (nan_only) return x;
    for (u32 i = 0; i < n; i += 97) x[i] = NAN;
    for (u32 i = 5; i < n; i += 131) x[i] = -INFINITY;
    const float top = *std::max_element(x.begin(), x.end(), [](float a, float b) {
        return std::isnan(a) || (!std::isnan(b) && a < b);
    });
    x[n / 2] = top + 1.0f;
    x[n - 3] = top + 1.0f;  // a tie later in the row: the first wins
    return x;
}

static u32 host_argmax(const std::vector<float>& x) {
    u32 best = 0;
    bool any = false;
    for (u32 i = 0; i < x.size(); i++) {
        if (std::isnan(x[i])) continue;
        if (!any || x[i] > x[best]) best = i, any = true;
    }
    return best;
}

static bool argmax_cases() {
    bool ok = true;
    const u32 n = 3001, rows = 3;
    std::vector<float> x;
    for (u32 r = 0; r < rows; r++) {
        const auto row = logits(n, r == 2);
        x.insert(x.end(), row.begin(), row.end());
    }
    std::vector<unsigned long long> best(rows, 0);
    launch(rows, 4, 128, [&] { argmax_rows(best.data(), x.data(), n); });
    bool same = true;
    for (u32 r = 0; r < rows; r++) {
        const std::vector<float> row(x.begin() + r * n, x.begin() + (r + 1) * n);
        const u32 id = best[r] == 0 ? 0 : 0xffffffffu - (u32)best[r];
        same &= id == host_argmax(row) && (r != 2 || best[r] == 0);
    }
    ok &= report("argmax_rows: first maximum, NaN never wins, a NaN row gives 0", same);
    // argmax_feed: twice (a replay), its counters back at 0 each time.
    std::vector<unsigned long long> b2(rows, 0), ring(4 * rows, 0);
    std::vector<u32> done(rows, 0), tokens(rows, 0), positions = {10, 20, 30};
    same = true;
    for (int replay = 0; replay < 2; replay++) {
        launch(rows, 5, 64, [&] {
            argmax_feed(b2.data(), done.data(), x.data(), n, tokens.data(), positions.data(),
                        ring.data(), 4);
        });
        for (u32 r = 0; r < rows; r++) {
            const std::vector<float> row(x.begin() + r * n, x.begin() + (r + 1) * n);
            const u32 pos = 10 * (r + 1) + replay + 1;
            same &= tokens[r] == host_argmax(row) && positions[r] == pos && b2[r] == 0 && done[r] == 0;
            same &= ring[(pos % 4) * rows + r] == ((unsigned long long)pos << 32 | tokens[r]);
        }
    }
    ok &= report("argmax_feed: token, position + 1, ring slot, counters reset (2 runs)", same);
    return ok;
}

static bool summary_cases() {
    bool ok = true;
    const u32 n = 2500, chunk = 700;  // 4 blocks, the last short
    const float t = 0.7f;
    auto x = logits(n);
    x[17] = INFINITY;
    const u32 blocks = (n + chunk - 1) / chunk;
    std::vector<double> part(4 * blocks, NAN);
    launch(blocks, 1, SCORE_THREADS, [&] { score_stats(part.data(), x.data(), n, t, chunk); });
    bool same = true;
    for (u32 b = 0; b < blocks; b++) {
        u32 count = 0;
        bool inf = false;
        float m = -INFINITY;
        for (u32 i = b * chunk; i < std::min(n, (b + 1) * chunk); i++) {
            const float s = x[i] / t;
            if (s > -INFINITY) count++, m = std::max(m, s), inf |= std::isinf(s);
        }
        double sum = 0.0;
        for (u32 i = b * chunk; i < std::min(n, (b + 1) * chunk); i++) {
            const float s = x[i] / t;
            if (s > -INFINITY) sum += std::exp((double)s - m);
        }
        same &= part[4 * b] == count && part[4 * b + 1] == m && part[4 * b + 2] == (inf ? 1.0 : 0.0);
        same &= (std::isnan(sum) && std::isnan(part[4 * b + 3])) ||
                std::fabs(part[4 * b + 3] - sum) <= 1e-12 * std::max(1.0, sum);
    }
    ok &= report("score_stats: candidates, max, +inf, Σ exp(s − max) by block", same);
    x[17] = 1.0f;
    // scores_above: the ids with s ≥ floor, as a set; the count past cap.
    const float floor = 2.0f;
    std::set<u32> want;
    for (u32 i = 0; i < n; i++) {
        if (x[i] / t >= floor) want.insert(i);
    }
    for (u32 cap : {1000u, 5u}) {
        std::vector<u32> out(1 + 2 * cap, 0);
        launch(3, 1, 128, [&] { scores_above(out.data(), x.data(), n, t, floor, cap); });
        std::set<u32> got;
        bool scores = true;
        for (u32 j = 0; j < std::min(out[0], cap); j++) {
            got.insert(out[1 + 2 * j]);
            scores &= __uint_as_float(out[2 + 2 * j]) == x[out[1 + 2 * j]] / t;
        }
        const bool listed = cap >= want.size() ? got == want : got.size() == cap && std::includes(want.begin(), want.end(), got.begin(), got.end());
        ok &= report("scores_above: s ≥ floor, cap " + std::to_string(cap) + " of " + std::to_string(want.size()),
                     out[0] == want.size() && listed && scores);
    }
    // Keep: weights exp(s − m) ≥ min_w, and at or before (last_s, last_id).
    float m = -INFINITY;
    for (float v : x) {
        if (v / t > m) m = v / t;
    }
    const u32 last_id = 1234;
    const Keep keep{1e-3, 1u, x[last_id] / t, last_id};
    auto kept = [&](u32 i) {
        const float s = x[i] / t;
        if (!(s > -INFINITY)) return -1.0;
        const double w = std::exp((double)s - m);
        if (!(w >= keep.min_w)) return -1.0;
        if (!(s > keep.last_s || (s == keep.last_s && i <= keep.last_id))) return -1.0;
        return w;
    };
    auto bucket = [&](u32 i) { return (u32)std::min(((double)m - (double)(x[i] / t)) * 32.0, 1023.0); };
    for (u32 rounded : {0u, 1u}) {
        std::vector<double> out(BUCKETS, NAN), bpart(blocks * BUCKETS);
        u32 done = 0;
        launch(blocks, 1, BUCKET_THREADS, [&] {
            score_buckets(out.data(), &done, bpart.data(), x.data(), n, t, m, keep, rounded, chunk);
        });
        std::vector<double> want_b(BUCKETS, 0.0);
        for (u32 i = 0; i < n; i++) {
            const double w = kept(i);
            if (w >= 0.0) want_b[bucket(i)] += rounded ? (double)(float)w : w;
        }
        bool close = true;
        for (u32 b = 0; b < BUCKETS; b++) close &= std::fabs(out[b] - want_b[b]) <= 1e-12 * std::max(1.0, want_b[b]);
        ok &= report(std::string("score_buckets: kept weights by bucket") + (rounded ? ", f32-rounded" : ""), close);
    }
    // The fullest bucket of kept ids.
    std::vector<u32> sizes(BUCKETS, 0);
    for (u32 i = 0; i < n; i++) {
        if (kept(i) >= 0.0) sizes[bucket(i)]++;
    }
    const u32 b = std::max_element(sizes.begin(), sizes.end()) - sizes.begin();
    std::vector<u32> out(1 + 2 * 1000, 0);
    launch(3, 1, 128, [&] { bucket_members(out.data(), x.data(), n, t, m, keep, b, 1000); });
    std::set<u32> got, want_m;
    for (u32 j = 0; j < out[0]; j++) got.insert(out[1 + 2 * j]);
    for (u32 i = 0; i < n; i++) {
        if (kept(i) >= 0.0 && bucket(i) == b) want_m.insert(i);
    }
    ok &= report("bucket_members: bucket " + std::to_string(b) + "'s kept ids (" + std::to_string(want_m.size()) + ")",
                 got == want_m && !want_m.empty());
    return ok;
}

// draw_weights against the host's walk: the first id whose running sum of
// f32-rounded weights passes u · total.
static bool draw_case(const std::string& what, const std::vector<float>& x, float t, double min_w,
                      double u, u32 chunk, u32 want) {
    const u32 n = x.size(), blocks = (n + chunk - 1) / chunk;
    std::vector<unsigned long long> best(1, 0);
    launch(1, 3, 128, [&] { argmax_rows(best.data(), x.data(), n); });
    std::vector<u32> out(1, 12345), done(1, 0);
    std::vector<double> part(blocks, NAN);
    u64 mw, ub;
    std::memcpy(&mw, &min_w, 8);
    std::memcpy(&ub, &u, 8);
    launch(blocks, 1, SCORE_THREADS, [&] {
        draw_weights(out.data(), done.data(), part.data(), best.data(), x.data(), n, t, mw, ub, chunk);
    });
    return report("draw_weights: " + what, out[0] == want);
}

static bool draws() {
    bool ok = true;
    const u32 n = 5000;
    std::vector<float> x = logits(n);
    const float t = 1.3f;
    float m = -INFINITY;
    for (float v : x) {
        if (v / t > m) m = v / t;
    }
    for (double min_w : {0.0, 0.05}) {
        for (double u : {0.0, 0.37, 0.999}) {
            double total = 0.0;
            std::vector<double> w(n, -1.0);
            for (u32 i = 0; i < n; i++) {
                const float s = x[i] / t;
                if (!(s > -INFINITY)) continue;
                const double e = std::exp((double)s - m);
                if (e >= min_w) w[i] = (double)(float)e, total += w[i];
            }
            const double r = u * total;
            double cum = 0.0;
            u32 want = DRAW_NONE;
            for (u32 i = 0; i < n; i++) {
                if (w[i] < 0.0) continue;
                cum += w[i];
                if (r < cum) {
                    want = i;
                    break;
                }
            }
            char what[96];
            std::snprintf(what, sizeof what, "u %.3f, min_w %.2f, chunks of 900", u, min_w);
            ok &= draw_case(what, x, t, min_w, u, 900, want);
        }
    }
    std::vector<float> inf_row = x;
    inf_row[40] = INFINITY;
    ok &= draw_case("a +inf score: the host draws (DRAW_NONE)", inf_row, t, 0.0, 0.5, 900, DRAW_NONE);
    ok &= draw_case("no candidate (all NaN): DRAW_NONE", logits(300, true), t, 0.0, 0.5, 128, DRAW_NONE);
    return ok;
}

int main() {
    bool ok = argmax_cases();
    ok &= summary_cases();
    ok &= draws();
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
