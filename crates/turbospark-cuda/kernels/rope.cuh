// RoPE's numerics, shared by rope_kv.cu (the rotation and KV write) and
// attention.cu (a decode step's fused kernels rotate q and k themselves):
// prepended to both (src/compile.rs), so every rotation gives the same bits.

// Passed by value in the kernel's parameter space (1 KiB), so a call copies
// no table to the device. Must match `RopeFreqs` in src/kernels.rs.
struct RopeFreqs {
    float f[256];
};

// The scaled cosine and sine of pair frequency `freq` at `position`: the
// angle f32(position) · freq, then precise cosf / sinf, each times the
// attention factor. Split from the rotation so that a kernel rotating
// many heads at one position (attention.cu's step kernels) computes them
// once a pair and shares them; the bits are those rotate_pair uses.
__device__ __forceinline__ void rope_cos_sin(u32 position, float freq, float factor, float& c,
                                             float& s) {
    const float angle = __fmul_rn((float)position, freq);
    c = __fmul_rn(cosf(angle), factor);
    s = __fmul_rn(sinf(angle), factor);
}

// Rotates the pair (a, b) by the scaled cosine c and sine s. Every product
// and sum is rounded on its own (the _rn intrinsics are never contracted
// into FMAs), as the CPU computes it, so each inlined copy gives the same
// bits.
__device__ __forceinline__ void rotate_by(float& a, float& b, float c, float s) {
    const float u = a, v = b;
    a = __fsub_rn(__fmul_rn(u, c), __fmul_rn(v, s));
    b = __fadd_rn(__fmul_rn(v, c), __fmul_rn(u, s));
}

// Rotates the pair (a, b) of a head at `position` by frequency `freq`.
__device__ __forceinline__ void rotate_pair(float& a, float& b, u32 position, float freq,
                                            float factor) {
    float c, s;
    rope_cos_sin(position, freq, factor, c, s);
    rotate_by(a, b, c, s);
}
