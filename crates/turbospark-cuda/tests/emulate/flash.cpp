// kernels/flash_attention.cu run on the CPU (cuda_shim.h, with mma.sync
// and ldmatrix.trans emulated from the PTX ISA's fragment layouts): the
// prefill attention over f32 and bf16 stores for head dims 64, 128 and
// 256, against an f64 softmax over the same bf16-rounded q, k and v. The
// kernels also round each probability to bf16 before it multiplies V (the
// documented precision of the prefill path), which leaves ~1e-3 of the
// rms (~7e-3 at worst); an indexing or fragment fault is O(1). Cases: a prompt continuing
// a cached prefix, GQA groups, a sliding window over a ring that wrapped,
// softcap, sinks, rows not a multiple of the block's 64.
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include <random>
#include <string>

#include "cuda_shim.h"
#include "kv_store.cuh"
#include "mma.cuh"
#include "flash_attention.cu"
#include "attention_ref.h"

struct Case {
    const char* what;
    u32 hd, heads, kv_heads, n, prefix, capacity, window;
    bool sinks;
    float softcap;
};

template <class S>
using Flash = void (*)(float*, const float*, const S*, const S*, const i64*, const u32*,
                       const void*, int, u32, u32, u32, u32, u32, float, float, i64);

template <class S>
static Flash<S> kernel_for(u32 hd) {
    if constexpr (sizeof(S) == 2) {
        return hd == 64 ? flash_attn_hd64_bf16kv : hd == 128 ? flash_attn_hd128_bf16kv : flash_attn_hd256_bf16kv;
    } else {
        return hd == 64 ? flash_attn_hd64 : hd == 128 ? flash_attn_hd128 : flash_attn_hd256;
    }
}

static float bf16_round(float v) { return bf16_to_f32(f32_to_bf16(v)); }

template <class S>
static bool run(const Case& c, u32 seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const u32 group = c.heads / c.kv_heads, kv_dim = c.kv_heads * c.hd, total = c.prefix + c.n;
    // The store after the prompt's rows were written: position p in slot
    // p % capacity (later positions win).
    std::vector<S> kc(c.capacity * kv_dim, 0), vc(c.capacity * kv_dim, 0);
    std::vector<i64> slot_pos(c.capacity, -1);
    for (u32 p = 0; p < total; p++) {
        const u32 s = p % c.capacity;
        for (u32 i = 0; i < kv_dim; i++) {
            kv_put(kc.data(), s * kv_dim + i, nd(rng));
            kv_put(vc.data(), s * kv_dim + i, nd(rng));
        }
        slot_pos[s] = p;
    }
    std::vector<float> q(c.n * c.heads * c.hd), sinks(c.heads), out(q.size(), NAN);
    for (auto& v : q) v = nd(rng);
    for (auto& v : sinks) v = 2.0f * nd(rng);
    std::vector<u32> positions(c.n);
    for (u32 r = 0; r < c.n; r++) positions[r] = c.prefix + r;
    const float scale = 1.0f / std::sqrt((float)c.hd);
    const u32 tile = c.hd == 256 ? 32 : 64;
    const size_t shared = sizeof(S) == 2 ? 2 * 2 * tile * (c.hd + 8) * 2 : 0;
    const Flash<S> f = kernel_for<S>(c.hd);
    launch((c.n + 63) / 64, c.heads, FA_THREADS, [&] {
        f(out.data(), q.data(), kc.data(), vc.data(), slot_pos.data(), positions.data(),
          c.sinks ? sinks.data() : nullptr, DT_F32, c.n, c.heads, group, kv_dim, c.capacity, scale,
          c.softcap, (i64)c.window);
    }, shared);

    // f64 over every visible slot, q, k and v rounded to bf16 as the
    // kernels' operands are.
    double worst = 0.0, sq = 0.0;
    u64 count = 0;
    for (u32 r = 0; r < c.n; r++) {
        for (u32 h = 0; h < c.heads; h++) {
            const u64 kv0 = (h / group) * c.hd, q0 = (r * c.heads + h) * c.hd;
            const std::vector<double> want = attend(
                c.hd, slot_pos, positions[r], c.window, scale, c.softcap,
                c.sinks ? &sinks[h] : nullptr, [&](u32 d) { return (double)bf16_round(q[q0 + d]); },
                [&](u32 s, u32 d) { return (double)bf16_round(kv_get(kc.data(), s * kv_dim + kv0 + d)); },
                [&](u32 s, u32 d) { return (double)bf16_round(kv_get(vc.data(), s * kv_dim + kv0 + d)); });
            for (double e : errors_of(&out[q0], want)) {
                worst = std::max(worst, e);
                sq += e * e;
                count++;
            }
        }
    }
    // Each element within 2e-2 of the rms (the GPU tests' bound against
    // the f32 kernels) and the rms of the errors within 3e-3 (bf16 p: ~1.3e-3).
    const double rms_err = std::sqrt(sq / count);
    const bool ok = worst <= 2e-2 && rms_err <= 3e-3;
    std::printf("%-56s %-4s hd %3u |do|/rms max %.2e, rms %.2e %s\n", c.what,
                sizeof(S) == 2 ? "bf16" : "f32", c.hd, worst, rms_err, ok ? "ok" : "FAIL");
    return ok;
}

int main() {
    // (what, head_dim, heads, kv heads, rows, prefix, capacity, window, sinks, softcap)
    const Case cases[] = {
        {"Llama's group of 4, a prompt of 100 after 30", 128, 8, 2, 100, 30, 256, 0, false, 0.0f},
        {"gpt-oss's group of 8, window 48 over a wrapped ring, sinks", 64, 16, 2, 70, 40, 96, 48, true, 0.0f},
        {"gpt-oss's full span, sinks, 130 rows", 64, 8, 1, 130, 0, 160, 0, true, 0.0f},
        {"Gemma-like: head_dim 256, softcap 50, window 40", 256, 4, 2, 50, 20, 128, 40, false, 50.0f},
    };
    bool ok = true;
    u32 seed = 23;
    for (const Case& c : cases) {
        ok &= run<float>(c, seed);
        ok &= run<u16>(c, seed++);
    }
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
