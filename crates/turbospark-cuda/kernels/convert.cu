// Operand preparation for the cuBLAS (prefill) path of `linear` and of the
// grouped MoE experts: cuBLAS multiplies bf16 by bf16 (f32 accumulation),
// so f32 activations are rounded once to bf16, and weights it cannot read
// directly are converted into scratch copies: MXFP4 (exactly) and int8 /
// int4 (code · scale in f32, then rounded) to bf16; f16 to f32 for an f32
// GEMM (rounding f16 weights to bf16 would drop 3 of their significand bits).
//
// The weight kernels take the address of the first converted row, so a
// slice of rows (one expert of a stacked weight) converts the same way.

// 8 f32 values -> 8 bf16 (round to nearest even) as one 16-byte store.
__device__ __forceinline__ void store8_bf16(u16* out, const float* v) {
    uint4 u;
    u.x = (u32)f32_to_bf16(v[0]) | ((u32)f32_to_bf16(v[1]) << 16);
    u.y = (u32)f32_to_bf16(v[2]) | ((u32)f32_to_bf16(v[3]) << 16);
    u.z = (u32)f32_to_bf16(v[4]) | ((u32)f32_to_bf16(v[5]) << 16);
    u.w = (u32)f32_to_bf16(v[6]) | ((u32)f32_to_bf16(v[7]) << 16);
    *(uint4*)out = u;
}

// x (f32) -> bf16, round to nearest even: the activation operand of a bf16
// GEMM. Four values per step (16-byte load, 8-byte store) while whole
// quadruples remain, then one at a time; `x` and `out` are allocation starts.
extern "C" __global__ void to_bf16(u16* out, const float* x, u64 n) {
    pdl_enter();
    FOR_EACH(q, (n + 3) / 4) {
        const u64 i = q * 4;
        if (i + 4 <= n) {
            const float4 v = *(const float4*)(x + i);
            uint2 u;
            u.x = (u32)f32_to_bf16(v.x) | ((u32)f32_to_bf16(v.y) << 16);
            u.y = (u32)f32_to_bf16(v.z) | ((u32)f32_to_bf16(v.w) << 16);
            *(uint2*)(out + i) = u;
        } else {
            for (u64 j = i; j < n; j++) out[j] = f32_to_bf16(x[j]);
        }
    }
}

// x -> bf16 hi + lo with hi + lo = x to 16 significand bits (the
// f32-precision mode's two GEMMs).
extern "C" __global__ void split_bf16(u16* hi, u16* lo, const float* x, u64 n) {
    pdl_enter();
    FOR_EACH(i, n) {
        const float v = x[i];
        const u16 h = f32_to_bf16(v);
        hi[i] = h;
        lo[i] = f32_to_bf16(v - bf16_to_f32(h));
    }
}

// f16 (or any dense) weights -> f32 for an f32 GEMM.
extern "C" __global__ void widen_f32(float* out, const void* w, int dt, u64 n) {
    pdl_enter();
    FOR_EACH(i, n) out[i] = load_w(w, dt, i);
}

// The weight dequantisers of the GEMM path (src/gemm.rs: a bf16 copy of
// the rows a prefill GEMM multiplies). One thread per 8 values, a 16-byte
// store: consecutive threads write consecutive 16 bytes and read
// consecutive codes (4 bytes, int8 8), so every warp access is contiguous.
// (One thread per 32-value group wrote 4 × 16 bytes at a 64-byte stride:
// ~1.7 TB/s on the H200, gpt-oss-20b's prefill spent a third of its kernel
// time here.) Chunk c is values 8(c % 4) .. 8(c % 4) + 7 of group c / 4.

// MXFP4 -> bf16, exactly: an E2M1 value has 2 significant bits and the scale
// is a power of two, so every decoded value is a bf16 (for scales from 2^−127
// to 2^127; the checkpoint's 255, inf, converts to ±inf and NaN as in f32).
// A group is 16 bytes of codes, low nibble first: chunk c's are the 4
// bytes of word c.
extern "C" __global__ void mxfp4_to_bf16(u16* out, const u8* blocks, const u8* scales,
                                         u64 groups) {
    pdl_enter();
    FOR_EACH(c, groups * 4) {
        const u32 q = ((const u32*)blocks)[c];
        const float s = e8m0(scales[c >> 2]);
        float v[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 byte = (q >> (8 * j)) & 0xffu;
            v[2 * j] = e2m1(byte & 15u) * s;
            v[2 * j + 1] = e2m1(byte >> 4) * s;
        }
        store8_bf16(out + c * 8, v);
    }
}

// Int8 / int4 (kind 0 / 1) -> bf16: code · scale in f32 (the CPU's
// dequantised value), then rounded to nearest even. A group is 32 bytes of
// codes (int8: chunk c's are the 8 bytes of doubleword c) or 16 (int4, low
// nibble first, value + 8: the 4 bytes of word c); group g's scale is
// scale g >> shift.
extern "C" __global__ void dequant_bf16(u16* out, const u8* codes, const u16* scales,
                                        u64 groups, int kind, u32 shift) {
    pdl_enter();
    FOR_EACH(c, groups * 4) {
        const float s = f16_to_f32(scales[(c >> 2) >> shift]);  // f16 scales, widened exactly
        float v[8];
        if (kind == 0) {
            const uint2 u = ((const uint2*)codes)[c];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const u32 byte = ((j < 4 ? u.x : u.y) >> (8 * (j & 3))) & 0xffu;
                v[j] = (float)(signed char)byte * s;
            }
        } else {
            const u32 q = ((const u32*)codes)[c];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 byte = (q >> (8 * j)) & 0xffu;
                v[2 * j] = (float)((int)(byte & 15u) - 8) * s;
                v[2 * j + 1] = (float)((int)(byte >> 4) - 8) * s;
            }
        }
        store8_bf16(out + c * 8, v);
    }
}
