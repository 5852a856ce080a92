// Mixture-of-experts pieces around the expert matrix products: routing (for
// a decode row, with its norm and router in the same launch), the expert
// activation (prefill; decode's is fused into the gate_up GEMV,
// kernels/gemv_common.cuh, with the same formulas), and the weighted sum.
// Decode (few rows): the products are the GEMV kernels (gemv_*.cu) with one job per
// (token, selected expert); all on the device, so a step needs no host
// round trip. Prefill (grouped): the (token, slot) pairs are listed per
// expert on the host, each expert's token rows are gathered into one
// contiguous block, the products are cuBLAS GEMMs per expert, and the
// outputs are read back per (token, slot) by the weighted sum.

// Routing one token, by a whole warp (moe_route: one warp a token, a block
// holding blockDim / 32 tokens; moe_norm_route below). Selection order
// is the CPU's: value descending, ties to the lower expert index (as
// torch.topk on CPU); NaN logits are not supported. Each pick is the best
// (value, index) strictly after the previous pick in that order: every lane
// scans its experts (lane, lane + 32, ...), then the warp reduces. Pick j
// is held by lane j. mode 0: softmax over the k selected logits (gpt-oss,
// Mixtral); 1: softmax over all experts, then select; 2: as 1,
// renormalised to sum to one (Qwen3-MoE). The top-k sums run in selection
// order, as the CPU's; the sum over all experts is a warp tree, which
// differs from the CPU's sequential sum by rounding only.
// `lg`: the token's num_experts logits (global or shared memory). Output:
// its k (expert, weight) pairs, ascending by expert, in sel_e[0, k) and
// sel_w[0, k).
__device__ __forceinline__ void route_token(const float* lg, u32 num_experts, u32 top_k,
                                            int mode, int* sel_e, float* sel_w) {
    const u32 lane = threadIdx.x & 31u;
    int mine = -1;  // this lane's pick (lane < top_k)
    float mine_v = 0.0f;
    float pv = 0.0f;
    int pi = -1;
    for (u32 j = 0; j < top_k; j++) {
        int best = -1;
        float bv = 0.0f;
        for (u32 e = lane; e < num_experts; e += 32) {
            const float v = lg[e];
            const bool after = j == 0 || v < pv || (v == pv && (int)e > pi);
            if (after && (best < 0 || v > bv)) {
                best = (int)e;
                bv = v;
            }
        }
        // A total order (valid first, value desc, index asc): every lane
        // ends with the same pick.
        for (int o = 16; o > 0; o >>= 1) {
            const int ob = __shfl_xor_sync(0xffffffffu, best, o);
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
                best = ob;
                bv = ov;
            }
        }
        if (lane == j) {
            mine = best;
            mine_v = bv;
        }
        pv = bv;
        pi = best;
    }
    const bool picked = lane < top_k;
    // The k weights' sum, in selection order.
    auto sum_picks = [&](float v) {
        float s = 0.0f;
        for (u32 j = 0; j < top_k; j++) s += __shfl_sync(0xffffffffu, v, j);
        return s;
    };
    float w;
    if (mode == 0) {
        const float max = __shfl_sync(0xffffffffu, mine_v, 0);
        w = picked ? expf(mine_v - max) : 0.0f;
        w /= sum_picks(w);
    } else {
        float max = NEG_INF;
        for (u32 e = lane; e < num_experts; e += 32) max = fmaxf(max, lg[e]);
        max = warp_max(max);
        float part = 0.0f;
        for (u32 e = lane; e < num_experts; e += 32) part += expf(lg[e] - max);
        const float sum = warp_sum(part);
        w = picked ? expf(mine_v - max) / sum : 0.0f;
        if (mode == 2) w /= sum_picks(w);
    }
    // Ascending by expert: a pick's slot is the number of smaller picks.
    u32 slot = 0;
    for (u32 j = 0; j < top_k; j++) slot += __shfl_sync(0xffffffffu, mine, j) < mine;
    if (picked) {
        sel_e[slot] = mine;
        sel_w[slot] = w;
    }
}

extern "C" __global__ void moe_route(int* sel_e, float* sel_w, const float* logits, u32 rows,
                                     u32 num_experts, u32 top_k, int mode) {
    pdl_enter();
    const u32 r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // the whole warp
    route_token(logits + (u64)r * num_experts, num_experts, top_k, mode, sel_e + (u64)r * top_k,
                sel_w + (u64)r * top_k);
}

