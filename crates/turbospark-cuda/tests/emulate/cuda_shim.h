// Enough of CUDA to run this crate's kernel sources on the CPU
// (tests/emulated_kernels.rs builds and runs the programs beside this
// file; driver/ builds each kernel file behind it for the emulated GPU the
// GPU tests use where there is no driver), so that CI, which has no GPU,
// still checks the kernels' indexing, reductions and formats against host
// references. The GPU tests on a GPU remain the proof; this is what every
// commit gets.
//
// The model: a block's threads are fibers on one OS thread (switched by
// `context_switch` below),
// each running until it reaches a barrier, then handing over to the next
// (OS threads in lockstep took ~30 times as long: every barrier a futex).
// __syncthreads and named barriers are barriers of the block; each
// warp-wide operation (shuffles, ballots, mma.sync, ldmatrix) is a pair of
// barriers of the warp around an exchange of its lanes' values, so every
// lane of a warp must reach it, as the kernels' full-mask calls promise. A
// thread that returns early leaves the block's and its warp's barriers (as
// an exited GPU thread no longer holds __syncthreads). Blocks of a grid run
// one after another, so `__shared__` is a static, and atomics and fences
// need nothing; programmatic dependent launch is a no-op. Dynamic shared
// memory starts as NaN bytes. Asynchronous copies (cp.async, and bulk
// copies on mbarriers) read their source when issued and land at the
// latest the PTX rules allow (when a wait says their group or phase is
// complete), so a staged buffer read before its wait, or refilled before
// its release, shows; a wait that can never end (a byte count that does
// not match the copies) is reported as a deadlock: a full round of turns
// in which no thread makes progress.
//
// Numbers: f32 as the host computes it; compile with -ffp-contract=off so
// that a * then + is not fused where the kernels ask for _rn rounding.
// mma.sync sums its products exactly and rounds once.
//
// Races between threads show only as far as the two turn orders
// (`reverse_order`) tell them apart: within an order, each fiber runs until
// its next barrier, so the last writer always wins here. What it cannot
// see: timing; the memory model beyond the copies' waits; and the GPU's
// own rounding (FMAs, its expf and tanhf), which is why the checks' bounds
// are of f32 rounding's size rather than zero.
//
// The kernel headers are included as they are, with TS_EMULATED set: their
// leaf functions that are PTX (common.cuh's conversions, streamed loads,
// L2 prefetch and named barrier; kv_store.cuh's and async_copy.cuh's
// copies and mbarriers; grouped_formats.cuh's integer dots; mma.cuh's
// mma.sync and ldmatrix) are left out there and defined here.
#pragma once
#include <ucontext.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <climits>
#include <cstring>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#define __device__
#define __forceinline__ inline
// nvrtc.cpp finds a file's kernels in its preprocessed text by this mark.
#ifdef TS_FIND_KERNELS
#define __global__ ts_global_marker
#else
#define __global__
#endif
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define TS_EMULATED 1

struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
struct uint4 {
    uint32_t x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int i) { return __uint_as_float((uint32_t)i); }
inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }
inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }

struct Dim3 {
    uint32_t x = 0, y = 0, z = 0;
};
// The running fiber's indices (the scheduler sets them at each switch).
inline Dim3 threadIdx, blockIdx, blockDim, gridDim;

struct Fiber;
inline Fiber* fiber_now;

// A fiber switch. On x86-64 a few instructions: push the callee-saved
// registers, swap stack pointers, pop (ucontext's swapcontext also saves
// the signal mask with a system call each time, which was 90% of the
// emulation's run time). AddressSanitizer builds and other machines keep
// ucontext, which the sanitizer knows about.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define TS_FIBER_ASM 1
// Saves the running fiber's registers on its stack and its stack pointer
// in *save, then resumes the fiber whose stack pointer is `load`.
extern "C" void ts_fiber_switch(void** save, void* load);
asm(R"(
    .text
    .globl ts_fiber_switch
    .hidden ts_fiber_switch
    .type ts_fiber_switch, @function
ts_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size ts_fiber_switch, .-ts_fiber_switch
)");
struct Context {
    void* sp;
};
inline void context_switch(Context& save, Context& load) { ts_fiber_switch(&save.sp, load.sp); }
#else
struct Context {
    ucontext_t uc;
};
inline void context_switch(Context& save, Context& load) { swapcontext(&save.uc, &load.uc); }
#endif
// Where `launch` waits while a block's fibers run.
inline Context scheduler;

