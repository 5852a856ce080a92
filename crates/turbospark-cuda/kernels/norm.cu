// RMSNorm over groups of `d` values (a whole row, or one head of it).
// transformers' order in f32: r = 1 / sqrt(mean(x²) + eps), out = w · (x · r).
// One block per group; the sum of squares is a block tree reduction (the CPU
// sums sequentially, so results differ by rounding only).

extern "C" __global__ void rms_norm(float* out, const float* x, const void* w, int dt, u32 d,
                                    float eps) {
    const u64 base = (u64)blockIdx.x * d;
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        float v = x[base + i];
        ss += v * v;
    }
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        out[base + i] = load_w(w, dt, i) * (x[base + i] * r);
    }
}
