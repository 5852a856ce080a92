//! The bounds the GPU tests hold the CUDA backend to against the CPU
//! reference.
//!
//! Each is a max |Δ| / rms(reference) over one output:
//! - copies (embed, row, add, scale, KV store contents): exact;
//! - f32 paths (norm, activations, RoPE, GEMV, attention, MoE decode): 1e-4,
//!   also for the keys the fused RoPE + KV write stores (rotated); the
//!   fused op equals the CUDA backend's separate RoPE and KV write bit for
//!   bit. Attention over a bf16 store too, where both stores got the same
//!   rows (both round to nearest even: the same bf16 values): its
//!   tensor-core decode forms carry 16 bits of q and of each softmax
//!   weight (hi + lo bf16 parts), a few 1e-5 of the rms at most
//!   (tests/emulate/mma_tile.cpp: ≤ 2.2e-5 of the rms against f64);
//! - keys each backend rotated itself, then stored in bf16: 2e-2. The two
//!   rotations differ in the last f32 bits, and where that straddles a
//!   bf16 rounding boundary the stored keys differ by one bf16 ulp (2⁻⁸ of
//!   the value; values up to ~2.5 times the rms). Attention over such
//!   stores: 1e-3. A key value one ulp off moves its score by about
//!   2⁻⁸ · |q_i k_i| · scale ≲ 5e-4 and the output by that fraction of the
//!   key's weight; an indexing or rounding fault is ≥ 1e-2;
//! - GEMVs of the grouped formats on one row of x in `Precision::Bf16`,
//!   which round x per 32 values to integer codes of step amax / X_MAX:
//!   int8/int4 weights (X_MAX 127): 3e-2. Uniform x has a rounding error
//!   of rms ≈ (1/127)/√12 ≈ 2.3e-3 of its group max, ≈ 4e-3 of its own
//!   rms, and each output is off by about that fraction of the rms; the
//!   largest of ~100 outputs ≈ 3.5 times that, ~1.4e-2. MXFP4 (int16 x,
//!   X_MAX 32767): 256 times less, 1e-3 (MoE decode on MXFP4 experts
//!   rounds the input and the activations: the same bound). In
//!   `Precision::F32` these GEMVs are f32 (1e-4);
//! - f32 GEMMs of `linear` (≥ 4 rows, f32 and f16 weights): 1e-3, covering
//!   cuBLAS's accumulation order;
//! - bf16 GEMMs of `linear` (≥ 4 rows; bf16, MXFP4, int8, int4 weights):
//!   2e-2. x is rounded to bf16 (unit roundoff u = 2⁻⁸; int8/int4 weights
//!   too), an independent relative error of rms ≈ u/√6 ≈ 1.6e-3 per
//!   product, so each output is off by ≈ 1.6e-3 (2.3e-3 with rounded
//!   weights) of the rms and the largest of 10⁴ outputs by ≈ 4.5 times
//!   that, ~1e-2. MXFP4's heavy-tailed values push it further: a host
//!   simulation of these shapes measured at most 1.6e-2 over 400 draws.
//!   Structural faults (a missing bias, a wrong row) are ≥ 0.1;
//! - the grouped MoE path (≥ 4 rows): 5e-2. x and the activations are each
//!   rounded to bf16 and the activation multiplies two rounded products,
//!   so errors are about twice the single GEMM's; simulated at most 3e-2
//!   over 4800 draws of these shapes, while a missing bias or a wrong
//!   expert gives ≥ 0.4.
//!

use turbospark_cuda::gemm::XType;
use turbospark_cuda::{Cuda, CudaWeight, Precision, WeightData};

pub const F32_TOL: f32 = 1e-4;
pub const KEY_BF16_TOL: f32 = 2e-2;
pub const ATTN_BF16_KEYS_TOL: f32 = 1e-3;
pub const GEMM_F32_TOL: f32 = 1e-3;
pub const GEMM_BF16_TOL: f32 = 2e-2;
pub const MOE_GROUPED_TOL: f32 = 5e-2;
pub const GEMV_INT8_X_TOL: f32 = 3e-2;
pub const GEMV_INT16_X_TOL: f32 = 1e-3;

/// The bound of `linear` (or `linear_add`) on `n` rows of x with `w`: the
/// GEMVs' below 4 rows, the GEMMs' (f32 or bf16 operands) from 4 on.
pub fn linear_tol(g: &Cuda, w: &CudaWeight, n: usize) -> f32 {
    match (n < 4, XType::of(w)) {
        (true, _) => gemv_tol(g, w, n),
        (false, XType::F32) => GEMM_F32_TOL,
        (false, XType::Bf16) => GEMM_BF16_TOL,
    }
}

/// The bound of a GEMV on `n` < 4 rows of x (see above).
pub fn gemv_tol(g: &Cuda, w: &CudaWeight, n: usize) -> f32 {
    match (&w.data, n == 1 && g.precision() == Precision::Bf16) {
        (WeightData::Mxfp4 { .. }, true) => GEMV_INT16_X_TOL,
        (WeightData::Quantized { .. }, true) => GEMV_INT8_X_TOL,
        _ => F32_TOL,
    }
}
