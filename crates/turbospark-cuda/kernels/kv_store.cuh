// The KV store's element type, shared by the kernels that write the store
// (rope_kv.cu, attention.cu's decode step) and those that read it
// (attention.cu, flash_attention.cu): each is instantiated for an f32 store
// (`float`) and a bf16 one (`u16`, the bits; src/attention.rs picks by
// `KvDtype`). A bf16 store rounds each value once, when it is stored (round
// to nearest even, as the CPU's `half::bf16::from_f32`); reads widen it
// exactly, so attention's arithmetic is f32 over the rounded values either
// way. Rows are addressed in elements of the store's type; a 16-byte chunk
// holds KV_VEC<S> of them.

template <typename S>
struct KvVec;
template <>
struct KvVec<float> {
    static constexpr u32 n = 4;
};
template <>
struct KvVec<u16> {
    static constexpr u32 n = 8;
};
// Values of a 16-byte chunk of a store of S.
#define KV_VEC(S) (KvVec<S>::n)

__device__ __forceinline__ float kv_get(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float kv_get(const u16* p, u64 i) { return bf16_to_f32(p[i]); }

__device__ __forceinline__ void kv_put(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void kv_put(u16* p, u64 i, float v) { p[i] = f32_to_bf16(v); }

// Value i of a 16-byte chunk (i < KV_VEC(S)), widened.
__device__ __forceinline__ float chunk_value(const uint4& c, u32 i, const float*) {
    const u32 w = i == 0 ? c.x : i == 1 ? c.y : i == 2 ? c.z : c.w;
    return __uint_as_float(w);
}
__device__ __forceinline__ float chunk_value(const uint4& c, u32 i, const u16*) {
    const u32 w = (i >> 1) == 0 ? c.x : (i >> 1) == 1 ? c.y : (i >> 1) == 2 ? c.z : c.w;
    // The lower-addressed bf16 is the lower half of its word.
    return __uint_as_float((i & 1u) ? (w & 0xffff0000u) : (w << 16));
}

// d += the chunk's values times q's (KV_VEC(S) / 4 float4s at `q`), value
// i into component i % 4: four short chains of multiply-adds.
template <typename S>
__device__ __forceinline__ void dot_chunk(const uint4& c, const float4* q, float4& d) {
#pragma unroll
    for (u32 j = 0; j < KV_VEC(S) / 4; j++) {
        const float4 qv = q[j];
        d.x += qv.x * chunk_value(c, 4 * j, (const S*)nullptr);
        d.y += qv.y * chunk_value(c, 4 * j + 1, (const S*)nullptr);
        d.z += qv.z * chunk_value(c, 4 * j + 2, (const S*)nullptr);
        d.w += qv.w * chunk_value(c, 4 * j + 3, (const S*)nullptr);
    }
}

// The J consecutive values at `p` widened into v, in one vector load where
// J values are 4, 8 or 16 bytes (p aligned to that).
template <int J>
__device__ __forceinline__ void load_j(const float* p, float* v) {
    if (J % 4 == 0) {
#pragma unroll
        for (int i = 0; i < J / 4; i++) {
            const float4 f = ((const float4*)p)[i];
            v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
        }
    } else if (J == 2) {
        const float2 f = *(const float2*)p;
        v[0] = f.x; v[1] = f.y;
    } else {
#pragma unroll
        for (int i = 0; i < J; i++) v[i] = p[i];
    }
}
template <int J>
__device__ __forceinline__ void load_j(const u16* p, float* v) {
    if (J % 8 == 0) {
#pragma unroll
        for (int i = 0; i < J / 8; i++) {
            const uint4 c = ((const uint4*)p)[i];
#pragma unroll
            for (u32 e = 0; e < 8; e++) v[8 * i + e] = chunk_value(c, e, p);
        }
    } else if (J % 2 == 0) {
        // 4 (J = 2) or 8 (J = 4) bytes.
#pragma unroll
        for (int i = 0; i < J / 2; i++) {
            const u32 w = ((const u32*)p)[i];
            v[2 * i] = __uint_as_float(w << 16);
            v[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < J; i++) v[i] = bf16_to_f32(p[i]);
    }
}

// Values p[0] and p[1] as packed bf16 (p[0] in the lower half), as the
// tensor cores take them: a bf16 store's bits as they are (RNE of a bf16
// value is itself), an f32 store's rounded (`aligned`: p is 8-byte aligned
// for f32, 4-byte for bf16: one load).
__device__ __forceinline__ u32 kv_bf16_pair(const float* p, bool aligned) {
    if (aligned) {
        const float2 f = *(const float2*)p;
        return (u32)f32_to_bf16(f.x) | ((u32)f32_to_bf16(f.y) << 16);
    }
    return (u32)f32_to_bf16(p[0]) | ((u32)f32_to_bf16(p[1]) << 16);
}
__device__ __forceinline__ u32 kv_bf16_pair(const u16* p, bool aligned) {
    if (aligned) return *(const u32*)p;
    return (u32)p[0] | ((u32)p[1] << 16);
}

// Copies of the store's rows into shared memory that bypass the registers
// (cp.async, sm_80+; 16-byte chunks through L2 only): the readers stage
// tiles with them. A group of copies is committed, then waited for; a
// thread sees its own copies after the wait, the block's after a barrier.
// (The CPU emulation, TS_EMULATED, defines its own: tests/emulate.)
#ifndef TS_EMULATED
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem)), "l"(gmem));
}

// 16 bytes from gmem, or 16 zero bytes (nothing is read) when !copy.
__device__ __forceinline__ void cp_async16_or_zero(void* smem, const void* gmem, bool copy) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(smem)),
                 "l"(gmem), "r"(copy ? 16u : 0u));
}

__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(smem)), "l"(gmem));
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}
#endif
