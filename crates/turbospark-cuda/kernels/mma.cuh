// Tensor-core helpers shared by the attention kernels that use mma.sync
// m16n8k16 with bf16 operands and f32 accumulators: flash_attention.cu
// (prefill) and attention.cu's tensor-core decode form. The fragment
// layouts are written out at the top of flash_attention.cu. Put in front of
// both files (src/compile.rs), after common.cuh. Helpers only: no kernel.

// Two f32 as packed bf16 (round to nearest even), `lo` in the lower half.
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

// The two PTX wrappers, fa_mma and fa_ldsm_x4_trans, are left out under
// TS_EMULATED: tests/emulate/cuda_shim.h defines both itself, from the
// same fragment layouts, to run these kernels on a CPU.
#ifndef TS_EMULATED
// c += a · b for one m16n8k16 tile (bf16 operands, f32 accumulator).
__device__ __forceinline__ void fa_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                       u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

// Over the 4 lanes of a quad (the lanes holding one row).
__device__ __forceinline__ float fa_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float fa_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#ifndef TS_EMULATED
// Four 8 × 8 bf16 matrices out of shared memory, transposed: lanes 8m ..
// 8m + 7 give the row addresses of matrix m (16-byte aligned), and lane l
// gets, of matrix m, rows 2(l % 4), 2(l % 4) + 1 of column l / 4 in
// register m (the lower row in the lower half): a B fragment of
// mma.m16n8k16 from a row-major [k][n] tile.
__device__ __forceinline__ void fa_ldsm_x4_trans(const u16* p, u32* b) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(smem_u32(p)));
}
#endif

// S = Q·Kᵀ for a tile of TILE keys: s[j] holds n-tile j (keys 8j ..
// 8j + 7) in the C layout, from Q's A fragments qf[kk] (dims 16kk ..
// 16kk + 15) and a row-major K tile of [TILE][HD + 8] bf16, whose b0 is
// the pair of dims 16kk + 2t, + 1 of key 8j + g (adjacent in the row) and
// b1 the pair 8 dims on. The padding of 8 bf16 a row keeps the reads
// conflict-free (flash_attention.cu's header).
template <int HD, int TILE>
__device__ __forceinline__ void fa_scores_qk(float (&s)[TILE / 8][4], const u32 (&qf)[HD / 16][4],
                                             const u16* ks) {
    constexpr int KS = HD + 8;
    const u32 lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
#pragma unroll
    for (int j = 0; j < TILE / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
        for (int j = 0; j < TILE / 8; j++) {
            const u32* kr = (const u32*)&ks[(8 * j + g) * KS + 16 * kk + 2 * t];
            fa_mma(s[j], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], kr[0], kr[4]);
        }
    }
}
