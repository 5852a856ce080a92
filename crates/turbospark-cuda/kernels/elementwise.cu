// Element-wise kernels over f32 activations: embedding lookup, residual add,
// scale, softcap, gated activations and bias rows. One thread per element
// (grid-stride). Formulas and evaluation order follow the CPU backend
// (crates/turbospark-cpu/src/ops.rs) so results differ by libm ulps only.

// out[r, c] = table[tokens[r], c] for a [vocab, d] table of dtype `dt`.
extern "C" __global__ void embed(float* out, const void* table, int dt, const u32* tokens,
                                 u32 rows, u32 d) {
    pdl_enter();
    FOR_EACH(i, (u64)rows * d) {
        u64 r = i / d, c = i % d;
        out[i] = load_w(table, dt, (u64)tokens[r] * d + c);
    }
}

extern "C" __global__ void add_inplace(float* x, const float* y, u64 n) {
    pdl_enter();
    FOR_EACH(i, n) x[i] += y[i];
}

extern "C" __global__ void scale_inplace(float* x, float s, u64 n) {
    pdl_enter();
    FOR_EACH(i, n) x[i] *= s;
}

// cap · tanh(x / cap).
extern "C" __global__ void softcap_inplace(float* x, float cap, u64 n) {
    pdl_enter();
    FOR_EACH(i, n) x[i] = cap * tanhf(x[i] / cap);
}

// out = act(gate) * up; act 0 = silu, 1 = gelu_tanh.
extern "C" __global__ void glu(float* out, const float* gate, const float* up, u64 n, int act) {
    pdl_enter();
    FOR_EACH(i, n) {
        float g = gate[i];
        out[i] = (act == 0 ? silu(g) : gelu_tanh(g)) * up[i];
    }
}

// out[r, c] += bias[c] for out [rows, cols], bias of dtype `dt`.
extern "C" __global__ void add_bias(float* out, const void* bias, int dt, u32 rows, u32 cols) {
    pdl_enter();
    FOR_EACH(i, (u64)rows * cols) out[i] += load_w(bias, dt, i % cols);
}
