// Token choice on the device, so greedy decoding copies one id per row to
// the host instead of the whole logits row (201,088 floats for gpt-oss).
//
// argmax_rows: the index of the first maximum of each row, NaN never wins,
// a row with no non-NaN value gives 0 — the host `argmax` exactly
// (crates/turbospark-backend/src/lib.rs). Each (value, index) becomes one
// 64-bit key, the value's bits made order-preserving in the high half and
// 0xffffffff − index in the low half, so the largest key is the largest
// value at its lowest index; many blocks per row reduce theirs with one
// atomicMax each. Key 0 (no block saw a number) means "none".

// Unsigned order of the key = float order of v (v not NaN; −0 counts as +0,
// as `>` does on the host).
__device__ __forceinline__ u32 order_bits(float v) {
    const u32 b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// best[row] must be 0 before the launch. Grid (rows, blocks per row).
extern "C" __global__ void argmax_rows(unsigned long long* best, const float* x, u32 cols) {
    pdl_enter();
    const float* row = x + (u64)blockIdx.x * cols;
    unsigned long long key = 0;
    for (u32 c = blockIdx.y * blockDim.x + threadIdx.x; c < cols; c += gridDim.y * blockDim.x) {
        const float v = row[c];
        if (v != v) continue;  // NaN
        const unsigned long long k = ((unsigned long long)order_bits(v) << 32) | (0xffffffffu - c);
        key = k > key ? k : key;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, key, o);
        key = other > key ? other : key;
    }
    if ((threadIdx.x & 31u) == 0 && key != 0) atomicMax(best + blockIdx.x, key);
}
