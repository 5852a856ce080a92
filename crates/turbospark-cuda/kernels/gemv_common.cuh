// Shared by gemv_dense.cu and gemv_grouped.cu (each compiled with this
// header in front; src/compile.rs): the launch's segment table, what it
// does around its product, and the kernel entry points' signature.
//
// Matrix-vector products for decode and for mixture-of-experts jobs:
//   out[job·nx + t, r] = Σ_c x[xrow(job)·nx + t, c] · W[e(job)·m + r, c] (+ bias[e·m + r])
// with xrow(job) = job / x_div and e(job) = experts[job] (0 when `experts`
// is null). A plain linear is one job with nx ≤ 4 rows of x, so each weight
// row is read once for all of them; an MoE layer is one job per (token,
// selected expert) with nx = 1.
//
// Layout: a block of 8 warps computes 8 / W output rows with W warps per
// row (W = `wpr`, 1, 2, 4 or 8; the host picks it so that the resident
// blocks stay busy: src/gemv.rs); a block of work is 8 / W rows, and a
// launch's blocks along y take its blocks of work in turn (the grouped
// f32-activation kernels: one each). The W warps of a
// row take its 256-value chunks round-robin, and their partial sums meet
// in shared memory in warp order. Each lane reads 16 bytes of the weight
// row at a time (8 bf16/f16 values; 8 f32 as two 16-byte loads) when the
// row length allows aligned vectors, else one element at a time; grouped
// formats (MXFP4, int8, int4) take one 32-value group at a time.
//
// Decode is bound by how many weight bytes are in flight: each lane issues
// UNROLL loads of raw weight words (4 chunks of 16 bytes for the dense
// formats) before it widens any, and keeps only those words (not widened
// floats) in registers, so four blocks fit on an SM. Weights go through
// the non-caching read-only path (`ld_stream`); x is re-read from L1 by
// every warp (gemv_dense.cu). The grouped formats are described above
// their kernels (gemv_grouped.cu).

#define GEMV_MAX_X 4
#define GEMV_MAX_SEGS 3

// Up to GEMV_MAX_SEGS matrices with the same input width and format, one
// launch for all (a layer's q, k and v; gate and up): their rows are laid
// end to end, each segment padded to a multiple of the rows a warp takes,
// so small matrices share the GPU instead of each leaving it half idle.
// `scales` is only read by the grouped formats; a null bias is none.
// The last fields say what a launch does around its product: with `norm`
// non-null (one row of x, one job), x is read through an RMSNorm with those
// weights (dtype norm_dt) and eps, and block (0, 0) also writes the normed
// row to `normed` when that is non-null; with `accumulate`, each output
// adds the product to what it holds (a residual add) instead of being
// overwritten; with `glu`, the rows come as gate/up pairs and the output
// is the activation of each pair, half as many values: one segment (an MoE
// expert's gate_up rows, see glu_row below) or two of the same height (a
// dense MLP's gate and up, GLU_SEGS_*; the activation goes to the first
// segment's output).
// Must match `GemvSegs` in src/gemv.rs.
struct GemvSegs {
    const void* w[GEMV_MAX_SEGS];
    const void* scales[GEMV_MAX_SEGS];
    const void* bias[GEMV_MAX_SEGS];
    float* out[GEMV_MAX_SEGS];
    u32 m[GEMV_MAX_SEGS];
    u32 count;
    const void* norm;
    float* normed;
    int norm_dt;
    float eps;
    u32 accumulate;
    int glu;
    float glu_alpha;
    float glu_limit;
    // Nonzero where the experts array was final before the launch before
    // this one (gemv_grouped_qx may read it before its PDL wait).
    u32 experts_settled;
    // The --quant formats' scale group: code group g (32 values) reads
    // scale g >> scale_shift (0 for 32-value scales and MXFP4).
    u32 scale_shift;
};

// Gated activations fused into the store (`glu`): the layouts and formulas
// of kernels/moe.cu's moe_act_at (the CPU's).
#define GLU_NONE 0
// SwiGlu: gate = rows [0, m/2), up = rows [m/2, m); silu(gate) · up.
#define GLU_SWIGLU_HALVES 1
// ClampedSwiGlu (gpt-oss): gate = even rows, up = odd rows; gate ≤ limit,
// up in [−limit, limit], (up + 1) · gate · sigmoid(alpha · gate).
#define GLU_CLAMPED_PAIRS 2
// A dense MLP: gate = segment 0, up = segment 1 (as many rows each);
// silu(gate) · up or gelu_tanh(gate) · up (elementwise.cu's glu). The
// kernels interleave the two segments' rows: virtual row 2c is gate row c
// and 2c + 1 up row c (seg_of), neighbouring warps of one block for the
// dense kernels (the host keeps W ≤ 4), one warp's row quad for the
// grouped ones (gemv_grouped.cu's Quad), a stage's rows for the streamed.
#define GLU_SEGS_SILU 3
#define GLU_SEGS_GELU_TANH 4

__device__ __forceinline__ bool glu_segs(const GemvSegs& sg) {
    return sg.glu >= GLU_SEGS_SILU;
}

// The kernels walk a glu launch's rows in pairs, virtual row 2c being gate
// c and 2c + 1 up c, so that both rows of a pair land in one warp (grouped
// formats: rows of a quad) or one block (dense: neighbouring warps). The
// weight (and bias) row of virtual row v of an m-row job:
__device__ __forceinline__ u32 glu_row(const GemvSegs& sg, u32 m, u32 v) {
    return sg.glu == GLU_SWIGLU_HALVES ? (v >> 1) + (v & 1u) * (m / 2) : v;
}