// Hands over to the next fiber (round robin, `launch`).
inline void yield_fiber();

// Arrivals, releases, copies issued or landed and threads ended so far:
// what a thread not stuck does before it hands over.
inline uint64_t progress;

// Hands over until `done()`. Between two of this fiber's turns every other
// live fiber has had one; if none of them made progress and this wait is
// still not over, none ever will (a lane of the warp left the kernel or
// waits at another barrier; a copy or arrival that never comes): that is
// reported and the program stops, rather than spinning.
template <class Done>
inline void wait_until(const char* what, Done done) {
    while (!done()) {
        const uint64_t before = progress;
        yield_fiber();
        if (progress == before && !done()) {
            std::fprintf(stderr, "deadlock: thread %u of block (%u, %u) waits at %s\n",
                         threadIdx.x, blockIdx.x, blockIdx.y, what);
            std::abort();
        }
    }
}

// A barrier of `need` fibers; the last to arrive releases the others.
struct Barrier {
    uint32_t need, arrived = 0;
    uint64_t phase = 0;
    void release_if_full() {
        progress++;  // an arrival or a departure
        if (arrived > 0 && arrived == need) {
            arrived = 0;
            phase++;
        }
    }
    void arrive_and_wait();
    void arrive_and_drop() {
        need--;
        release_if_full();
    }
};

// The running block: its barrier, its warps' barriers and the lanes'
// exchange slots.
struct Slot {
    uint8_t bytes[8];
    uint32_t u;
    uint32_t a[4], b[2];  // an mma's fragments
    const uint16_t* p;    // an ldmatrix row's address
};
struct Block {
    Barrier all;
    std::vector<Barrier> warps;
    Barrier named[16];  // bar.sync's ids (0 unused: that is `all`)
    std::vector<Slot> slots;
    explicit Block(uint32_t threads)
        : all{threads}, warps(threads / 32, Barrier{32}), named{}, slots(threads) {}
};
inline Block* block_now;
inline void __syncthreads() { block_now->all.arrive_and_wait(); }
inline void __syncwarp() { block_now->warps[threadIdx.x / 32].arrive_and_wait(); }
// bar.sync id, threads: its count is the one its first caller gives.
inline void named_barrier(uint32_t id, uint32_t threads) {
    Barrier& b = block_now->named[id];
    if (b.arrived == 0) b.need = threads;
    b.arrive_and_wait();
}
inline Slot& my_slot() { return block_now->slots[threadIdx.x]; }
inline Slot& lane_slot(uint32_t lane) {
    return block_now->slots[(threadIdx.x & ~31u) + (lane & 31u)];
}

// A lane's value of any type up to 8 bytes, from lane `src`.
template <class T>
inline T __shfl_sync(uint32_t, T v, uint32_t src) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    std::memcpy(my_slot().bytes, &v, sizeof(T));
    __syncwarp();
    T r;
    std::memcpy(&r, lane_slot(src).bytes, sizeof(T));
    __syncwarp();
    return r;
}
template <class T>
inline T __shfl_xor_sync(uint32_t, T v, uint32_t mask) {
    return __shfl_sync(0, v, (threadIdx.x & 31u) ^ mask);
}
inline uint32_t __ballot_sync(uint32_t, bool pred) {
    my_slot().u = pred;
    __syncwarp();
    uint32_t r = 0;
    for (uint32_t l = 0; l < 32; l++) r |= (lane_slot(l).u & 1u) << l;
    __syncwarp();
    return r;
}
inline bool __any_sync(uint32_t, bool pred) { return __ballot_sync(0, pred) != 0; }
inline uint32_t __reduce_add_sync(uint32_t, uint32_t v) {
    uint32_t sum = 0;
    for (uint32_t l = 0; l < 32; l++) sum += __shfl_sync(0, v, l);
    return sum;
}
inline bool __syncthreads_and(bool pred) {
    my_slot().u = pred;
    __syncthreads();
    bool all = true;
    for (uint32_t t = 0; t < blockDim.x; t++) all &= block_now->slots[t].u != 0;
    __syncthreads();
    return all;
}
inline int __popc(uint32_t v) { return __builtin_popcount(v); }
inline int __ffs(uint32_t v) { return __builtin_ffs((int)v); }
inline double __longlong_as_double(long long v) {
    double d;
    std::memcpy(&d, &v, 8);
    return d;
}

