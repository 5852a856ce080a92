//! What the KV-store test binaries (`parity_kv.rs`, `parity_step.rs`)
//! share: both store dtypes, a RoPE table, the store check and its
//! bounds, and a recorded decode step's one-row inputs.

use turbospark_backend::{AttnParams, Backend, KvDtype, KvSpec, RopeTable};
use turbospark_cpu::{Cpu, CpuKv, CpuTensor};
use turbospark_cuda::{Cuda, CudaBatch, CudaKv, CudaTensor};
use turbospark_format::AttnSpan;

use super::*;

/// Both store dtypes.
pub const KV_DTYPES: [KvDtype; 2] = [KvDtype::F32, KvDtype::Bf16];

/// A RoPE table of `pairs` frequencies (fewer than head_dim / 2 leaves the
/// last pairs unrotated) and attention factor `factor`.
pub fn rope_table(head_dim: usize, pairs: usize, factor: f32) -> RopeTable {
    RopeTable {
        inv_freq: (0..pairs)
            .map(|i| 10000f32.powf(-((2 * i) as f32) / head_dim as f32))
            .collect(),
        attention_factor: factor,
    }
}

/// Each value's bits, for comparisons that must be exact (NaN and -0 too).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The CUDA store holds what the CPU's does: slot positions and values
/// exactly, keys (rotated) within RoPE's tolerance, or one bf16 ulp in a
/// bf16 store (`KEY_BF16_TOL`).
pub fn check_store(what: &str, g: &Cuda, gkv: &CudaKv, ckv: &CpuKv) {
    let (k, v, pos) = gkv.to_host(g);
    assert_eq!(pos, ckv.slot_pos, "{what}: slot positions");
    assert_eq!(bits(&v), bits(&ckv.v.to_f32()), "{what}: values");
    let err = rel_err(&k, &ckv.k.to_f32());
    let tol = keys_tol(gkv.spec.dtype);
    assert!(err <= tol, "{what}: keys max|Δ|/rms = {err} > {tol}");
}

/// The bound on keys each backend rotated itself, as stored.
pub fn keys_tol(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::F32 => F32_TOL,
        KvDtype::Bf16 => KEY_BF16_TOL,
    }
}

/// The bound on attention over keys each backend rotated itself.
pub fn rotated_attention_tol(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::F32 => F32_TOL,
        KvDtype::Bf16 => ATTN_BF16_KEYS_TOL,
    }
}

/// Eight query heads of 64 over two KV heads (one GQA group of four).
pub fn eight_heads_over_two(span: AttnSpan, softcap: Option<f32>) -> AttnParams {
    AttnParams {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        span,
        softcap,
    }
}

/// Both backends' stores of `spec`, and the GPU's one-row q, k, v and
/// batch (position 0) that a recorded decode step reads.
pub fn one_row(g: &Cuda, spec: KvSpec, q_dim: usize) -> (CpuKv, CudaKv, QkvRow, CudaBatch) {
    let kv = spec.kv_dim;
    let row = (g.tensor(1, q_dim), g.tensor(1, kv), g.tensor(1, kv));
    let kvs = (Cpu.kv_alloc(spec).unwrap(), g.kv_alloc(spec).unwrap());
    (kvs.0, kvs.1, row, g.batch(&[0], &[0]))
}

/// A decode row's q, k and v on the GPU.
pub type QkvRow = (CudaTensor, CudaTensor, CudaTensor);

/// A recorded step's next inputs: random q, k and v rows (values within
/// ±`scale`) copied into the tensors the recording reads, and the CPU's
/// copies of them.
pub fn next_step_inputs(
    g: &Cuda,
    rng: &mut Rng,
    (gq, gk, gv): (&mut CudaTensor, &mut CudaTensor, &mut CudaTensor),
    scale: f32,
) -> (CpuTensor, CpuTensor, CpuTensor) {
    let mut next = |t: &mut CudaTensor| {
        let (c, d) = tensors(g, &rng.vec(t.cols, scale), 1, t.cols);
        g.copy(&d, t);
        c
    };
    (next(gq), next(gk), next(gv))
}
