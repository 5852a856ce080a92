// The streamed GEMVs' machinery (gemv_dense.cu's `gemv_*_stream`,
// gemv_grouped_stream.cu): GS_WARPS consumer warps and one producer warp a
// block, a ring of shared-memory stages that the producer fills with bulk
// asynchronous copies (cp.async.bulk, completing on an mbarrier), and the
// barriers through which consumers release stages. Helpers only: no kernel
// here. Put in front of both files after async_copy.cuh (src/compile.rs).
#define GS_WARPS 8
#define GS_THREADS (32 * (GS_WARPS + 1))
#define GS_MAX_STAGES 16

#if __CUDA_ARCH__ >= 900
// The consumer warps' barrier (the producer does not take part).
__device__ __forceinline__ void consumers_sync() {
    named_barrier(1, GS_WARPS * 32);
}

// The virtual rows [v0, v0 + n) that streamed block blockIdx.y takes: the
// launch's rows (every segment's) split evenly over the blocks along y, in
// whole gate/up pairs for a glu launch (`pairs`).
__device__ __forceinline__ void stream_rows(const GemvSegs& sg, bool pairs, u32& v0, u32& n) {
    u32 rows = 0;
#pragma unroll
    for (u32 i = 0; i < GEMV_MAX_SEGS; i++) {
        if (i < sg.count) rows += pick(sg.m, i);
    }
    const u32 unit = pairs ? 2 : 1, units = rows / unit;
    v0 = (u32)((u64)blockIdx.y * units / gridDim.y) * unit;
    n = (u32)((u64)(blockIdx.y + 1) * units / gridDim.y) * unit - v0;
}

// Thread 0 initialises the ring's barriers (`full`: the producer's arrival
// with the stage's bytes; `empty`: every consumer warp's release) and
// fences them for the copy engine; the whole block then meets.
__device__ __forceinline__ void ring_init(u64* full, u64* empty, u32 stages) {
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], GS_WARPS);
        }
        mbar_fence_init();
    }
    __syncthreads();
}

// Each of the block's rows [v0, v0 + n) stored as gemv_store does (the norm
// factor rf, bias, residual add, or for a glu launch the activation of each
// gate/up pair), its product `row_sum(v)` for block row v; every consumer
// thread takes part.
template <class Sum>
__device__ __forceinline__ void stream_store(const GemvSegs& sg, bool pairs, u32 v0, u32 n,
                                             float rf, int bias_dt, Sum row_sum) {
    const u32 unit = pairs ? 2 : 1;  // rows a store (gate/up pairs)
    for (u32 v = threadIdx.x * unit; v < n; v += GS_WARPS * 32 * unit) {
        u32 seg = 0, r = 0;
        seg_of(sg, v0 + v, 1, seg, r);
        if (pairs) {
            // Gate row r (segment 0) and up row r (segment 1).
            const float gv = out_value(row_sum(v), rf, sg.bias[0], bias_dt, r);
            const float uv = out_value(row_sum(v + 1), rf, sg.bias[1], bias_dt, r);
            sg.out[0][r] = glu_value(sg, gv, uv);
        } else {
            store_out(&pick(sg.out, seg)[r], row_sum(v), rf, pick(sg.bias, seg), bias_dt, r,
                      sg.accumulate != 0);
        }
    }
}
#endif  // __CUDA_ARCH__ >= 900