// common.cuh's PTX leaves. Round to nearest even, as cvt.rn.bf16.f32
// (NaN kept quiet).
inline uint16_t f32_to_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// cvt.f32.f16: exact.
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        const float v = std::ldexp((float)m, -24);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
inline uint4 ld_stream(const void* p) {
    uint4 r;
    std::memcpy(&r, p, 16);
    return r;
}
inline uint32_t ld_stream_u32(const void* p) {
    uint32_t r;
    std::memcpy(&r, p, 4);
    return r;
}
inline uint2 ld_stream_u64(const void* p) {
    uint2 r;
    std::memcpy(&r, p, 8);
    return r;
}
inline void prefetch_l2(const void*) {}
template <class T>
inline T __ldcg(const T* p) {
    return *p;
}
inline int __float2int_rn(float f) {
    // cvt.rni.s32.f32: ties to even, NaN to 0, saturating.
    if (std::isnan(f)) return 0;
    const float r = std::nearbyint(f);
    if (r >= 2147483648.0f) return INT32_MAX;
    if (r < -2147483648.0f) return INT32_MIN;
    return (int)r;
}
inline float __int2float_rn(int n) { return (float)n; }
// Blocks run one after another and a block's threads on one OS thread:
// every write is visible at once, and atomics need no atomicity.
inline void __threadfence() {}
template <class T, class V, class Op>
inline T atomic_update(T* p, V value, Op op) {
    const T old = *p;
    *p = op(old, (T)value);
    return old;
}
template <class T, class V>
inline T atomicAdd(T* p, V v) {
    return atomic_update(p, v, [](T a, T b) { return a + b; });
}
template <class T, class V>
inline T atomicMax(T* p, V v) {
    return atomic_update(p, v, [](T a, T b) { return a > b ? a : b; });
}
template <class T, class V>
inline T atomicMin(T* p, V v) {
    return atomic_update(p, v, [](T a, T b) { return a < b ? a : b; });
}
template <class T, class V>
inline T atomicExch(T* p, V v) {
    return atomic_update(p, v, [](T, T b) { return b; });
}
// Byte n of the result: byte (s >> 4n) & 7 of y:x (x bytes 0-3).
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
    return r;
}
// The launch's dynamic shared memory (`launch`'s shared_bytes).
inline uint8_t* dynamic_shared;
#define DYNAMIC_SHARED(T, name) T* const name = (T*)dynamic_shared
// Shared-memory addresses feed only the PTX left out (smem_u32).
inline uint64_t __cvta_generic_to_shared(const void*) { return 0; }

#include "common.cuh"

// grouped_formats.cuh's PTX leaves. dp4a.s32.s32: Σ of the four signed
// byte products, plus c.
inline int dp4a(uint32_t a, uint32_t b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
// dp2a.lo/hi.s32.s32: the two signed 16-bit halves of a times signed bytes
// 0, 1 (lo) or 2, 3 (hi) of b, plus c.
inline int dp2a(uint32_t a, uint32_t b, int c, int from) {
    for (int i = 0; i < 2; i++) {
        c += (int)(int16_t)(a >> (16 * i)) * (int)(int8_t)(b >> (8 * (from + i)));
    }
    return c;
}
inline int dp2a_lo(uint32_t a, uint32_t b, int c) { return dp2a(a, b, c, 0); }
inline int dp2a_hi(uint32_t a, uint32_t b, int c) { return dp2a(a, b, c, 2); }
// prmt.b32 (default mode): a selector nibble's bits 0-2 pick a byte of b:a,
// its bit 3 replaces the byte by its sign bit, replicated.
inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    const uint64_t v = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) {
        const uint32_t s = (sel >> (4 * n)) & 0xfu;
        uint32_t byte = (uint32_t)(v >> (8 * (s & 7u))) & 0xffu;
        if (s & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
        r |= byte << (8 * n);
    }
    return r;
}
// max.NaN.f32: NaN if either is.
inline float max_nan(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return NAN;
    return std::fmax(a, b);
}

