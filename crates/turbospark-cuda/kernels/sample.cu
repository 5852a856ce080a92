// Token choice on the device, so greedy decoding copies one id per row to
// the host instead of the whole logits row (201,088 floats for gpt-oss), and
// the summaries a sampler needs of a row (below), so that sampling copies a
// few numbers and the candidates that matter.
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

// The largest key of this warp's share of `row`, in every lane. Grid
// (rows, blocks per row): block y takes columns y·blockDim, +
// gridDim.y·blockDim, ...
__device__ __forceinline__ unsigned long long warp_row_key(const float* row, u32 cols) {
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
    return key;
}

// best[row] must be 0 before the launch. Grid (rows, blocks per row).
extern "C" __global__ void argmax_rows(unsigned long long* best, const float* x, u32 cols) {
    pdl_enter();
    const unsigned long long key = warp_row_key(x + (u64)blockIdx.x * cols, cols);
    if ((threadIdx.x & 31u) == 0 && key != 0) atomicMax(best + blockIdx.x, key);
}

// argmax_feed: argmax_rows, then the last block of a row to finish writes
// the row's id as its token and moves its position one on (the batch of
// the greedy step that follows, made without the host). The last block is
// found by a ticket (`done`), as in a threadfence reduction: each warp's
// atomicMax is fenced before its block takes a ticket, so the block with
// the last ticket sees every block's key. That block leaves best and done
// at 0 again: a recorded step replays this with no memset. It also
// writes the token, with the row's new position p, to the host's ring
// (page-locked memory mapped into the device; src/batch.rs), slot
// (p mod ring_len) · rows + r: the host reads it after an event behind
// this launch, with no copy between two replays. Grid (rows, blocks per
// row); best and done are 0 before the first launch.
extern "C" __global__ void argmax_feed(unsigned long long* best, u32* done, const float* x,
                                       u32 cols, u32* tokens, u32* positions,
                                       unsigned long long* ring, u32 ring_len) {
    pdl_enter();
    const u32 r = blockIdx.x;
    const unsigned long long key = warp_row_key(x + (u64)r * cols, cols);
    if ((threadIdx.x & 31u) == 0) {
        if (key != 0) atomicMax(best + r, key);
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x != 0 || atomicAdd(done + r, 1u) != gridDim.y - 1) return;
    __threadfence();
    const unsigned long long k = atomicExch(best + r, 0ull);
    // Key 0: no number in the row, id 0 (the host argmax's rule).
    const u32 token = k == 0 ? 0u : 0xffffffffu - (u32)k;
    const u32 pos = positions[r] + 1;
    tokens[r] = token;
    positions[r] = pos;
    // One 8-byte store: the host never sees a token without its position.
    ring[(u64)(pos % ring_len) * gridDim.x + r] = ((unsigned long long)pos << 32) | token;
    done[r] = 0;
}

// Sampling from summaries of a row (crates/turbospark-backend/src/scores.rs
// defines them, and the sampler's `sample_from` uses them): the scores
// s = l / t (f32 division, as the host's), of which those neither NaN nor
// −inf are the candidates.

