// Rotary embedding, transformers' "rotate half" convention: pair i of a head
// is (i, i + head_dim/2); angle = f32(position) · inv_freq[i] in f32, and cos
// and sin (precise cosf/sinf, full range reduction) are multiplied by the
// attention factor before use. Only the first `pairs` pairs rotate (all of
// them unless the table is shorter, as on the CPU). One thread per (row,
// head, pair).

// Passed by value in the kernel's parameter space (1 KiB), so a call copies
// no table to the device. Must match `RopeFreqs` in src/ops.rs.
struct RopeFreqs {
    float f[256];
};

extern "C" __global__ void rope(float* x, const u32* positions, RopeFreqs freqs, float factor,
                                u32 rows, u32 width, u32 head_dim, u32 pairs) {
    const u32 half = head_dim / 2, heads = width / head_dim;
    FOR_EACH(idx, (u64)rows * heads * pairs) {
        const u32 i = (u32)(idx % pairs);
        const u64 t = idx / pairs;
        const u32 h = (u32)(t % heads);
        const u64 r = t / heads;
        const float angle = (float)positions[r] * freqs.f[i];
        const float c = cosf(angle) * factor, s = sinf(angle) * factor;
        float* p = x + r * width + (u64)h * head_dim;
        const float u = p[i], v = p[i + half];
        p[i] = u * c - v * s;
        p[i + half] = v * c + u * s;
    }
}