// The activation of one (gate, up) pair, biases already added.
__device__ __forceinline__ float glu_value(const GemvSegs& sg, float g, float u) {
    if (sg.glu == GLU_SWIGLU_HALVES || sg.glu == GLU_SEGS_SILU) return silu(g) * u;
    if (sg.glu == GLU_SEGS_GELU_TANH) return gelu_tanh(g) * u;
    g = fminf(g, sg.glu_limit);
    u = fminf(fmaxf(u, -sg.glu_limit), sg.glu_limit);
    return (u + 1.0f) * (g / (1.0f + expf(-g * sg.glu_alpha)));
}

// Eight consecutive weights from index i (a multiple of 8) in one or two
// 16-byte loads, widened to f32.
__device__ __forceinline__ void load_w8(const void* w, int dt, u64 i, float* o) {
    if (dt == DT_F32) {
        const float4 a = ((const float4*)w)[i / 4], b = ((const float4*)w)[i / 4 + 1];
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
        o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
        return;
    }
    const uint4 r = ((const uint4*)w)[i / 8];
    const u32 q[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (dt == DT_BF16) {
            o[2 * j] = __uint_as_float(q[j] << 16);
            o[2 * j + 1] = __uint_as_float(q[j] & 0xffff0000u);
        } else {
            o[2 * j] = f16_to_f32((u16)(q[j] & 0xffffu));
            o[2 * j + 1] = f16_to_f32((u16)(q[j] >> 16));
        }
    }
}

// A fused RMSNorm's factor r = 1 / sqrt(mean(x²) + eps) (norm.cu's
// formula; the sum's order differs, so results match its up to rounding),
// in two halves around a barrier the kernel has anyway: before it, each
// warp's part of Σ x² (from each thread's `ss`) goes to shared memory;
// after it, every thread sums the parts, and block (0, 0) writes the
// normed row w · (x · r) (norm.cu's order) where the launch asks for it.
__device__ __forceinline__ void norm_part(float ss, float* parts) {
    ss = warp_sum(ss);
    if ((threadIdx.x & 31u) == 0) parts[threadIdx.x >> 5] = ss;
}

// `warps`: the warps that wrote parts (the first ones of the block), all of
// which call this.
__device__ __forceinline__ float norm_factor(const GemvSegs& sg, const float* parts, u32 warps,
                                             u32 k, const float* x) {
    float ss = 0.0f;
    for (u32 w = 0; w < warps; w++) ss += parts[w];
    const float r = 1.0f / sqrtf(ss / (float)k + sg.eps);
    if (sg.normed && blockIdx.x == 0 && blockIdx.y == 0) {
        for (u32 i = threadIdx.x; i < k; i += 32 * warps) {
            sg.normed[i] = load_w(sg.norm, sg.norm_dt, i) * (x[i] * r);
        }
    }
    return r;
}

// What a product s (the row's sum before the norm factor r; 1 without a
// fused norm) becomes: s · r + bias, in that order (the CPU's linear).
__device__ __forceinline__ float out_value(float s, float r, const void* bias, int bias_dt,
                                           u64 bias_at) {
    float v = s * r;
    if (bias) v += load_w(bias, bias_dt, bias_at);
    return v;
}

// What the row's first lane writes: out_value, plus what out held with
// `accumulate` (the CPU's linear, then add).
__device__ __forceinline__ void store_out(float* out, float s, float r, const void* bias,
                                          int bias_dt, u64 bias_at, bool accumulate) {
    float v = out_value(s, r, bias, bias_dt, bias_at);
    if (accumulate) v += *out;
    *out = v;
}

// arr[i] for i < GEMV_MAX_SEGS with constant indices only: indexing the
// by-value parameter struct with a variable would copy it to local memory.
template <class T>
__device__ __forceinline__ T pick(const T (&arr)[GEMV_MAX_SEGS], u32 i) {
    return i == 0 ? arr[0] : i == 1 ? arr[1] : arr[2];
}

// The segment holding virtual row `v` (segments padded to `align` rows)
// and the row within it; false past the last segment. GLU_SEGS launches
// interleave their two segments' rows (`align` aside).
__device__ __forceinline__ bool seg_of(const GemvSegs& sg, u32 v, u32 align, u32& seg, u32& r) {
    if (glu_segs(sg)) {
        seg = v & 1u;
        r = v >> 1;
        return r < sg.m[0];
    }
#pragma unroll
    for (u32 i = 0; i < GEMV_MAX_SEGS; i++) {
        if (i < sg.count) {
            const u32 span = (sg.m[i] + align - 1) / align * align;
            if (v < span) {
                seg = i;
                r = v;
                return true;
            }
            v -= span;
        }
    }
    return false;
}

#define GEMV_ARGS \
    GemvSegs sg, const float *x, int bias_dt, const int *experts, u32 nx, u32 x_div, u32 k, u32 wpr
#define GEMV_PASS sg, x, bias_dt, experts, nx, x_div, k, wpr

// Each kernel twice: `_x1` for one row of x (decode; its accumulators fit
// in registers with room for `minb` blocks per SM, which keeps enough weight
// bytes in flight), and the plain name for up to GEMV_MAX_X rows.
#define GEMV_KERNELS(name, body, T, minb)                                                        \
    extern "C" __global__ void __launch_bounds__(256, minb) name##_x1(GEMV_ARGS) {              \
        body<1, T>(GEMV_PASS);                                                                   \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(256, 2) name(GEMV_ARGS) {                      \
        body<GEMV_MAX_X, T>(GEMV_PASS);                                                          \
    }