// score_stats: block b takes ids [b·chunk, (b + 1)·chunk) and writes
// part[4b .. 4b + 4] = (candidates, their max, whether one is +inf,
// Σ exp(s − that max) over them in f64); the host combines the blocks, in
// block order. Two passes over the block's chunk: the max, then the sum.
#define SCORE_THREADS 256
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    score_stats(double* part, const float* x, u32 n, float t, u32 chunk) {
    pdl_enter();
    __shared__ u32 warp_count[SCORE_THREADS / 32], warp_inf[SCORE_THREADS / 32];
    __shared__ float warp_top[SCORE_THREADS / 32];
    __shared__ double warp_sum_f64[SCORE_THREADS / 32];
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const u32 lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    u32 count = 0, inf = 0;
    float m = NEG_INF;
    for (u32 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float s = x[i] / t;
        if (s > NEG_INF) {
            count++;
            m = fmaxf(m, s);
            inf |= s == __int_as_float(0x7f800000);
        }
    }
    count = __reduce_add_sync(0xffffffffu, count);
    inf = __any_sync(0xffffffffu, inf != 0);
    m = warp_max(m);
    if (lane == 0) {
        warp_count[warp] = count;
        warp_inf[warp] = inf;
        warp_top[warp] = m;
    }
    __syncthreads();
    count = 0;
    inf = 0;
    m = NEG_INF;
    for (u32 w = 0; w < warps; w++) {
        count += warp_count[w];
        inf |= warp_inf[w];
        m = fmaxf(m, warp_top[w]);
    }
    double sum = 0.0;
    if (count > 0) {
        for (u32 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const float s = x[i] / t;
            if (s > NEG_INF) sum += exp((double)s - (double)m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) warp_sum_f64[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        sum = 0.0;
        for (u32 w = 0; w < warps; w++) sum += warp_sum_f64[w];
        part[4 * blockIdx.x] = (double)count;
        part[4 * blockIdx.x + 1] = (double)m;
        part[4 * blockIdx.x + 2] = inf ? 1.0 : 0.0;
        part[4 * blockIdx.x + 3] = sum;
    }
}

// The weight exp(s − m) (f64) of candidate score s of id `id` (m: the max
// score) that a Keep (crates/turbospark-backend/src/scores.rs) keeps, or −1
// for one it drops or a score that is no candidate (NaN, −inf): at least
// min_w, and with has_last, at or before (last_s, last_id) in score order.
struct Keep {
    double min_w;
    u32 has_last;
    float last_s;
    u32 last_id;
};

__device__ __forceinline__ double kept_weight(const Keep& k, float s, u32 id, float m) {
    if (!(s > NEG_INF)) return -1.0;
    const double w = exp((double)s - (double)m);
    if (!(w >= k.min_w)) return -1.0;
    if (k.has_last && !(s > k.last_s || (s == k.last_s && id <= k.last_id))) return -1.0;
    return w;
}

// scores::bucket: ⌊(m − s) · 32⌋ in f64, at most BUCKETS − 1.
#define BUCKETS 1024
__device__ __forceinline__ u32 score_bucket(float m, float s) {
    return (u32)fmin(((double)m - (double)s) * 32.0, (double)(BUCKETS - 1));
}

// Appends (i, s) to out's list when `keep` (every lane of the warp calls
// it): out[0] counts past `cap` too, the first `cap` go to out[1 + 2j],
// out[2 + 2j] as (id, score bits), slots taken by one atomicAdd a warp.
__device__ __forceinline__ void take_slot(u32* out, u32 cap, bool keep, u64 i, float s) {
    const u32 lane = threadIdx.x & 31u;
    const u32 mask = __ballot_sync(0xffffffffu, keep);
    if (mask == 0) return;
    const u32 leader = __ffs(mask) - 1;
    u32 first = 0;
    if (lane == leader) first = atomicAdd(out, __popc(mask));
    first = __shfl_sync(0xffffffffu, first, leader);
    if (!keep) return;
    const u32 j = first + __popc(mask & ((1u << lane) - 1u));
    if (j < cap) {
        out[1 + 2 * j] = (u32)i;
        out[2 + 2 * j] = __float_as_uint(s);
    }
}

// scores_above: out[0] counts the ids whose score is at least `floor`
// (finite: NaN and −inf never are), past `cap` too; the first `cap` of them
// go to out[1 + 2j], out[2 + 2j] as (id, score bits), in no particular
// order (slots taken by one atomicAdd a warp). out[0] must be 0 before the
// launch.
extern "C" __global__ void scores_above(u32* out, const float* x, u32 n, float t, float floor,
                                        u32 cap) {
    pdl_enter();
    for (u64 base = (u64)blockIdx.x * blockDim.x; base < n; base += (u64)gridDim.x * blockDim.x) {
        const u64 i = base + threadIdx.x;
        const float s = i < n ? x[i] / t : 0.0f;
        take_slot(out, cap, i < n && s >= floor, i, s);
    }
}

// bucket_members: the candidates `keep` keeps in bucket b, listed as
// scores_above lists its own (out[0] 0 before the launch).
extern "C" __global__ void bucket_members(u32* out, const float* x, u32 n, float t, float m,
                                          Keep keep, u32 b, u32 cap) {
    pdl_enter();
    for (u64 base = (u64)blockIdx.x * blockDim.x; base < n; base += (u64)gridDim.x * blockDim.x) {
        const u64 i = base + threadIdx.x;
        const float s = i < n ? x[i] / t : 0.0f;
        const bool in = i < n && kept_weight(keep, s, (u32)i, m) >= 0.0 && score_bucket(m, s) == b;
        take_slot(out, cap, in, i, s);
    }
}

// score_buckets: the sums by bucket of the weights (f32-rounded with
// `rounded`) of the candidates `keep` keeps, in an order fixed by the
// launch so that the same row always gives the same sums. Block b takes
// ids [b·chunk, (b + 1)·chunk); each of its warps adds into a histogram of
// its own in shared memory, its lanes one after another; the block's sum
// of each bucket (its warps' in warp order) goes to part[b · BUCKETS +
// bucket], and the last block to finish (`done`, 0 before the launch)
// sums each bucket over the blocks in block order into out.
#define BUCKET_THREADS 128
extern "C" __global__ void __launch_bounds__(BUCKET_THREADS)
    score_buckets(double* out, u32* done, double* part, const float* x, u32 n, float t, float m,
                  Keep keep, u32 rounded, u32 chunk) {
    pdl_enter();
    __shared__ double hist[BUCKET_THREADS / 32][BUCKETS];
    __shared__ bool last;
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (u32 j = threadIdx.x; j < (BUCKET_THREADS / 32) * BUCKETS; j += blockDim.x) {
        hist[j / BUCKETS][j % BUCKETS] = 0.0;
    }
    __syncthreads();
    const u32 lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    for (u32 base = lo; base < hi; base += blockDim.x) {
        const u32 i = base + threadIdx.x;
        double w = -1.0;
        u32 bk = 0;
        if (i < hi) {
            const float s = x[i] / t;
            w = kept_weight(keep, s, i, m);
            if (w >= 0.0) {
                bk = score_bucket(m, s);
                if (rounded) w = (double)(float)w;
            }
        }
        for (u32 l = 0; l < 32; l++) {
            if (lane == l && w >= 0.0) hist[warp][bk] += w;
            __syncwarp();
        }
    }
    __syncthreads();
    for (u32 bk = threadIdx.x; bk < BUCKETS; bk += blockDim.x) {
        double v = 0.0;
        for (u32 w = 0; w < BUCKET_THREADS / 32; w++) v += hist[w][bk];
        part[(u64)blockIdx.x * BUCKETS + bk] = v;
    }
    __threadfence();  // this block's parts are visible before the count says so
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Loads through L2 (`__ldcg`: this SM's L1 may hold an older use of
    // the buffer), eight in flight, added in block order.
    for (u32 bk = threadIdx.x; bk < BUCKETS; bk += blockDim.x) {
        double v = 0.0;
        for (u32 b0 = 0; b0 < gridDim.x; b0 += 8) {
            double q[8];
#pragma unroll
            for (u32 j = 0; j < 8; j++) {
                q[j] = b0 + j < gridDim.x ? __ldcg(part + (u64)(b0 + j) * BUCKETS + bk) : 0.0;
            }
#pragma unroll
            for (u32 j = 0; j < 8; j++) v += q[j];
        }
        out[bk] = v;
    }
}

// draw_weights: a draw by temperature or min-p alone (scores::draw)
// without the row leaving the device. `best` holds argmax_rows' key of the
// row, whose value is the row's largest l: its score l / t is the largest
// score, as dividing by t > 0 keeps the order (rounding included). The
// candidates are the scores neither NaN nor −inf whose weight
// exp(s − max) (f64) is at least min_w. Block b sums their weights,
// rounded to f32, of ids [b·chunk, (b + 1)·chunk) in f64 into part[b]; the
// last block to finish (counted in `done`, 0 before the launch) finds the
// chunk where the running sum of the parts, in block order, passes
// r = u · total, and splits that chunk into one contiguous span a thread:
// the thread whose running-sum interval holds r walks its span in id
// order. out[0] is the id, or DRAW_NONE where the host must sample the row
// itself: no candidate, a +inf score, or rounding left the walk short. The
// intervals of the threads are bounded by each other's starts, so exactly
// one thread holds r. u and min_w come as the bits of doubles.
#define DRAW_NONE 0xffffffffu

// The float whose order_bits are `k`.
__device__ __forceinline__ float from_order_bits(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The weight of score s as the draw sums it (f32-rounded), or −1 for a
// score that is not a candidate or weighs less than min_w.
__device__ __forceinline__ double draw_weight(float s, float m, double min_w) {
    const Keep k = {min_w, 0u, 0.0f, 0u};
    const double w = kept_weight(k, s, 0u, m);
    return w >= 0.0 ? (double)(float)w : -1.0;
}

extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    draw_weights(u32* out, u32* done, double* part, const unsigned long long* best,
                 const float* x, u32 n, float t, u64 min_w_bits, u64 u_bits, u32 chunk) {
    pdl_enter();
    __shared__ double warp_part[SCORE_THREADS / 32], starts[SCORE_THREADS + 1];
    __shared__ double before_s, r_s;
    __shared__ int chunk_s;
    __shared__ bool last;
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const double min_w = __longlong_as_double((long long)min_w_bits);
    const float m = from_order_bits((u32)(best[0] >> 32)) / t;
    // No candidate (key 0: every l NaN; or the max is −inf) or a +inf
    // score: every block sees it, block 0 says so.
    if (best[0] == 0 || !(m > NEG_INF) || m == __int_as_float(0x7f800000)) {
        if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = DRAW_NONE;
        return;
    }
    const u32 lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    double sum = 0.0;
    for (u32 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const double w = draw_weight(x[i] / t, m, min_w);
        if (w >= 0.0) sum += w;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) warp_part[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        sum = 0.0;
        for (u32 w = 0; w < (blockDim.x >> 5); w++) sum += warp_part[w];
        part[blockIdx.x] = sum;
        __threadfence();  // the part is visible before the count says so
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // every block's part, as the count promised
    // The parts into shared memory at once (through L2: this SM's L1 may
    // hold an older use of the buffer), then scanned by one thread.
    __shared__ double p[1024];
    for (u32 b = threadIdx.x; b < gridDim.x; b += blockDim.x) p[b] = __ldcg(part + b);
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (u32 b = 0; b < gridDim.x; b++) total += p[b];
        const double r = __longlong_as_double((long long)u_bits) * total;
        double before = 0.0;
        int c = -1;
        for (u32 b = 0; b < gridDim.x; b++) {
            if (r < before + p[b]) {
                c = (int)b;
                break;
            }
            before += p[b];
        }
        chunk_s = c;
        before_s = before;
        r_s = r;
        out[0] = DRAW_NONE;  // unless a thread below finds the id
    }
    __syncthreads();
    if (chunk_s < 0) return;
    const u32 clo = (u32)chunk_s * chunk, chi = min(n, clo + chunk);
    const u32 span = (chi - clo + blockDim.x - 1) / blockDim.x;
    const u32 slo = min(chi, clo + threadIdx.x * span), shi = min(chi, slo + span);
    double own = 0.0;
    for (u32 i = slo; i < shi; i++) {
        const double w = draw_weight(x[i] / t, m, min_w);
        if (w >= 0.0) own += w;
    }
    starts[threadIdx.x + 1] = own;
    __syncthreads();
    if (threadIdx.x == 0) {
        double acc = before_s;
        starts[0] = acc;
        for (u32 j = 1; j <= blockDim.x; j++) {
            acc += starts[j];
            starts[j] = acc;
        }
    }
    __syncthreads();
    const double r = r_s;
    const bool final_span = threadIdx.x == blockDim.x - 1;
    if (!(starts[threadIdx.x] <= r && (final_span || r < starts[threadIdx.x + 1]))) return;
    double cum = starts[threadIdx.x];
    for (u32 i = slo; i < shi; i++) {
        const double w = draw_weight(x[i] / t, m, min_w);
        if (w < 0.0) continue;
        cum += w;
        if (r < cum) {
            out[0] = i;
            return;
        }
    }
}
