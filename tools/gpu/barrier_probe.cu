// barrier_probe.py's kernels: what a decode step pays to separate two
// dependent phases of work, as a kernel boundary (the engine's way: one
// launch an operation, programmatic dependent launch between them) or as a
// grid-wide barrier inside one persistent kernel (the way a single decode
// kernel would). A phase: every block reads one value another block wrote
// in the phase before (a true dependency), reads its share of `bytes`
// bytes of a weight buffer (16-byte loads, 4 in flight a thread), and
// writes one value.

// Block b's share of phase p's bytes: window p % windows of the buffer, so
// that consecutive phases do not find their bytes in L2.
__device__ __forceinline__ float phase_work(const uint4* w, u64 bytes, u32 p, u32 windows) {
    const u64 n = bytes / 16, base = (u64)(p % windows) * n;
    const u64 per = (n + gridDim.x - 1) / gridDim.x;
    const u64 lo = min(n, per * blockIdx.x), hi = min(n, lo + per);
    u32 s = 0;
    u64 i = lo + threadIdx.x;
    for (; i + 3 * blockDim.x < hi; i += 4 * blockDim.x) {
        uint4 a = ld_stream(w + base + i), b = ld_stream(w + base + i + blockDim.x);
        uint4 c = ld_stream(w + base + i + 2 * blockDim.x), d = ld_stream(w + base + i + 3 * blockDim.x);
        s ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < hi; i += blockDim.x) s ^= ld_stream(w + base + i).x;
    return (float)(s & 1u);
}

// The previous phase's value from the next block, and this phase's write.
__device__ __forceinline__ float dependency(const float* buf, u32 p) {
    return p ? buf[(u64)(p - 1) * gridDim.x + (blockIdx.x + 1) % gridDim.x] : 0.0f;
}

// Asks L2 for the first lines (4 of 128 bytes a thread) of the block's share
// of phase p's bytes.
__device__ __forceinline__ void prefetch_share(const uint4* w, u64 bytes, u32 p, u32 windows) {
    const u64 n = bytes / 16, base = (u64)(p % windows) * n;
    const u64 per = (n + gridDim.x - 1) / gridDim.x, lo = min(n, per * blockIdx.x);
    const u64 hi = min(min(n, lo + per), lo + 32 * (u64)blockDim.x);
    for (u64 i = lo + 8 * threadIdx.x; i < hi; i += 8 * blockDim.x) prefetch_l2(w + base + i);
}

// One phase a launch (launched with or without the PDL attribute; with
// `prefetch`, the first lines of its share asked of L2 before waiting for
// the launch before, as the engine's GEMVs do).
extern "C" __global__ void phase_kernel(float* buf, u32 p, const uint4* w, u64 bytes,
                                        u32 windows, u32 prefetch) {
    if (prefetch) prefetch_share(w, bytes, p, windows);
    pdl_enter();
    const float v = dependency(buf, p);
    const float s = phase_work(w, bytes, p, windows);
    __shared__ float red;
    if (threadIdx.x == 0) red = 0.0f;
    __syncthreads();
    if (s != 0.0f) atomicAdd(&red, s);
    __syncthreads();
    if (threadIdx.x == 0) buf[(u64)p * gridDim.x + blockIdx.x] = v + red;
}

// All blocks (every one resident: a cooperative launch) meet: bar[0]
// counts arrivals, bar[1] is the generation the last arrival advances.
__device__ __forceinline__ void grid_barrier(u32* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile u32* gen = bar + 1;
        const u32 g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            bar[0] = 0;
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*gen == g) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// `phases` phases in one launch, a grid barrier between them; with
// `prefetch`, each block asks L2 for the first lines of its next phase's
// share before the barrier (weights do not depend on the phase before).
extern "C" __global__ void phases_kernel(float* buf, u32 phases, const uint4* w, u64 bytes,
                                         u32 windows, u32* bar, u32 prefetch) {
    __shared__ float red;
    for (u32 p = 0; p < phases; p++) {
        const float v = dependency(buf, p);
        const float s = phase_work(w, bytes, p, windows);
        if (threadIdx.x == 0) red = 0.0f;
        __syncthreads();
        if (s != 0.0f) atomicAdd(&red, s);
        __syncthreads();
        if (threadIdx.x == 0) buf[(u64)p * gridDim.x + blockIdx.x] = v + red;
        if (prefetch && p + 1 < phases) prefetch_share(w, bytes, p + 1, windows);
        grid_barrier(bar);
    }
}