// kv_store.cuh's asynchronous copies, queued per thread in commit groups
// and landed by the waits. A copy reads its source when issued and writes
// shared memory when its group's wait returns: the two ends of what the
// GPU may do, so a staged row read before its wait, or overwritten by the
// kernel before a copy into it has landed, shows up here.
struct Copy {
    void* dst;
    uint8_t bytes[16];
    uint32_t size;
};
struct Copies {
    std::vector<std::vector<Copy>> groups;  // committed, oldest first
    std::vector<Copy> open;
};
Copies& copies_now();
inline void land(const std::vector<Copy>& group) {
    for (const Copy& c : group) std::memcpy(c.dst, c.bytes, c.size);
}
inline void issue(void* smem, const void* gmem, uint32_t size) {
    Copy c{smem, {}, size};
    if (gmem) std::memcpy(c.bytes, gmem, size);
    copies_now().open.push_back(c);
}
inline void cp_async16(void* smem, const void* gmem) { issue(smem, gmem, 16); }
inline void cp_async16_or_zero(void* smem, const void* gmem, bool copy) {
    issue(smem, copy ? gmem : nullptr, 16);
}
inline void cp_async8(void* smem, const void* gmem) { issue(smem, gmem, 8); }
inline void cp_async_commit() {
    Copies& c = copies_now();
    c.groups.push_back(std::move(c.open));
    c.open.clear();
}
// Until at most N committed groups are in flight: the older ones land.
template <int N>
inline void cp_async_wait() {
    Copies& c = copies_now();
    while (c.groups.size() > (size_t)N) {
        land(c.groups.front());
        c.groups.erase(c.groups.begin());
    }
}
// Commits the open group and lands everything.
inline void cp_async_wait_all() {
    cp_async_commit();
    cp_async_wait<0>();
}

// async_copy.cuh's mbarriers and bulk copies. A barrier completes a phase
// once its arrivals are in and the bytes it expects have landed; a bulk
// copy reads its source when issued and lands when a wait finds the
// phase's arrivals in (the latest the GPU may), so a stage read before its
// wait, refilled before its release, or a byte count that does not match
// the copies (a wait that never ends) shows up here.
struct Mbar {
    uint32_t count = 0, pending = 0;
    int64_t tx = 0;  // bytes expected and not yet landed
    uint64_t completed = 0;
    struct Flying {
        void* dst;
        std::vector<uint8_t> bytes;  // the source as it was at issue
    };
    std::vector<Flying> flying;  // copies issued, not landed
};
inline std::unordered_map<const void*, Mbar> mbars;
inline Mbar& mbar_of(const void* bar) {
    auto it = mbars.find(bar);
    if (it == mbars.end()) {
        std::fprintf(stderr, "an mbarrier used before mbar_init\n");
        std::abort();
    }
    return it->second;
}
inline void mbar_complete_if_done(Mbar& b) {
    progress++;  // an arrival, a copy landed or expected
    if (b.pending == 0 && b.flying.empty() && b.tx == 0) {
        b.completed++;
        b.pending = b.count;
    }
}
inline void mbar_init(u64* bar, u32 count) { mbars[bar] = Mbar{count, count}; }
inline void mbar_fence_init() {}
inline void mbar_expect(u64* bar, u32 bytes) {
    Mbar& b = mbar_of(bar);
    b.tx += bytes;
    b.pending--;
    mbar_complete_if_done(b);
}
inline void mbar_arrive(u64* bar) {
    Mbar& b = mbar_of(bar);
    b.pending--;
    mbar_complete_if_done(b);
}
inline void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
    if (bytes % 16 != 0 || (uintptr_t)dst % 16 != 0 || (uintptr_t)src % 16 != 0) {
        std::fprintf(stderr, "a bulk copy of %u bytes not in 16-byte units\n", bytes);
        std::abort();
    }
    Mbar& b = mbar_of(bar);
    b.flying.push_back({dst, {(const uint8_t*)src, (const uint8_t*)src + bytes}});
    progress++;
}
// Until the phase of parity `parity` has completed.
inline void mbar_wait(u64* bar, u32 parity) {
    wait_until("an mbarrier", [&] {
        Mbar& b = mbar_of(bar);
        if (b.pending == 0 && !b.flying.empty()) {
            for (const Mbar::Flying& f : b.flying) {
                std::memcpy(f.dst, f.bytes.data(), f.bytes.size());
                b.tx -= (int64_t)f.bytes.size();
            }
            b.flying.clear();
            mbar_complete_if_done(b);
        }
        return (b.completed & 1u) != parity;
    });
}