// One decode row routed straight from the residual stream: the norm, the
// router and moe_route's selection in one launch, so a layer's experts
// wait for one kernel instead of two (the router GEMV's and the
// routing's). gridDim.x plain blocks (sm_90's bulk copies): block c takes
// the router rows [c · per, (c + 1) · per), per = ceil(num_experts /
// blocks), which one bulk copy (the rows are contiguous; bf16 or f16
// [num_experts, hidden], which no kernel writes) brings into its shared
// memory before waiting for the previous kernel, as are the norm's
// weights into registers; what is left after it is x's round trip. Each
// block norms the row itself (x is 4 · hidden bytes), dots its rows and
// stores their logits in `glogits`; the last block to finish (a ticket:
// `*ticket` counts the blocks done, after a fence that makes their logits
// visible; that block sets it back to 0 for the next launch) reads them
// back and its first warp routes.
// - Many blocks with short copies: the host gives each one router row
//   (src/moe.rs's ROUTE_ROWS). The copies are on the step's path where
//   they are long: gpt-oss-120b's 128 rows of 2,880 as one cluster of 16
//   blocks of 8 rows made 374 tok/s, as 128 blocks 380 (BENCHMARKS.md,
//   twenty-seventh session).
// - One counter serves every launch: no two launches' blocks are past
//   their PDL wait at once (each waits for the kernel before it, which
//   waited for the one before, back to the previous routing launch).
// Numerics: normed = w · (x · r), r = 1 / sqrt(mean(x²) + eps), norm.cu's
// order (the sum of squares a block tree); a logit is Σ normed · W (lanes,
// then a warp tree) plus the bias, the CPU linear's order; block 0 writes
// `normed` for the experts. Shared memory: the block's rows, then normed
// (hidden f32), then the logits (num_experts f32, the last block's).
// hidden ≤ NR_HELD · blockDim.
#define NR_WARPS 8
#define NR_HELD 16

// Σ of one 16-byte chunk of a router row (8 bf16 or f16 weights, widened
// exactly) times the 8 matching normed values, in index order.
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b, int dt) {
    const u32 h[4] = {w.x, w.y, w.z, w.w};
    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u16 lo = (u16)(h[i] & 0xffffu), hi = (u16)(h[i] >> 16);
        const float wl = dt == DT_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
        const float wh = dt == DT_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
        s += wl * x[2 * i];
        s += wh * x[2 * i + 1];
    }
    return s;
}

extern "C" __global__ void __launch_bounds__(NR_WARPS * 32)
    moe_norm_route(int* sel_e, float* sel_w, float* normed, const float* x, const void* norm_w,
                   int norm_dt, float eps, const u16* router, int router_dt, const void* bias,
                   int bias_dt, u32 hidden, u32 num_experts, u32 top_k, int mode,
                   float* glogits, u32* ticket) {
#if __CUDA_ARCH__ >= 900
    DYNAMIC_SHARED(uint4, nr_shared);
    __shared__ u64 copied;
    __shared__ bool last;
    const u32 per = (num_experts + gridDim.x - 1) / gridDim.x;
    const u32 e0 = min(num_experts, blockIdx.x * per), e1 = min(num_experts, e0 + per);
    const u32 chunks = hidden / 8;  // 8 weights (16 bytes) a chunk
    uint4* rows = nr_shared;
    float* xn = (float*)(rows + (u64)per * chunks);
    float* lg = xn + hidden;
    const u32 bytes = (e1 - e0) * hidden * 2;
    if (threadIdx.x == 0) {
        mbar_init(&copied, 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0 && bytes > 0) {
        mbar_expect(&copied, bytes);
        bulk_copy(rows, router + (u64)e0 * hidden, bytes, &copied);
    }
    float wv[NR_HELD], xv[NR_HELD];
#pragma unroll
    for (int j = 0; j < NR_HELD; j++) {
        const u32 i = threadIdx.x + j * blockDim.x;
        wv[j] = i < hidden ? load_w(norm_w, norm_dt, i) : 0.0f;
    }
    pdl_enter();
#pragma unroll
    for (int j = 0; j < NR_HELD; j++) {
        const u32 i = threadIdx.x + j * blockDim.x;
        xv[j] = i < hidden ? x[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NR_HELD; j++) ss += xv[j] * xv[j];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)hidden + eps);
#pragma unroll
    for (int j = 0; j < NR_HELD; j++) {
        const u32 i = threadIdx.x + j * blockDim.x;
        if (i < hidden) {
            const float v = wv[j] * (xv[j] * r);
            xn[i] = v;
            if (blockIdx.x == 0) normed[i] = v;
        }
    }
    if (bytes > 0) mbar_wait(&copied, 0);
    __syncthreads();
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (u32 e = e0 + warp; e < e1; e += blockDim.x >> 5) {
        const uint4* row = rows + (u64)(e - e0) * chunks;
        float s = 0.0f;
        for (u32 c = lane; c < chunks; c += 32) {
            s += dot8(row[c], ((const float4*)xn)[2 * c], ((const float4*)xn)[2 * c + 1], router_dt);
        }
        s = warp_sum(s);
        if (lane == 0) glogits[e] = bias ? s + load_w(bias, bias_dt, e) : s;
    }
    __syncthreads();  // this block's logits are stored
    if (threadIdx.x == 0) {
        __threadfence();  // ... and visible before the ticket says so
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        if (last) {
            *ticket = 0;      // every block has counted
            __threadfence();  // the others' logits, seen through the ticket
        }
    }
    __syncthreads();
    if (!last || warp != 0) return;
    // From L2: this block's L1 never held these lines, but another
    // launch's blocks on this SM may have.
    for (u32 e = lane; e < num_experts; e += 32) lg[e] = __ldcg(glogits + e);
    __syncwarp();
    route_token(lg, num_experts, top_k, mode, sel_e, sel_w);
#endif
}

