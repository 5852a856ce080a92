// kernels/attention.cu and attention_combine.cu run on the CPU
// (cuda_shim.h): a decode step's fused kernels (RoPE of q and k, the
// store's write, the split attention or the window form), every form of
// the GQA kernel over f32 and bf16 stores (the tensor-core ones too, one
// warp a block), the same kernels' plain forms and `attn_partial` over the
// written store, each merged by the real `attn_combine`. Checked against
// the host: the stored key (rotated),
// value and position bit for bit, and the output against an f64 softmax
// over the same stored keys and values (sinks in the denominator,
// softcaps, windows, rings past their capacity, empty slots). The shapes
// are parity_kv's step cases and the families' groups.
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include <cstdio>
#include <random>
#include <string>

#include "cuda_shim.h"
#include "rope.cuh"
#include "kv_store.cuh"
#include "mma.cuh"
#include "attention_mma.cuh"
#include "attention.cu"
#include "attention_combine.cu"
#include "attention_ref.h"

// A GQA kernel's step form over a store of S (u16: bf16 bits, or f32) and
// its plain form (q rotated and the store written before it).
template <class S>
struct Form {
    typedef void (*Step)(float*, float*, const float*, const S*, const S*, const i64*, const u32*,
                         u32, u32, u32, u32, float, float, i64, u32, u32, u32, u32, u32, GqaStep);
    typedef void (*Plain)(float*, float*, const float*, const S*, const S*, const i64*,
                          const u32*, u32, u32, u32, u32, float, float, i64, u32, u32, u32, u32,
                          u32);
    typedef void (*Partial)(float*, float*, const float*, const S*, const S*, const i64*,
                            const u32*, u32, u32, u32, u32, float, float, i64, u32, u32, u32,
                            u32);
    const char* name;
    Step step;
    Plain plain;
    u32 threads_per_head;  // 32 · P; 0: one warp a block (the tensor-core forms)
    bool window;           // the window form: one split, no combine
};

// attn_partial's kernel for a store of S (the name is also its template's).
static Form<float>::Partial attn_partial_of(const float*) {
    return static_cast<Form<float>::Partial>(attn_partial);
}
static Form<u16>::Partial attn_partial_of(const u16*) { return attn_partial_bf16kv; }

struct Case {
    const char* what;
    u32 heads, kv_heads, hd, capacity, pos, window, pairs;
    bool sinks;
    float softcap;
    bool holes = false;  // every 7th of the first 64 slots empty
};

// The output of every query head (attn_combine over the partials).
static std::vector<float> combine(const std::vector<float>& part_o,
                                  const std::vector<float>& part_ml, const float* sinks,
                                  const Case& c, const u32* positions, u32 splits,
                                  u32 per_split) {
    std::vector<float> out(c.heads * c.hd, 0.0f);
    launch(c.heads, 1, ATT_COMBINE_THREADS, [&] {
        attn_combine(out.data(), part_o.data(), part_ml.data(), sinks, DT_F32, c.heads, c.hd,
                     splits, positions, (i64)c.window, 0, c.capacity, per_split, c.capacity, 0);
    });
    return out;
}

// Worst |got − f64 reference| / rms of the reference over the heads.
static double worst_error(const Case& c, const std::vector<float>& got, const std::vector<float>& qr,
                          const void* kc, const void* vc, bool bf16,
                          const std::vector<i64>& slot_pos, const std::vector<float>& sinks) {
    const u32 group = c.heads / c.kv_heads, kv_dim = c.kv_heads * c.hd;
    auto at = [&](const void* p, u64 i) {
        return bf16 ? (double)bf16_to_f32(((const u16*)p)[i]) : (double)((const float*)p)[i];
    };
    double worst = 0.0;
    for (u32 h = 0; h < c.heads; h++) {
        const u64 kv0 = (h / group) * c.hd;
        const std::vector<double> want = attend(
            c.hd, slot_pos, c.pos, c.window, 1.0 / std::sqrt((double)c.hd), c.softcap,
            c.sinks ? &sinks[h] : nullptr, [&](u32 d) { return (double)qr[h * c.hd + d]; },
            [&](u32 s, u32 d) { return at(kc, s * kv_dim + kv0 + d); },
            [&](u32 s, u32 d) { return at(vc, s * kv_dim + kv0 + d); });
        for (double e : errors_of(&got[h * c.hd], want)) worst = std::max(worst, e);
    }
    return worst;
}

