// Token choice on the device, so greedy decoding copies one id per row to
// the host instead of the whole logits row (201,088 floats for gpt-oss).
//
// argmax_rows: the index of the first maximum of each row, NaN never wins,
// a row with no non-NaN value gives 0 — the host `argmax` exactly
// (crates/turbospark-backend/src/lib.rs). One block per row; each thread
// scans a strided subset, then the block reduces (value, index) pairs with
// "greater value, or equal value and lower index", which is order-free and
// so gives the first maximum whatever the reduction order.

// Whether (v, i) beats (bv, bi); bi = 0xffffffff means "none yet".
__device__ __forceinline__ bool argmax_better(float v, u32 i, float bv, u32 bi) {
    if (v != v) return false;  // NaN
    if (bi == 0xffffffffu) return true;
    return v > bv || (v == bv && i < bi);
}

#define ARGMAX_THREADS 1024

extern "C" __global__ void argmax_rows(u32* out, const float* x, u32 cols) {
    const float* row = x + (u64)blockIdx.x * cols;
    float bv = 0.0f;
    u32 bi = 0xffffffffu;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = row[c];
        if (argmax_better(v, c, bv, bi)) {
            bv = v;
            bi = c;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ u32 si[ARGMAX_THREADS / 32];
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (u32 w = 1; w < (blockDim.x >> 5); w++) {
            if (argmax_better(sv[w], si[w], bv, bi)) {
                bv = sv[w];
                bi = si[w];
            }
        }
        out[blockIdx.x] = bi == 0xffffffffu ? 0u : bi;
    }
}