// mma.cuh's PTX leaves. mma.sync.m16n8k16 (bf16 operands, f32
// accumulator) from every lane's fragments, laid out as the PTX ISA's
// "Matrix fragments for mma.m16n8k16" (flash_attention.cu's header: g =
// lane / 4, t = lane % 4): the 16 exact products of an element summed in
// f64 and rounded once into the accumulator, which the hardware matches
// up to its last bits.
inline void fa_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    Slot& me = my_slot();
    me.a[0] = a0, me.a[1] = a1, me.a[2] = a2, me.a[3] = a3, me.b[0] = b0, me.b[1] = b1;
    __syncwarp();
    auto half = [](u32 w, int i) { return bf16_to_f32((u16)(i ? w >> 16 : w & 0xffffu)); };
    // A[r][k]: lane 4(r % 8) + (k % 8) / 2, register (r / 8) + 2 (k / 8).
    auto A = [&](int r, int k) {
        return half(lane_slot(4 * (r % 8) + (k % 8) / 2).a[(r / 8) + 2 * (k / 8)], k % 2);
    };
    // B[k][n]: lane 4n + (k % 8) / 2, register k / 8.
    auto B = [&](int k, int n) { return half(lane_slot(4 * n + (k % 8) / 2).b[k / 8], k % 2); };
    const int lane = threadIdx.x & 31u, g = lane / 4, t = lane % 4;
    float d[4];
    for (int e = 0; e < 4; e++) {
        const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
        double acc = 0.0;
        for (int k = 0; k < 16; k++) acc += (double)A(r, k) * (double)B(k, n);
        d[e] = (float)((double)c[e] + acc);
    }
    __syncwarp();
    for (int e = 0; e < 4; e++) c[e] = d[e];
}

// ldmatrix.x4.trans: lane 8m + i gives row i of matrix m; lane l gets, of
// matrix m, rows 2(l % 4), 2(l % 4) + 1 of column l / 4 in register m.
inline void fa_ldsm_x4_trans(const u16* p, u32* b) {
    my_slot().p = p;
    __syncwarp();
    const u32 lane = threadIdx.x & 31u;
    for (int m = 0; m < 4; m++) {
        const u16* r0 = lane_slot(8 * m + 2 * (lane % 4)).p;
        const u16* r1 = lane_slot(8 * m + 2 * (lane % 4) + 1).p;
        b[m] = (u32)r0[lane / 4] | ((u32)r1[lane / 4] << 16);
    }
    __syncwarp();
}

// The sm_90 forms of the kernels (streamed GEMVs, routing) are compiled
// from here on; common.cuh's PDL, above, is a no-op either way.
#define __CUDA_ARCH__ 900

// A thread of the running block.
struct Fiber {
    Context ctx;
    std::unique_ptr<char[]> stack;
    bool done = false;
    Copies copies;
    // The barrier it waits at and the phase it waits to end, so that the
    // turns pass it by until then (`next_fiber`) rather than switching to
    // it only to switch away: most of a block's switches were those.
    const Barrier* barrier = nullptr;
    uint64_t phase = 0;
    bool blocked() const { return barrier != nullptr && barrier->phase == phase; }
};

inline void Barrier::arrive_and_wait() {
    const uint64_t mine = phase;
    arrived++;
    release_if_full();
    fiber_now->barrier = this;
    fiber_now->phase = mine;
    wait_until("a barrier", [&] { return phase != mine; });
    fiber_now->barrier = nullptr;
}
inline Copies& copies_now() { return fiber_now->copies; }
// The running block's fibers: the first `fiber_count` of a pool kept from
// launch to launch (their stacks are allocated once, not at every launch).
inline std::vector<Fiber> fiber_pool;
inline Fiber* fibers_now;
inline size_t fiber_count;
// A fiber's thread index: its place among the block's.
inline uint32_t thread_of(const Fiber* f) { return (uint32_t)(f - fibers_now); }

// The order the block's threads take turns in: ascending thread index,
// or with TS_EMULATE_ORDER=reverse in the environment descending. Code
// that is right only because an earlier thread (or lane) happened to write
// before a later one read, with no barrier between, gives other results
// in the other order: tests/emulated_kernels.rs runs every program both
// ways.
inline const bool reverse_order = [] {
    const char* v = std::getenv("TS_EMULATE_ORDER");
    return v != nullptr && std::strcmp(v, "reverse") == 0;
}();

// The next fiber of the block after the running one (round robin in
// `reverse_order`'s direction) that is neither done nor waiting at a
// barrier that has not opened, or null when none is left.
inline Fiber* next_fiber() {
    Fiber* fs = fibers_now;
    const size_t n = fiber_count, me = fiber_now - fs;
    Fiber* waiting = nullptr;
    for (size_t i = 1; i <= n; i++) {
        Fiber& f = fs[(reverse_order ? me + n - i : me + i) % n];
        if (f.done) continue;
        if (!f.blocked()) return &f;
        if (waiting == nullptr) waiting = &f;
    }
    // Every other fiber waits at a barrier still closed: the first of
    // them in turn, whose wait (wait_until) then finds no progress made.
    return waiting;
}

