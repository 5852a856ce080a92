// Operand preparation for the cuBLAS (prefill) path of `linear`: weights
// that cuBLAS cannot read (f16 with f32 activations, MXFP4, int8, int4) are
// widened into scratch copies, and activations are split for bf16 weights.
//
// bf16 weights: cuBLAS multiplies bf16 by bf16 only, so the f32 activations
// are split as x = hi + lo with hi = bf16(x) and lo = bf16(x − hi), and two
// GEMMs with f32 accumulation sum W·hi + W·lo. The split keeps 16 of f32's
// 24 significand bits (the residual is ≤ 2^−17 |x|), so the result is within
// f32-level error of the CPU's f32 arithmetic on the same bf16 weights, at
// twice the cost of a plain bf16 GEMM.

extern "C" __global__ void split_bf16(u16* hi, u16* lo, const float* x, u64 n) {
    FOR_EACH(i, n) {
        const float v = x[i];
        const u16 h = f32_to_bf16(v);
        hi[i] = h;
        lo[i] = f32_to_bf16(v - bf16_to_f32(h));
    }
}

// f16 (or any dense) weights -> f32 for an f32 GEMM (f16 cannot share the
// bf16 split: activations overflow f16's range).
extern "C" __global__ void widen_f32(float* out, const void* w, int dt, u64 n) {
    FOR_EACH(i, n) out[i] = load_w(w, dt, i);
}

// MXFP4 -> bf16, exactly: an E2M1 value has 2 significant bits and the scale
// is a power of two, so every decoded value is a bf16.
extern "C" __global__ void mxfp4_to_bf16(u16* out, const u8* blocks, const u8* scales, u64 n) {
    FOR_EACH(i, n) {
        const u64 g = i / 32;
        const u32 j = (u32)(i % 32);
        const u32 b = blocks[g * 16 + j / 2];
        const u32 code = (j & 1u) ? (b >> 4) : (b & 15u);
        out[i] = f32_to_bf16(e2m1(code) * e8m0(scales[g]));
    }
}

// Int8 / int4 (kind 0 / 1) groups of 32 -> f32, code · scale in f32 as the
// CPU's dequantisation, for an f32 GEMM (code · scale is not a bf16).
extern "C" __global__ void dequant_f32(float* out, const u8* codes, const float* scales, u64 n,
                                       int kind) {
    FOR_EACH(i, n) {
        float c;
        if (kind == 0) {
            c = (float)(signed char)codes[i];
        } else {
            const u32 b = codes[i / 2];
            c = (float)((int)((i & 1) ? (b >> 4) : (b & 15u)) - 8);
        }
        out[i] = c * scales[i / 32];
    }
}