// f32 forms land ~1e-6 of the rms from f64, the tensor-core ones a few
// 1e-5 (their q and weights carry ~16 bits: mma_tile.cpp); an indexing
// fault is O(1).
static constexpr double TOL = 1e-4;

// One form of one case; false if a check fails.
template <class S>
static bool run(const Case& c, const Form<S>& form, u32 seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const u32 group = c.heads / c.kv_heads, kv_dim = c.kv_heads * c.hd;
    std::vector<S> kc(c.capacity * kv_dim, 0), vc(c.capacity * kv_dim, 0);
    std::vector<i64> slot_pos(c.capacity, -1);
    for (u32 p = 0; p < c.pos; p++) {
        const u32 s = p % c.capacity;
        for (u32 i = 0; i < kv_dim; i++) {
            kv_put(kc.data(), s * kv_dim + i, nd(rng));
            kv_put(vc.data(), s * kv_dim + i, nd(rng));
        }
        slot_pos[s] = p;
    }
    if (c.holes) {
        for (u32 s = 0; s < 64 && s < c.capacity; s += 7) slot_pos[s] = -1;
    }
    std::vector<float> q(c.heads * c.hd), k(kv_dim), v(kv_dim), sinks(c.heads);
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : sinks) x = 2.0f * nd(rng);
    const float* sink_ptr = c.sinks ? sinks.data() : nullptr;
    GqaStep st{};
    for (u32 i = 0; i < c.pairs; i++) st.freqs.f[i] = std::pow(10000.0f, -(2.0f * i) / c.hd);
    st.factor = 1.1f;
    st.pairs = c.pairs;
    const float scale = 1.0f / std::sqrt((float)c.hd);
    // A tile's slots: GQA_TILE_VALUES over the kernel's head_dim (96 runs
    // on the 128 kernel), at most 32.
    const u32 kernel_hd = c.hd <= 64 ? 64 : c.hd <= 128 ? 128 : 256;
    const u32 T = std::min(GQA_TILE_VALUES / kernel_hd, 32u);
    const u32 per_split = form.window ? c.capacity : T;
    const u32 splits = (c.capacity + per_split - 1) / per_split;
    std::vector<float> part_o(c.heads * splits * c.hd, 0.0f), part_ml(c.heads * splits * 2, 0.0f);
    std::vector<float> out(c.heads * c.hd, 0.0f);
    const u32 positions[1] = {c.pos};
    std::vector<S> gk = kc, gv = vc;
    std::vector<i64> gpos = slot_pos;
    st.k = k.data();
    st.v = v.data();
    st.kc = gk.data();
    st.vc = gv.data();
    st.slot_pos = gpos.data();
    st.out = out.data();
    st.sinks = sink_ptr;
    st.sinks_dt = DT_F32;
    const u32 threads = form.threads_per_head ? form.threads_per_head * group : 32;
    launch(c.kv_heads, splits, threads, [&] {
        form.step(part_o.data(), part_ml.data(), q.data(), gk.data(), gv.data(), gpos.data(),
                  positions, c.heads, group, c.hd, kv_dim, scale, c.softcap, (i64)c.window, 0,
                  c.capacity, per_split, c.capacity, splits, st);
    });

    // The host: the step's key rotated as rope.cuh rotates it, stored in
    // the store's dtype; the query rotated the same way. (rope.cuh's own
    // arithmetic is checked against f64 in small.cpp: here, that the step
    // rotates the right pairs and stores the right bits.)
    const u32 slot = c.pos % c.capacity, half = c.hd / 2;
    auto rotate_head = [&](float* head) {
        for (u32 i = 0; i < c.pairs; i++) {
            float cs, sn;
            rope_cos_sin(c.pos, st.freqs.f[i], st.factor, cs, sn);
            rotate_by(head[i], head[i + half], cs, sn);
        }
    };
    std::vector<float> qr = q;
    for (u32 h = 0; h < c.heads; h++) rotate_head(&qr[h * c.hd]);
    for (u32 h = 0; h < c.kv_heads; h++) {
        std::vector<float> kr(k.begin() + h * c.hd, k.begin() + (h + 1) * c.hd);
        rotate_head(kr.data());
        for (u32 d = 0; d < c.hd; d++) {
            kv_put(kc.data(), slot * kv_dim + h * c.hd + d, kr[d]);
            kv_put(vc.data(), slot * kv_dim + h * c.hd + d, v[h * c.hd + d]);
        }
    }
    slot_pos[slot] = c.pos;
    const bool bf16 = sizeof(S) == 2;
    bool ok = gk == kc && gv == vc && gpos == slot_pos;
    if (!ok) std::printf("%s, %s: the store differs from the host's\n", c.what, form.name);
    const std::vector<float> got =
        form.window ? out : combine(part_o, part_ml, sink_ptr, c, positions, splits, per_split);
    const double step_err = worst_error(c, got, qr, kc.data(), vc.data(), bf16, slot_pos, sinks);

    // The plain form, and attn_partial, over the written store.
    double plain_err = 0.0, partial_err = 0.0;
    if (!form.window) {
        std::vector<float> po(part_o.size(), 0.0f), pml(part_ml.size(), 0.0f);
        launch(c.kv_heads, splits, threads, [&] {
            form.plain(po.data(), pml.data(), qr.data(), kc.data(), vc.data(), slot_pos.data(),
                       positions, c.heads, group, c.hd, kv_dim, scale, c.softcap, (i64)c.window,
                       0, c.capacity, per_split, c.capacity, splits);
        });
        plain_err = worst_error(c, combine(po, pml, sink_ptr, c, positions, splits, per_split), qr,
                                kc.data(), vc.data(), bf16, slot_pos, sinks);
        std::fill(po.begin(), po.end(), 0.0f);
        std::fill(pml.begin(), pml.end(), 0.0f);
        typename Form<S>::Partial partial = attn_partial_of((const S*)nullptr);
        launch(c.heads, splits, 32 * ATT_WARPS, [&] {
            partial(po.data(), pml.data(), qr.data(), kc.data(), vc.data(), slot_pos.data(),
                    positions, c.heads, group, c.hd, kv_dim, scale, c.softcap, (i64)c.window, 0,
                    c.capacity, per_split, c.capacity);
        });
        partial_err = worst_error(c, combine(po, pml, sink_ptr, c, positions, splits, per_split),
                                  qr, kc.data(), vc.data(), bf16, slot_pos, sinks);
    }
    ok &= step_err <= TOL && plain_err <= TOL && partial_err <= TOL;
    std::printf("%-46s %-4s %-36s max|do|/rms %.2e", c.what, bf16 ? "bf16" : "f32", form.name,
                step_err);
    if (!form.window) std::printf(" (plain %.2e, attn_partial %.2e)", plain_err, partial_err);
    std::printf(" %s\n", ok ? "ok" : "FAIL");
    return ok;
}

