// The small kernels run on the CPU (cuda_shim.h), against the host:
// norm.cu's rms_norm (a row longer than its held values, per-head
// groups), elementwise.cu (embedding rows of each dtype, both gated
// activations, softcap, bias rows, adds, scales), rope_kv.cu (RoPE of q
// and k and the store's write, f32 and bf16 stores, a call with more rows
// than the ring has slots, a partial rotation) and convert.cu (f32 to
// bf16 and its hi + lo split, dense weights widened, and the MXFP4, int8
// and int4 dequantisers of the prefill GEMMs).
// Run by tests/emulated_kernels.rs; prints a line a check, then "all ok".
#include <random>
#include <string>

#include "cuda_shim.h"
#include "norm.cu"
#include "elementwise.cu"
#include "rope.cuh"
#include "kv_store.cuh"
#include "rope_kv.cu"
#include "convert.cu"
#include "report.h"

// Relative error of got against want, |want| below 1 counted as 1.
static double rel(double got, double want) {
    const double e = std::fabs(got - want) / std::max(1.0, std::fabs(want));
    return std::isnan(e) ? INFINITY : e;
}

static std::mt19937 rng(3);
static std::normal_distribution<float> nd(0.0f, 1.0f);
static std::vector<float> randn(size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = scale * nd(rng);
    return v;
}
// Round to nearest even, the host's (half::bf16::from_f32).
static u16 bf16_of(float f) {
    u32 u;
    std::memcpy(&u, &f, 4);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static bool norms() {
    bool ok = true;
    // (rows, d, threads): a long row re-read past its held values; heads.
    for (auto [rows, d, threads] : {std::tuple{2u, 2880u, 256u}, {6u, 128u, 128u}, {3u, 72u, 32u}}) {
        const auto x = randn(rows * d), w = randn(d);
        std::vector<float> out(rows * d, NAN);
        launch(rows, 1, threads, [&] { rms_norm(out.data(), x.data(), w.data(), DT_F32, d, 1e-6f); });
        double err = 0.0;
        for (u32 r = 0; r < rows; r++) {
            double ss = 0.0;
            for (u32 i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
            const double f = 1.0 / std::sqrt(ss / d + 1e-6);
            for (u32 i = 0; i < d; i++) err = std::max(err, rel(out[r * d + i], w[i] * (x[r * d + i] * f)));
        }
        ok &= report("rms_norm: " + std::to_string(rows) + " groups of " + std::to_string(d) + ", " +
                         std::to_string(threads) + " threads",
                     err, 1e-5);
    }
    return ok;
}

static bool elementwise() {
    bool ok = true;
    const u32 vocab = 7, d = 24, rows = 4;
    const auto table = randn(vocab * d);
    std::vector<u16> t16(vocab * d), t_f16(vocab * d);
    for (size_t i = 0; i < table.size(); i++) {
        t16[i] = bf16_of(table[i]);
        t_f16[i] = (u16)((i * 2654435761u) % 0x7bffu);  // finite f16 bit patterns
    }
    const u32 tokens[rows] = {6, 0, 3, 6};
    for (int dt : {DT_F32, DT_BF16, DT_F16}) {
        const void* tab = dt == DT_F32 ? (const void*)table.data() : dt == DT_BF16 ? (const void*)t16.data() : t_f16.data();
        std::vector<float> out(rows * d, NAN);
        launch(2, 1, 32, [&] { embed(out.data(), tab, dt, tokens, rows, d); });
        double err = 0.0;
        for (u32 r = 0; r < rows; r++) {
            for (u32 c = 0; c < d; c++) {
                const u64 i = (u64)tokens[r] * d + c;
                const double want = dt == DT_F32 ? table[i] : dt == DT_BF16 ? bf16_to_f32(t16[i]) : f16_to_f32(t_f16[i]);
                err = std::max(err, out[r * d + c] == want ? 0.0 : INFINITY);
            }
        }
        ok &= report(std::string("embed: rows by token, ") + (dt == DT_F32 ? "f32" : dt == DT_BF16 ? "bf16" : "f16") + " table", err, 0.0);
    }
    const u64 n = 100;
    const auto g = randn(n, 3.0f), u = randn(n), y = randn(n);
    for (int act : {0, 1}) {
        std::vector<float> out(n, NAN);
        launch(2, 1, 32, [&] { glu(out.data(), g.data(), u.data(), n, act); });
        double err = 0.0;
        for (u64 i = 0; i < n; i++) {
            const double a = g[i];
            const double s = act == 0 ? a / (1.0 + std::exp(-a))
                                      : 0.5 * a * (1.0 + std::tanh(0.7978845608 * (a + 0.044715 * a * a * a)));
            err = std::max(err, rel(out[i], s * u[i]));
        }
        ok &= report(act == 0 ? "glu: silu(gate) · up" : "glu: gelu_tanh(gate) · up", err, 1e-5);
    }
    std::vector<float> x = g;
    launch(1, 1, 64, [&] { softcap_inplace(x.data(), 2.5f, n); });
    double err = 0.0;
    for (u64 i = 0; i < n; i++) err = std::max(err, rel(x[i], 2.5 * std::tanh(g[i] / 2.5)));
    ok &= report("softcap_inplace: cap · tanh(x / cap)", err, 1e-6);
    x = g;
    launch(1, 1, 64, [&] { add_inplace(x.data(), y.data(), n); });
    launch(1, 1, 64, [&] { scale_inplace(x.data(), 0.5f, n); });
    err = 0.0;
    for (u64 i = 0; i < n; i++) err = std::max(err, rel(x[i], ((double)g[i] + y[i]) * 0.5));
    ok &= report("add_inplace, scale_inplace", err, 1e-7);
    x = g;
    std::vector<u16> b16(20);
    for (u32 c = 0; c < 20; c++) b16[c] = bf16_of(y[c]);
    launch(1, 1, 32, [&] { add_bias(x.data(), b16.data(), DT_BF16, 5, 20); });
    err = 0.0;
    for (u64 i = 0; i < n; i++) err = std::max(err, rel(x[i], (double)g[i] + bf16_to_f32(b16[i % 20])));
    ok &= report("add_bias: bf16 bias rows", err, 1e-7);
    return ok;
}

// RoPE of q and k and the store's write, against f64 rotations; the store
// rows bit for bit where the f32 rotation is rounded once (bf16) or not.
template <class S>
static bool rope_case(const char* what, u32 rows, u32 capacity, u32 head_dim, u32 pairs) {
    const u32 q_heads = 4, kv_heads = 2, qw = q_heads * head_dim, kw = kv_heads * head_dim;
    std::vector<u32> positions(rows);
    for (u32 r = 0; r < rows; r++) positions[r] = 40 + 3 * r;
    auto q = randn(rows * qw), k = randn(rows * kw);
    const auto v = randn(rows * kw), q0 = q, k0 = k;
    std::vector<S> kc(capacity * kw, 0), vc(capacity * kw, 0);
    std::vector<i64> slot_pos(capacity, -1);
    RopeFreqs freqs{};
    for (u32 i = 0; i < head_dim / 2; i++) freqs.f[i] = std::pow(500000.0f, -(2.0f * i) / head_dim);
    const float factor = 1.25f;
    void (*kernel)(float*, float*, const float*, S*, S*, i64*, const u32*, RopeFreqs, float, u32,
                   u32, u32, u32, u32, u32) = sizeof(S) == 2 ? (decltype(kernel))rope_kv_write_bf16kv
                                                                : (decltype(kernel))rope_kv_write;
    launch(3, 1, 64, [&] {
        kernel(q.data(), k.data(), v.data(), kc.data(), vc.data(), slot_pos.data(), positions.data(),
               freqs, factor, rows, qw, kw, head_dim, pairs, capacity);
    });
    double err = 0.0;
    const u32 half = head_dim / 2;
    auto rotated = [&](const std::vector<float>& src, u32 width, u32 r, u32 col) {
        const u32 h = col / head_dim, i = col % head_dim, j = i % half;
        const float* p = &src[r * width + h * head_dim];
        if (j >= pairs || i >= 2 * half) return (double)p[i];
        const double angle = (double)(float)((float)positions[r] * freqs.f[j]);
        const double c = std::cos(angle) * factor, s = std::sin(angle) * factor;
        return i < half ? p[i] * c - p[i + half] * s : p[i] * c + p[i - half] * s;
    };
    for (u32 r = 0; r < rows; r++) {
        for (u32 c = 0; c < qw; c++) err = std::max(err, rel(q[r * qw + c], rotated(q0, qw, r, c)));
        for (u32 c = 0; c < kw; c++) err = std::max(err, rel(k[r * kw + c], rotated(k0, kw, r, c)));
    }
    // The store: each slot holds the last row of the call that maps to it,
    // its key as the kernel rotated it (k, now) and its value.
    bool store_ok = true;
    for (u32 s = 0; s < capacity; s++) {
        i64 last = -1;
        for (u32 r = 0; r < rows; r++) {
            if (positions[r] % capacity == s) last = r;
        }
        if (last < 0) {
            store_ok &= slot_pos[s] == -1;
            continue;
        }
        store_ok &= slot_pos[s] == positions[last];
        for (u32 c = 0; c < kw; c++) {
            S kw_, vw_;
            kv_put(&kw_, 0, k[last * kw + c]);
            kv_put(&vw_, 0, v[last * kw + c]);
            store_ok &= kc[s * kw + c] == kw_ && vc[s * kw + c] == vw_;
        }
    }
    return report(std::string("rope_kv_write") + (sizeof(S) == 2 ? "_bf16kv: " : ": ") + what,
                  store_ok ? err : INFINITY, 1e-5);
}

static bool converts() {
    bool ok = true;
    const u64 n = 1003;  // not a multiple of 4: the one-at-a-time tail
    const auto x = randn(n, 10.0f);
    std::vector<u16> b(n), hi(n), lo(n);
    launch(2, 1, 64, [&] { to_bf16(b.data(), x.data(), n); });
    launch(2, 1, 64, [&] { split_bf16(hi.data(), lo.data(), x.data(), n); });
    bool same = true;
    for (u64 i = 0; i < n; i++) {
        same &= b[i] == bf16_of(x[i]) && hi[i] == bf16_of(x[i]);
        same &= lo[i] == bf16_of(x[i] - bf16_to_f32(bf16_of(x[i])));
    }
    ok &= report("to_bf16, split_bf16: 1,003 values, nearest even", same ? 0.0 : INFINITY, 0.0);
    std::vector<u16> h(64);
    for (u32 i = 0; i < 64; i++) h[i] = (u16)(0x3c00 + 37 * i);
    std::vector<float> wide(64);
    launch(1, 1, 32, [&] { widen_f32(wide.data(), h.data(), DT_F16, 64); });
    same = true;
    for (u32 i = 0; i < 64; i++) same &= wide[i] == f16_to_f32(h[i]);
    ok &= report("widen_f32: f16 weights, exactly", same ? 0.0 : INFINITY, 0.0);
    // Dequantisers: 5 groups of 32 values.
    const u64 groups = 5;
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<u8> blocks(groups * 16), scales(groups), codes8(groups * 32), codes4(groups * 16);
    for (auto& c : blocks) c = (u8)byte(rng);
    for (auto& c : codes8) c = (u8)byte(rng);
    for (auto& c : codes4) c = (u8)byte(rng);
    for (auto& s : scales) s = (u8)(120 + byte(rng) % 12);
    std::vector<u16> f16s(groups);
    for (auto& s : f16s) s = (u16)((9 << 10) | byte(rng) * 3);
    std::vector<u16> out(groups * 32);
    launch(1, 1, 32, [&] { mxfp4_to_bf16(out.data(), blocks.data(), scales.data(), groups); });
    static const double E2M1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    same = true;
    for (u64 g = 0; g < groups; g++) {
        for (u32 i = 0; i < 32; i++) {
            const u32 nib = (blocks[g * 16 + i / 2] >> (4 * (i % 2))) & 15u;
            const double v = (nib & 8 ? -1.0 : 1.0) * E2M1[nib & 7] * std::ldexp(1.0, scales[g] - 127);
            same &= bf16_to_f32(out[g * 32 + i]) == v;
        }
    }
    ok &= report("mxfp4_to_bf16: exact", same ? 0.0 : INFINITY, 0.0);
    // Scales a group (shift 0) and a 128 values (shift 2: groups 0-3 read
    // scale 0, group 4 scale 1).
    for (u32 shift : {0u, 2u}) {
        for (int kind : {0, 1}) {
            launch(1, 1, 32, [&] {
                dequant_bf16(out.data(), kind == 0 ? codes8.data() : codes4.data(), f16s.data(),
                             groups, kind, shift);
            });
            same = true;
            for (u64 g = 0; g < groups; g++) {
                for (u32 i = 0; i < 32; i++) {
                    const int c = kind == 0
                                      ? (int)(int8_t)codes8[g * 32 + i]
                                      : (int)((codes4[g * 16 + i / 2] >> (4 * (i % 2))) & 15u) - 8;
                    same &= out[g * 32 + i] == bf16_of((float)c * f16_to_f32(f16s[g >> shift]));
                }
            }
            const std::string what = std::string(kind == 0 ? "dequant_bf16: int8" : "dequant_bf16: int4") +
                                     ", code · scale rounded once, scale shift " + std::to_string(shift);
            ok &= report(what, same ? 0.0 : INFINITY, 0.0);
        }
    }
    return ok;
}

int main() {
    bool ok = norms();
    ok &= elementwise();
    ok &= rope_case<float>("5 rows, ring of 8, head_dim 64", 5, 8, 64, 32);
    ok &= rope_case<u16>("5 rows, ring of 8, head_dim 64", 5, 8, 64, 32);
    ok &= rope_case<float>("9 rows over a ring of 4 (later rows win)", 9, 4, 32, 16);
    ok &= rope_case<u16>("9 rows over a ring of 4, 10 of 64 pairs rotate", 9, 4, 128, 10);
    ok &= converts();
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
