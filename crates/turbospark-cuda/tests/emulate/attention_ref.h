// The host's attention of one query row and head, in f64: the reference of
// attention.cpp and flash.cpp. Scores over every visible slot (a key at
// position k is visible to a query at q when 0 ≤ k ≤ q and, for a window
// w > 0, q − k < w), scaled, softcapped, the sink logit (if any) in the
// denominator only. `q(d)`, `k(slot, d)` and `v(slot, d)` give the
// operands as the kernel under test multiplies them.
#pragma once
#include <cmath>
#include <vector>

template <class Q, class K, class V>
std::vector<double> attend(u32 hd, const std::vector<i64>& slot_pos, i64 qpos, i64 window,
                           double scale, float softcap, const float* sink, Q q, K k, V v) {
    std::vector<double> sc, out(hd, 0.0);
    std::vector<u32> slots;
    for (u32 s = 0; s < slot_pos.size(); s++) {
        const i64 kp = slot_pos[s];
        if (kp < 0 || kp > qpos || (window > 0 && qpos - kp >= window)) continue;
        double x = 0.0;
        for (u32 d = 0; d < hd; d++) x += q(d) * k(s, d);
        x *= scale;
        if (softcap > 0.0f) x = softcap * std::tanh(x / softcap);
        sc.push_back(x);
        slots.push_back(s);
    }
    double m = -INFINITY;
    for (double x : sc) m = std::max(m, x);
    if (sink) m = std::max(m, (double)*sink);
    double l = sink ? std::exp(*sink - m) : 0.0;
    for (size_t i = 0; i < sc.size(); i++) {
        const double p = std::exp(sc[i] - m);
        l += p;
        for (u32 d = 0; d < hd; d++) out[d] += p * v(slots[i], d);
    }
    for (double& x : out) x /= l;
    return out;
}

// |got − want| / rms(want), element by element (NaN: infinite).
inline std::vector<double> errors_of(const float* got, const std::vector<double>& want) {
    double rms = 0.0;
    for (double x : want) rms += x * x;
    rms = std::sqrt(rms / want.size());
    std::vector<double> e(want.size());
    for (size_t d = 0; d < want.size(); d++) {
        e[d] = std::fabs(got[d] - want[d]) / rms;
        if (std::isnan(e[d])) e[d] = INFINITY;
    }
    return e;
}