int main() {
    // (what, heads, kv heads, head_dim, capacity, position, window, rotary
    // pairs, sinks, softcap)
    const Case llama{"Llama-8B's group (4 of 128), full", 8, 2, 128, 300, 250, 0, 64, false, 0.0f};
    const Case wrapped{"4 of 128, past the ring's capacity", 8, 2, 128, 70, 100, 0, 64, false, 0.0f};
    const Case softcap{"4 of 128, softcap 2, rotary 20 pairs", 8, 2, 128, 100, 50, 0, 20, false, 2.0f};
    const Case holes{"4 of 128, empty slots", 8, 2, 128, 200, 190, 0, 64, false, 0.0f, true};
    const Case ctx2k{"Llama-8B at 2,048 positions (64 splits)", 8, 2, 128, 2176, 2047, 0, 64,
                     false, 0.0f};
    const Case hd96{"4 of 96 on the 128 kernel", 8, 2, 96, 300, 40, 0, 20, false, 0.0f};
    const Case qwen{"Qwen3-30B-A3B's group (8 of 128), full", 16, 2, 128, 200, 150, 0, 32, false, 0.0f};
    const Case oss{"gpt-oss's group (8 of 64), full, sinks", 16, 2, 64, 300, 200, 0, 32, true, 0.0f};
    const Case four64{"4 of 64, full, past capacity, sinks", 8, 2, 64, 70, 60, 0, 32, true, 0.0f};
    const Case g16{"16 of 64, full, sinks", 16, 1, 64, 200, 90, 0, 32, true, 0.0f};
    const Case hd256{"2 of 256, softcap 2", 2, 1, 256, 100, 50, 0, 128, false, 2.0f};
    const Case oss_win{"8 of 64, window 128, wrapped, sinks", 16, 2, 64, 136, 140, 128, 32, true, 0.0f};
    const Case small_win{"2 of 64, window 5 over a ring of 9, sinks", 6, 3, 64, 9, 12, 5, 32, true, 0.0f};
    const Case g16_win{"16 of 64, window 40 over a wrapped ring, sinks", 16, 1, 64, 160, 190, 40, 32,
                       true, 0.0f};
#define FORMS(kernel, per_head)                                                   \
    Form<float>{#kernel, kernel##_step, kernel, per_head, false},                 \
        Form<u16>{#kernel "_bf16kv", kernel##_bf16kv_step, kernel##_bf16kv, per_head, false}
#define WINDOW(kernel) Form<u16>{#kernel "_window", kernel##_window, nullptr, 32, true}
#define MMA(kernel) Form<u16>{#kernel, kernel##_step, kernel, 0, false}
    const auto [g4, g4b] = std::pair{FORMS(attn_gqa_hd128_g4, 64)};
    const auto [g8, g8b] = std::pair{FORMS(attn_gqa_hd128_g8, 32)};
    const auto [h64, h64b] = std::pair{FORMS(attn_gqa_hd64_g8, 32)};
    const auto [h64g16, h64g16b] = std::pair{FORMS(attn_gqa_hd64_g16, 32)};
    const auto [h256, h256b] = std::pair{FORMS(attn_gqa_hd256_g4, 64)};
    const auto win = WINDOW(attn_gqa_hd64_g8_bf16kv);
    const auto win16 = WINDOW(attn_gqa_hd64_g16_bf16kv);
    // The tensor-core forms.
    const auto g4m = MMA(attn_gqa_hd128_g4_bf16kv_mma), g8m = MMA(attn_gqa_hd128_g8_bf16kv_mma);
    const auto h64m = MMA(attn_gqa_hd64_g8_bf16kv_mma);
    const auto winm = Form<u16>{"attn_gqa_hd64_g8_bf16kv_mma_window",
                                attn_gqa_hd64_g8_bf16kv_mma_window, nullptr, 0, true};
    bool ok = true;
    u32 seed = 7;
    auto each = [&](const Case& c, auto... forms) {
        ((ok &= run(c, forms, seed)), ...);
        seed++;
    };
    each(llama, g4, g4b, g4m);
    each(wrapped, g4, g4b, g4m);
    each(softcap, g4, g4b, g4m);
    each(holes, g4, g4b, g4m);
    each(ctx2k, g4, g4b, g4m);
    each(hd96, g4, g4b);
    each(qwen, g8, g8b, g8m);
    each(oss, h64, h64b, h64m);
    each(four64, h64, h64b, h64m);
    each(g16, h64g16, h64g16b);
    each(hd256, h256, h256b);
    each(oss_win, win, winm, h64, h64b, h64m);
    each(small_win, win, winm, h64, h64b, h64m);
    each(g16_win, win16, h64g16, h64g16b);
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
