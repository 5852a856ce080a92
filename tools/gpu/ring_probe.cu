// Probes for tools/gpu/ring_probe.py (not a product kernel; compiled after
// kernels/common.cuh, gemv_common.cuh, async_copy.cuh and stream.cuh, whose ring machinery
// it drives exactly as the streamed GEMVs do).
//
// Question: how fast does one block an SM move bytes through a ring of
// bulk copies, as a function of stage size, copies a stage, the lanes that
// issue them, ring depth and consumer work? The streamed GEMVs' per-launch
// times on the H200 follow their stage count (about 1.4 µs a stage for
// int8 and int4 alike, 18 to 34 KB a stage), not their bytes
// (BENCHMARKS.md, thirteenth session); this measures the ring alone.

// Each block streams its own `per_block` bytes of `src` through `stages`
// stages of `stage_bytes`, each stage as `copies` equal bulk copies, issued
// (`issue`) 0: by lane 0 alone, one after another, the other lanes gone
// (gemv_q8_stream); 1: all lanes walking the copies, copy c issued by lane
// c % 32 in an instruction of its own (the pieces experiment); 2: copy c
// by lane c, all in one instruction (gemv_bf16_stream; copies <= 32). Consumers
// either release a stage at once (`consume` 0) or first read all of it
// with 16-byte shared loads (`consume` 1, a sum kept live via `sink`).
extern "C" __global__ void __launch_bounds__(GS_THREADS, 1)
    ring_probe(const u8* src, u64 per_block, u32 stage_bytes, u32 copies, u32 stages, u32 issue,
               u32 consume, float* sink) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ uint4 ring4[];
    __shared__ u64 full[GS_MAX_STAGES], empty[GS_MAX_STAGES];
    u8* ring = (u8*)ring4;
    ring_init(full, empty, stages);
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const u8* base = src + blockIdx.x * per_block;
    const u32 tiles = (u32)(per_block / stage_bytes), piece = stage_bytes / copies;
    if (warp == GS_WARPS) {
        if (issue == 0 && lane != 0) return;
        for (u32 t = 0; t < tiles; t++) {
            const u32 slot = t % stages;
            if (t >= stages) mbar_wait(&empty[slot], (t / stages - 1) & 1u);
            if (lane == 0) mbar_expect(&full[slot], stage_bytes);
            u8* dst = ring + slot * stage_bytes;
            const u8* from = base + (u64)t * stage_bytes;
            if (issue == 0) {
                for (u32 c = 0; c < copies; c++) {
                    bulk_copy(dst + c * piece, from + c * piece, piece, &full[slot]);
                }
                continue;
            }
            __syncwarp();  // the expected bytes before any copy completes
            if (issue == 2) {
                if (lane < copies) {
                    bulk_copy(dst + lane * piece, from + lane * piece, piece, &full[slot]);
                }
                continue;
            }
            for (u32 c = 0; c < copies; c++) {
                if (c % 32u == lane) bulk_copy(dst + c * piece, from + c * piece, piece, &full[slot]);
            }
        }
        return;
    }
    float acc = 0.0f;
    for (u32 t = 0; t < tiles; t++) {
        const u32 slot = t % stages;
        mbar_wait(&full[slot], (t / stages) & 1u);
        if (consume) {
            const uint4* s = (const uint4*)(ring + slot * stage_bytes);
            for (u32 i = threadIdx.x; i < stage_bytes / 16; i += GS_WARPS * 32) {
                const uint4 v = s[i];
                acc += __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x3fffffffu);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
    }
    if (acc == 1.2345f) sink[0] = acc;  // never true; keeps the reads
#endif
}

// The register path for comparison: `warps` warps a block, each thread
// keeping `depth` 16-byte loads in flight, over the block's `per_block`
// bytes.
extern "C" __global__ void __launch_bounds__(1024, 1)
    load_probe(const uint4* src, u64 per_block, u32 depth, float* sink) {
    const uint4* base = src + blockIdx.x * (per_block / 16);
    const u32 n = (u32)(per_block / 16), stride = blockDim.x;
    float acc = 0.0f;
    for (u32 i = threadIdx.x; i < n; i += stride * depth) {
        uint4 v[8];
#pragma unroll
        for (u32 j = 0; j < 8; j++) {
            if (j < depth && i + j * stride < n) v[j] = ld_stream(base + i + j * stride);
        }
#pragma unroll
        for (u32 j = 0; j < 8; j++) {
            if (j < depth && i + j * stride < n) {
                acc += __uint_as_float((v[j].x ^ v[j].y ^ v[j].z ^ v[j].w) & 0x3fffffffu);
            }
        }
    }
    if (acc == 1.2345f) sink[0] = acc;
}
