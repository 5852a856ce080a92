// The tensor-core decode attention's tile arithmetic
// (kernels/attention_mma.cuh's GqaMma) on the CPU (cuda_shim.h): a
// split's partial (m, l, output) of every query head against an f64
// reference over the same bf16 keys and values, for several groups, head
// dims, masks, softcaps and tiles a split. A fragment-mapping error is
// O(1) here; the hi + lo bf16 parts of q and p leave a few 1e-5.
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include <cstdio>
#include <random>

#include "cuda_shim.h"
#include "mma.cuh"
#include "attention_mma.cuh"

// One split of `tiles` tiles of T keys for `group` heads of HD dims.
struct Case {
    u32 group, tiles;
    float scale, softcap;
    double live;  // chance a key is visible
    u32 last_keys;  // keys of the last tile (rows past it are zero)
};

template <int HD, int T>
static bool run(const Case& cs, u32 seed) {
    constexpr u32 RS = GqaMma<HD, T>::RS;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    std::vector<float> qs(cs.group * HD);
    for (auto& v : qs) v = nd(rng);
    std::vector<std::vector<u16>> ks(cs.tiles, std::vector<u16>(T * RS, 0));
    std::vector<std::vector<u16>> vs = ks;
    std::vector<u32> masks(cs.tiles);
    for (u32 ti = 0; ti < cs.tiles; ti++) {
        const u32 nk = ti + 1 == cs.tiles ? cs.last_keys : T;
        u32 mask = 0;
        for (u32 r = 0; r < T; r++) {
            // Rows past nk hold garbage keys (never live) and zero values,
            // as attn_gqa leaves them.
            for (u32 d = 0; d < RS; d++) {
                ks[ti][r * RS + d] = r < nk ? f32_to_bf16(nd(rng)) : 0x7fc0;  // NaN past nk
                vs[ti][r * RS + d] = r < nk ? f32_to_bf16(nd(rng)) : 0;
            }
            if (r < nk && ud(rng) < cs.live) mask |= 1u << r;
        }
        if (mask == 0) mask = 1;
        masks[ti] = mask;
    }
    std::vector<float> part_o(cs.group * HD, -1.0f), part_ml(cs.group * 2, -1.0f);
    launch(1, 1, 32, [&] {
        const u32 lane = threadIdx.x;
        GqaMma<HD, T> mm;
        mm.init(qs.data(), cs.group);
        for (u32 ti = 0; ti < cs.tiles; ti++) {
            mm.tile(ks[ti].data(), vs[ti].data(), masks[ti], cs.scale, cs.softcap);
        }
        const float sum = mm.sum();
        const u32 g = lane / 4;
        if (g < cs.group) {
            mm.write(&part_o[g * HD], 1.0f, 1.0f);
            if (lane % 4 == 0) part_ml[2 * g] = mm.m, part_ml[2 * g + 1] = sum;
        }
    });
    // The reference, in f64 over the same bf16 keys and values and f32 q.
    bool ok = true;
    for (u32 h = 0; h < cs.group; h++) {
        std::vector<double> sc, o(HD, 0.0);
        std::vector<const u16*> vrow;
        for (u32 ti = 0; ti < cs.tiles; ti++) {
            for (u32 r = 0; r < T; r++) {
                if (!((masks[ti] >> r) & 1u)) continue;
                double s = 0.0;
                for (u32 d = 0; d < HD; d++) s += (double)qs[h * HD + d] * bf16_to_f32(ks[ti][r * RS + d]);
                s *= cs.scale;
                if (cs.softcap > 0.0f) s = cs.softcap * std::tanh(s / cs.softcap);
                sc.push_back(s);
                vrow.push_back(&vs[ti][r * RS]);
            }
        }
        double m = -INFINITY, l = 0.0;
        for (double s : sc) m = std::max(m, s);
        for (size_t i = 0; i < sc.size(); i++) {
            const double p = std::exp(sc[i] - m);
            l += p;
            for (u32 d = 0; d < HD; d++) o[d] += p * bf16_to_f32(vrow[i][d]);
        }
        double rms = 0.0, err = 0.0;
        for (u32 d = 0; d < HD; d++) rms += o[d] * o[d];
        rms = std::sqrt(rms / HD);
        for (u32 d = 0; d < HD; d++) err = std::max(err, std::fabs(part_o[h * HD + d] - o[d]));
        const double em = std::fabs(part_ml[2 * h] - m);
        const double el = std::fabs(part_ml[2 * h + 1] - l) / l;
        const double eo = err / rms;
        // q and p carry ~16 significant bits (hi + lo), so each score and
        // weight is off by ~2⁻¹⁷ of the sum of its terms' magnitudes: a few
        // 1e-5 of the output's rms at most (the f32 forms: ~1e-6). A
        // mapping error is O(1).
        const double tol = 5e-5;
        const bool good = em <= tol * std::max(1.0, std::fabs(m)) && el <= tol && eo <= tol;
        if (!good || h == 0) {
            std::printf("HD %3d T %2d group %u tiles %u softcap %.1f live %.2f last %2u head %u: "
                        "|dm| %.2e  |dl|/l %.2e  max|do|/rms %.2e %s\n",
                        HD, T, cs.group, cs.tiles, cs.softcap, cs.live, cs.last_keys, h, em, el,
                        eo, good ? "ok" : "FAIL");
        }
        ok &= good;
    }
    return ok;
}

int main() {
    bool ok = true;
    u32 seed = 1;
    for (u32 group : {4u, 8u, 2u}) {
        for (u32 tiles : {1u, 3u}) {
            const Case a{group, tiles, 0.088f, 0.0f, 1.0, 32};
            const Case b{group, tiles, 0.125f, 2.0f, 0.6, 19};
            const Case c{group, tiles, 0.3f, 0.0f, 0.1, 7};
            for (const Case& cs : {a, b, c}) {
                ok &= run<128, 32>(cs, seed++);
                ok &= run<64, 32>(cs, seed++);
            }
        }
    }
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