// Column c of the activation of one gate_up row; the gate_up bias (when
// given: `bias` + `bias_row`, dtype `bias_dt`) is added first, as the CPU's
// linear does.
// act 0 SwiGlu: gate = columns [0, width), up = [width, 2·width), silu(gate)·up.
// act 1 ClampedSwiGlu (gpt-oss): gate = even columns, up = odd ones;
// gate ≤ limit, up in [−limit, limit], (up + 1) · gate · sigmoid(alpha · gate).
__device__ __forceinline__ float moe_act_at(const float* row, const void* bias, int bias_dt,
                                            u64 bias_row, u32 width, u64 c, int act, float alpha,
                                            float limit) {
    const u64 gi = act == 0 ? c : 2 * c, ui = act == 0 ? width + c : 2 * c + 1;
    float g = row[gi], u = row[ui];
    if (bias) {
        g += load_w(bias, bias_dt, bias_row + gi);
        u += load_w(bias, bias_dt, bias_row + ui);
    }
    if (act == 0) return g / (1.0f + expf(-g)) * u;
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return (u + 1.0f) * (g / (1.0f + expf(-g * alpha)));
}

// out[r, c] += Σ_j y[r·k + j, c] · w[r·k + j], the sum from zero, j
// ascending (the pairs are sorted by expert), the CPU's order; out is the
// residual stream (the block's add fused here).
extern "C" __global__ void moe_combine(float* out, const float* y, const float* sel_w, u32 rows,
                                       u32 top_k, u32 hidden) {
    pdl_enter();
    FOR_EACH(i, (u64)rows * hidden) {
        const u64 r = i / hidden, c = i % hidden;
        float o = 0.0f;
        for (u32 j = 0; j < top_k; j++) {
            const u64 job = r * top_k + j;
            o += y[job * hidden + c] * sel_w[job];
        }
        out[i] += o;
    }
}

// Grouped path: out row r = x row row_token[r], as bf16 (round to nearest
// even; `to_bf16` 1) or f32 (0), the operand type of the expert GEMM.
extern "C" __global__ void moe_gather(void* out, const float* x, const int* row_token, u32 rows,
                                      u32 cols, int to_bf16) {
    pdl_enter();
    FOR_EACH(i, (u64)rows * cols) {
        const u64 r = i / cols, c = i % cols;
        const float v = x[(u64)row_token[r] * cols + c];
        if (to_bf16) {
            ((u16*)out)[i] = f32_to_bf16(v);
        } else {
            ((float*)out)[i] = v;
        }
    }
}

// Grouped path: gate_up rows [rows, 2·width] without bias -> activated rows
// [rows, width], adding row r's expert (row_expert[r]) gate_up bias first;
// written as bf16 (`to_bf16` 1) or f32 (0), the operand type of the down GEMM.
extern "C" __global__ void moe_act_rows(void* out, const float* gu, const int* row_expert,
                                        const void* bias, int bias_dt, u32 rows, u32 width,
                                        int act, float alpha, float limit, int to_bf16) {
    pdl_enter();
    FOR_EACH(i, (u64)rows * width) {
        const u64 r = i / width, c = i % width;
        const u64 brow = (u64)row_expert[r] * 2 * width;
        const float v = moe_act_at(gu + r * 2 * width, bias, bias_dt, brow, width, c, act, alpha,
                                   limit);
        if (to_bf16) {
            ((u16*)out)[i] = f32_to_bf16(v);
        } else {
            ((float*)out)[i] = v;
        }
    }
}

// Grouped path: out[r, c] += Σ_j (y[slot_row[s], c] + down_bias[e_s, c]) · w[s]
// for slots s = r·k + j, the sum from zero, j ascending (the pairs are sorted by
// expert): the CPU's order, the bias added before the weighting. A slot
// with slot_row −1 (an expert index out of range, from NaN logits) adds
// nothing.
extern "C" __global__ void moe_combine_rows(float* out, const float* y, const int* slot_row,
                                            const int* sel_e, const float* sel_w,
                                            const void* bias, int bias_dt, u32 rows, u32 top_k,
                                            u32 hidden) {
    pdl_enter();
    FOR_EACH(i, (u64)rows * hidden) {
        const u64 r = i / hidden, c = i % hidden;
        float o = 0.0f;
        for (u32 j = 0; j < top_k; j++) {
            const u64 s = r * top_k + j;
            const int row = slot_row[s];
            if (row < 0) continue;
            float v = y[(u64)row * hidden + c];
            if (bias) v += load_w(bias, bias_dt, (u64)sel_e[s] * hidden + c);
            o += v * sel_w[s];
        }
        out[i] += o;
    }
}
