// Shared by every kernel family: prepended to each .cu file before NVRTC
// compiles it (NVRTC gets no include path, so no CUDA headers are used).
//
// Numerics: weights are widened to f32 exactly (bf16 is the top half of an
// f32; f16 goes through the hardware cvt); all arithmetic is f32.

// Guarded: the CPU emulation's driver (tests/emulate/driver) includes it
// from cuda_shim.h ahead of the source that src/compile.rs prepends it to.
#ifndef TS_COMMON_CUH
#define TS_COMMON_CUH

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define NEG_INF __int_as_float(0xff800000)

// Dense weight dtype codes; must match `Dense::code` in src/weight.rs.
#define DT_F32 0
#define DT_BF16 1
#define DT_F16 2

__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// The leaves below, down to DYNAMIC_SHARED, are PTX or syntax only CUDA
// has (`extern __shared__`). The CPU emulation of these sources
// (tests/emulate/cuda_shim.h, TS_EMULATED) defines its own in their place.
#ifndef TS_EMULATED
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even (sm_80+).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// A 16-byte load of data read once per pass (weights): through the
// read-only path and not kept in L1, so activations stay there.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

__device__ __forceinline__ u32 ld_stream_u32(const void* p) {
    u32 r;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ uint2 ld_stream_u64(const void* p) {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

// Asks L2 for the line holding `p` (no register waits for it): weights a
// kernel will read as soon as the previous kernel ends (pdl_enter).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Named barrier `id` (1-15; 0 is __syncthreads') of `threads` threads, a
// multiple of 32: the warps that take part meet; the block's others go on.
__device__ __forceinline__ void named_barrier(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The launch's dynamic shared memory (its shared_mem_bytes) as `T name[]`.
#define DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

// The shared-memory address of `p` (a pointer into shared memory), as the
// asynchronous-copy and mbarrier instructions take it.
__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// Element `i` of a dense weight of dtype `dt`, as f32 (small vectors: norm
// weights, biases, sinks, embedding rows).
__device__ __forceinline__ float load_w(const void* w, int dt, u64 i) {
    switch (dt) {
        case DT_BF16: return bf16_to_f32(((const u16*)w)[i]);
        case DT_F16: return f16_to_f32(((const u16*)w)[i]);
        default: return ((const float*)w)[i];
    }
}

// E2M1 code (sign in bit 3) -> its value {0, .5, 1, 1.5, 2, 3, 4, 6}, built
// from the bits: exponent field e = bits 1-2, mantissa m = bit 0; e = 0 is
// the subnormal 0.5·m, otherwise (1 + m/2)·2^(e−1). Exact.
__device__ __forceinline__ float e2m1(u32 c) {
    u32 e = (c >> 1) & 3u, m = c & 1u;
    u32 bits = e ? (((e + 126u) << 23) | (m << 22)) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | ((c & 8u) << 28));
}

// E8M0 scale byte -> 2^(s − 127) exactly (0 is the subnormal 2^−127, 255 is
// inf), as the CPU backend and torch.ldexp.
__device__ __forceinline__ float e8m0(u32 s) {
    return s == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(s << 23);
}

// Programmatic dependent launch (sm_90 and later; src/kernels.rs launches
// every kernel allowing it): a kernel may be launched while the one before
// it on the stream is still running, so its blocks are resident and ready
// when that one ends instead of only then being launched. Every kernel
// calls this first: it waits until the previous kernel has finished and
// its writes are visible (before any read or write of activations), then
// lets the next kernel launch. Waiting before triggering keeps at most two
// kernels overlapping. Without the launch attribute both are no-ops.
//
// Under TS_TRACE (src/trace.rs defines it where TURBOSPARK_CUDA_TRACE asks
// for a timeline; a measuring build, never the default) each block's first
// thread also notes when it reached the wait and when the wait returned,
// and, where a kernel says TS_PHASE(k), when it got there.
#ifdef TS_TRACE
// The timeline buffer (the host sets it in every module): [0] entries
// taken, [1] capacity, then a ring of that many entries of 4 words: the
// launch's %gridid, the two %globaltimer readings (ns), and smid << 48 |
// blockDim.x << 32 | the block's index. A phase's entry has, for the
// second reading, the phase number (below 2^16) and, above it, how long
// the note itself held the thread (below 2^16 ns): below 2^32, which a
// reading never is.
__device__ u64* ts_trace;

__device__ __forceinline__ u64 ts_clock() {
    u64 t;
    // "memory": not moved across the stores before it (ts_phase reads the
    // clock again once its entry's slot has come back).
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}

// A fresh entry of the ring with its launch, SM and block filled in (the
// caller writes words 1 and 2). Its slot is an atomic whose result the
// first store waits for: a round trip to L2 (~0.7 µs under a GEMV's load)
// on the noting thread's path.
__device__ __forceinline__ u64* ts_entry() {
    // A ring: the newest entries win (a step's replays come last).
    const u64 i = atomicAdd(ts_trace, 1ull) % ts_trace[1];
    u64 grid;
    u32 sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    u64* e = ts_trace + 2 + 4 * i;
    e[0] = grid;
    e[3] = (u64)sm << 48 | (u64)blockDim.x << 32 |
           (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    return e;
}

__device__ __forceinline__ bool ts_noting() {
    return (threadIdx.x | threadIdx.y | threadIdx.z) == 0 && ts_trace != nullptr;
}

__device__ __forceinline__ void ts_mark(u64 reached) {
    if (!ts_noting()) return;
    const u64 returned = ts_clock();
    u64* e = ts_entry();
    e[1] = reached;
    e[2] = returned;
}

// A point inside a kernel (phase k, 1 .. 65535) as the block's first thread
// passes it: where a launch's time goes after its wait (timeline.py's
// phases). Only the first thread notes, so a phase after a barrier is the
// block's, one before it warp 0's. The entry keeps how long the note held
// the thread (its slot's round trip), which timeline.py takes off the
// block's later phases: every note but the wait's own says how long it took.
__device__ __forceinline__ void ts_phase(u32 k) {
    if (!ts_noting()) return;
    const u64 at = ts_clock();
    u64* e = ts_entry();
    e[1] = at;
    const u64 held = ts_clock() - at;
    e[2] = (held < 0xffff ? held : 0xffff) << 16 | k;
}

#define TS_PHASE(k) ts_phase(k)
// The block's end: phase k once every warp of the block has passed it
// (a barrier only a traced build has). Phases before it are warp 0's:
// the gap says how far the block's other warps run behind warp 0.
#define TS_BLOCK_END(k) (__syncthreads(), ts_phase(k))
#else
#define TS_PHASE(k) ((void)0)
#define TS_BLOCK_END(k) ((void)0)
#endif

// Programmatic dependent launch: waits for the previous kernel to finish
// (its writes visible), then lets the next kernel's blocks launch (they
// run up to their own wait beside this kernel's, where the SM has room).
// Waiting first means a kernel's dependents start only once it has
// waited, so nothing runs ahead of the kernel before it: the MoE down's
// early read of its experts and moe_norm_route's one ticket rely on that.
// `release_first` lets them launch before the wait instead (the same for
// every thread), for a kernel whose dependent reads nothing but weights
// before its own wait (attn_combine: see there).
__device__ __forceinline__ void pdl_enter(bool release_first = false) {
#ifdef TS_TRACE
    const u64 reached = ts_clock();
#endif
#if __CUDA_ARCH__ >= 900
    if (release_first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef TS_TRACE
    ts_mark(reached);
#endif
#if __CUDA_ARCH__ >= 900
    if (!release_first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Largest value over the warp; every lane gets it (fmaxf: NaN is dropped).
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // `part` may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    return warp_sum(lane < (blockDim.x >> 5) ? part[lane] : 0.0f);
}

// The dense MLP's gate activations (elementwise.cu's glu, and the GEMVs
// that write the activation: gemv_common.cuh), in the CPU's formulas.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// PyTorch's gelu(approximate="tanh").
__device__ __forceinline__ float gelu_tanh(float g) {
    const float k = 0.7978846f;  // sqrt(2/pi)
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
}

// Grid-stride loop over [0, n).
#define FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

#endif  // TS_COMMON_CUH
