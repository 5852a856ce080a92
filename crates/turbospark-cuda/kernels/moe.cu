// Mixture-of-experts pieces around the expert matvecs (which are gemv.cu's
// kernels with one job per (token, selected expert)): routing, the expert
// activation, and the weighted sum. All on the device, so a decode step
// needs no host round trip.

#define MOE_MAX_TOPK 32

// One thread per token. Selection order is the CPU's: value descending,
// ties to the lower expert index (as torch.topk on CPU); NaN logits are not
// supported. mode 0: softmax over the k selected logits (gpt-oss, Mixtral);
// 1: softmax over all experts, then select; 2: as 1, renormalised to sum to
// one (Qwen3-MoE). Sums run in the CPU's order (selection order for the
// top-k softmax and renormalisation, expert order for the full softmax).
// Output: the k (expert, weight) pairs of each token, ascending by expert.
extern "C" __global__ void moe_route(int* sel_e, float* sel_w, const float* logits, u32 rows,
                                     u32 num_experts, u32 top_k, int mode) {
    const u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* lg = logits + (u64)r * num_experts;
    int idx[MOE_MAX_TOPK];
    float w[MOE_MAX_TOPK];
    // The j-th pick is the best (value, index) strictly after the previous
    // pick in the order (value desc, index asc).
    float pv = 0.0f;
    int pi = -1;
    for (u32 j = 0; j < top_k; j++) {
        int best = -1;
        float bv = 0.0f;
        for (u32 e = 0; e < num_experts; e++) {
            const float v = lg[e];
            const bool after = j == 0 || v < pv || (v == pv && (int)e > pi);
            if (after && (best < 0 || v > bv)) {
                best = (int)e;
                bv = v;
            }
        }
        idx[j] = best;
        w[j] = bv;
        pv = bv;
        pi = best;
    }
    if (mode == 0) {
        const float max = w[0];
        float sum = 0.0f;
        for (u32 j = 0; j < top_k; j++) {
            w[j] = expf(w[j] - max);
            sum += w[j];
        }
        for (u32 j = 0; j < top_k; j++) w[j] /= sum;
    } else {
        float max = NEG_INF;
        for (u32 e = 0; e < num_experts; e++) max = fmaxf(max, lg[e]);
        float sum = 0.0f;
        for (u32 e = 0; e < num_experts; e++) sum += expf(lg[e] - max);
        for (u32 j = 0; j < top_k; j++) w[j] = expf(w[j] - max) / sum;
        if (mode == 2) {
            float s = 0.0f;
            for (u32 j = 0; j < top_k; j++) s += w[j];
            for (u32 j = 0; j < top_k; j++) w[j] /= s;
        }
    }
    // Insertion sort by expert index.
    for (u32 j = 1; j < top_k; j++) {
        const int e = idx[j];
        const float v = w[j];
        int i = (int)j - 1;
        while (i >= 0 && idx[i] > e) {
            idx[i + 1] = idx[i];
            w[i + 1] = w[i];
            i--;
        }
        idx[i + 1] = e;
        w[i + 1] = v;
    }
    for (u32 j = 0; j < top_k; j++) {
        sel_e[(u64)r * top_k + j] = idx[j];
        sel_w[(u64)r * top_k + j] = w[j];
    }
}

// gate_up rows [jobs, 2·width] -> activated rows [jobs, width].
// act 0 SwiGlu: gate = columns [0, width), up = [width, 2·width), silu(gate)·up.
// act 1 ClampedSwiGlu (gpt-oss): gate = even columns, up = odd ones;
// gate ≤ limit, up in [−limit, limit], (up + 1) · gate · sigmoid(alpha · gate).
extern "C" __global__ void moe_act(float* out, const float* gu, u32 jobs, u32 width, int act,
                                   float alpha, float limit) {
    FOR_EACH(i, (u64)jobs * width) {
        const u64 j = i / width, c = i % width;
        const float* row = gu + j * 2 * width;
        if (act == 0) {
            const float g = row[c];
            out[i] = g / (1.0f + expf(-g)) * row[width + c];
        } else {
            const float g = fminf(row[2 * c], limit);
            const float u = fminf(fmaxf(row[2 * c + 1], -limit), limit);
            out[i] = (u + 1.0f) * (g / (1.0f + expf(-g * alpha)));
        }
    }
}

// out[r, c] = Σ_j y[r·k + j, c] · w[r·k + j], from zero, j ascending (the
// pairs are sorted by expert), the CPU's order.
extern "C" __global__ void moe_combine(float* out, const float* y, const float* sel_w, u32 rows,
                                       u32 top_k, u32 hidden) {
    FOR_EACH(i, (u64)rows * hidden) {
        const u64 r = i / hidden, c = i % hidden;
        float o = 0.0f;
        for (u32 j = 0; j < top_k; j++) {
            const u64 job = r * top_k + j;
            o += y[job * hidden + c] * sel_w[job];
        }
        out[i] = o;
    }
}
