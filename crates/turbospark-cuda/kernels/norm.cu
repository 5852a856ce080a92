// RMSNorm over groups of `d` values (a whole row, or one head of it).
// transformers' order in f32: r = 1 / sqrt(mean(x²) + eps), out = w · (x · r).
// One block per group; the sum of squares is a block tree reduction (the CPU
// sums sequentially, so results differ by rounding only). A decode row is a
// single block, so its time is load latency: each thread loads its (at most
// NORM_HELD) values at once and keeps them in registers for the second
// pass; values beyond that (d > NORM_HELD · blockDim) are read again. The
// weights, which no kernel writes, are loaded before waiting for the
// previous kernel (programmatic dependent launch), so the only round trip
// left after it is the one for x.

#define NORM_HELD 8

// out = rms_norm(x) for the block's group.
__device__ __forceinline__ void norm_group(float* out, const float* x, const void* w, int dt,
                                           u32 d, float eps) {
    const u64 base = (u64)blockIdx.x * d;
    const u32 t = threadIdx.x, bd = blockDim.x;
    float wv[NORM_HELD];
#pragma unroll
    for (int j = 0; j < NORM_HELD; j++) {
        const u32 i = t + j * bd;
        wv[j] = i < d ? load_w(w, dt, i) : 0.0f;
    }
    pdl_enter();
    float held[NORM_HELD];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_HELD; j++) {
        const u32 i = t + j * bd;
        held[j] = 0.0f;
        if (i < d) held[j] = x[base + i];
    }
#pragma unroll
    for (int j = 0; j < NORM_HELD; j++) ss += held[j] * held[j];
    for (u32 i = t + NORM_HELD * bd; i < d; i += bd) ss += x[base + i] * x[base + i];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
#pragma unroll
    for (int j = 0; j < NORM_HELD; j++) {
        const u32 i = t + j * bd;
        if (i < d) out[base + i] = wv[j] * (held[j] * r);
    }
    for (u32 i = t + NORM_HELD * bd; i < d; i += bd) {
        out[base + i] = load_w(w, dt, i) * (x[base + i] * r);
    }
}

// The residual adds live in the GEMVs that produce them (gemv_*.cu), and a
// decode row's norm usually in the GEMV that reads it; this kernel serves
// the rest (prefill, per-head norms, Gemma's post-norms).
extern "C" __global__ void rms_norm(float* out, const float* x, const void* w, int dt, u32 d,
                                    float eps) {
    norm_group(out, x, w, dt, d, eps);  // calls pdl_enter
}