// Switches from the running fiber straight to `to` (or to the scheduler).
inline void switch_to(Fiber* to) {
    Fiber* from = fiber_now;
    if (to == nullptr) {
        context_switch(from->ctx, scheduler);
        return;
    }
    fiber_now = to;
    threadIdx = {thread_of(to), 0, 0};
    if (to != from) context_switch(from->ctx, to->ctx);
}
inline void yield_fiber() { switch_to(next_fiber()); }

// Stack of a fiber: the kernels' arrays of registers, with room to spare.
constexpr size_t FIBER_STACK = 256 * 1024;
inline const std::function<void()>* kernel_now;

inline void fiber_main() {
    (*kernel_now)();
    // Copies it never waited for land at its end (the GPU lands them too).
    cp_async_wait_all();
    block_now->warps[threadIdx.x / 32].arrive_and_drop();
    block_now->all.arrive_and_drop();
    fiber_now->done = true;
    progress++;
    switch_to(next_fiber());
}

// Makes `f` start at fiber_main on its own stack when first switched to.
inline void start_fiber(Fiber& f) {
#ifdef TS_FIBER_ASM
    // What ts_fiber_switch pops, from its stack pointer up: six registers
    // (zero), then fiber_main as the return address, then a null return
    // address for fiber_main itself (which never returns): a call's
    // alignment, the stack pointer 8 past a multiple of 16 at entry.
    // Each fiber's stack top is moved down by a different multiple of
    // 4 KB + 64 B: at one stride (FIBER_STACK, a power of two) every top
    // fell in one set of the L1 and L2 caches, and the switches missed.
    const uintptr_t color = (uintptr_t)(&f - fiber_pool.data()) % 31 * (4096 + 64);
    uintptr_t top = ((uintptr_t)f.stack.get() + FIBER_STACK - color) & ~(uintptr_t)15;
    void** sp = (void**)top - 8;
    for (int i = 0; i < 6; i++) sp[i] = nullptr;
    sp[6] = (void*)&fiber_main;
    sp[7] = nullptr;
    f.ctx.sp = sp;
#else
    ucontext_t& uc = f.ctx.uc;
    getcontext(&uc);
    uc.uc_stack.ss_sp = f.stack.get();
    uc.uc_stack.ss_size = FIBER_STACK;
    uc.uc_link = nullptr;
    makecontext(&uc, fiber_main, 0);
#endif
}

// Runs `kernel` over a grid of (gx, gy, gz) blocks of `threads` threads,
// one block after another; within a block, each thread in turn until it
// reaches a barrier or ends. `shared_bytes`: the launch's dynamic shared
// memory (one buffer, reused by each block as the GPU would).
inline void launch(uint32_t gx, uint32_t gy, uint32_t gz, uint32_t threads,
                   const std::function<void()>& kernel, size_t shared_bytes) {
    // Shared memory starts as garbage on the GPU: NaN bytes here.
    std::vector<uint8_t> dynamic(shared_bytes + 16, 0xff);
    dynamic_shared = dynamic.data();
    gridDim = {gx, gy, gz};
    blockDim = {threads, 1, 1};
    kernel_now = &kernel;
    if (fiber_pool.size() < threads) fiber_pool.resize(threads);
    Fiber* fibers = fiber_pool.data();
    for (uint32_t z = 0; z < gz; z++) {
        for (uint32_t y = 0; y < gy; y++) {
            for (uint32_t x = 0; x < gx; x++) {
                Block block(threads);
                block_now = &block;
                mbars.clear();
                blockIdx = {x, y, z};
                for (uint32_t t = 0; t < threads; t++) {
                    Fiber& f = fibers[t];
                    f.done = false;
                    f.barrier = nullptr;
                    if (!f.stack) f.stack.reset(new char[FIBER_STACK]);
                    start_fiber(f);
                }
                // The first thread in turn order first; the fibers hand over
                // among themselves and the last to end comes back here.
                fibers_now = fibers;
                fiber_count = threads;
                fiber_now = &fibers[reverse_order ? threads - 1 : 0];
                threadIdx = {thread_of(fiber_now), 0, 0};
                context_switch(scheduler, fiber_now->ctx);
            }
        }
    }
}
// A grid of (gx, gy) blocks.
inline void launch(uint32_t gx, uint32_t gy, uint32_t threads, const std::function<void()>& kernel,
                   size_t shared_bytes = 0) {
    launch(gx, gy, 1, threads, kernel, shared_bytes);
}
