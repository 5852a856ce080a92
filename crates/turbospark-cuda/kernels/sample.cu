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

// scores_above: out[0] counts the ids whose score is at least `floor`
// (finite: NaN and −inf never are), past `cap` too; the first `cap` of them
// go to out[1 + 2j], out[2 + 2j] as (id, score bits), in no particular
// order (slots taken by one atomicAdd a warp). out[0] must be 0 before the
// launch.
extern "C" __global__ void scores_above(u32* out, const float* x, u32 n, float t, float floor,
                                        u32 cap) {
    pdl_enter();
    const u32 lane = threadIdx.x & 31u;
    for (u64 base = (u64)blockIdx.x * blockDim.x; base < n; base += (u64)gridDim.x * blockDim.x) {
        const u64 i = base + threadIdx.x;
        float s = 0.0f;
        bool keep = false;
        if (i < n) {
            s = x[i] / t;
            keep = s >= floor;
        }
        const u32 mask = __ballot_sync(0xffffffffu, keep);
        if (mask == 0) continue;
        const u32 leader = __ffs(mask) - 1;
        u32 first = 0;
        if (lane == leader) first = atomicAdd(out, __popc(mask));
        first = __shfl_sync(0xffffffffu, first, leader);
        if (!keep) continue;
        const u32 j = first + __popc(mask & ((1u << lane) - 1u));
        if (j < cap) {
            out[1 + 2 * j] = (u32)i;
            out[2 + 2 * j] = __float_as_uint(s);
        }
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
// score that is not a candidate.
__device__ __forceinline__ double draw_weight(float s, float m, double min_w) {
    if (!(s > NEG_INF)) return -1.0;
    const double w = exp((double)s - (double)m);
    return w >= min_w ? (double)(float)w : -1.0;
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
    if (threadIdx.x == 0) {
        const volatile double* p = part;
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
