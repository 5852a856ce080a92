//! Mixture-of-experts on the device, with no host round trip: routing
//! (kernels/moe.cu) writes each token's selected (expert, weight) pairs
//! sorted by expert; the expert matvecs are GEMV jobs, one per (token,
//! selected expert), that read the expert index from device memory; the
//! activation and the weighted sum follow.
//!
//! Numerics and order are the CPU's (crates/turbospark-cpu/src/moe.rs):
//! each expert output includes its down bias before it is weighted, and a
//! token's weighted outputs are summed from zero in ascending expert index.
//!
//! Prefill runs the same per-token jobs, so every job reads its expert's
//! whole matrices: correct, but a grouped GEMM (tokens gathered per expert)
//! is the faster path still to write. This module must not synchronise
//! with the host.

use turbospark_backend::{Experts, MoeParams};
use turbospark_format::{ExpertAct, Routing};

use crate::kernels::{Arg, BLOCK, grid_for};
use crate::linear::{GemvJob, gemv};
use crate::weight::CudaWeight;
use crate::{Cuda, CudaTensor};

/// Most experts a token may select (the routing kernel's arrays).
pub const MAX_TOP_K: usize = 32;

pub fn moe(
    be: &Cuda,
    x: &CudaTensor,
    logits: &CudaTensor,
    ex: &Experts<'_, CudaWeight>,
    p: &MoeParams,
    out: &mut CudaTensor,
) {
    let (n, hidden, w, top_k, experts) = (x.rows, x.cols, p.width, p.top_k, p.num_experts);
    assert_eq!(
        (logits.rows, logits.cols),
        (n, experts),
        "moe: router logits are not [{n}, {experts}]"
    );
    assert_eq!(
        (out.rows, out.cols),
        (n, hidden),
        "moe: out is not [{n}, {hidden}]"
    );
    assert!(
        top_k > 0 && top_k <= experts.min(MAX_TOP_K),
        "moe: top_k {top_k} of {experts} experts"
    );
    assert_eq!(
        (ex.gate_up.rows(), ex.gate_up.cols()),
        (experts * 2 * w, hidden),
        "moe: gate_up is not [{experts}, 2·{w}, {hidden}]"
    );
    assert_eq!(
        (ex.down.rows(), ex.down.cols()),
        (experts * hidden, w),
        "moe: down is not [{experts}, {hidden}, {w}]"
    );
    assert!(w > 0, "moe: experts of width 0");
    if n == 0 || hidden == 0 {
        return;
    }
    let jobs = n * top_k;
    let sel_e = be.scratch::<i32>(jobs);
    let sel_w = be.scratch::<f32>(jobs);
    let mode = match p.routing {
        Routing::TopKSoftmax => 0,
        Routing::SoftmaxTopK { renormalize: false } => 1,
        Routing::SoftmaxTopK { renormalize: true } => 2,
    };
    be.launch(
        &be.k.moe_route,
        ((n as u32).div_ceil(128), 1, 1),
        128,
        &[
            Arg::Ptr(be.ptr(&sel_e)),
            Arg::Ptr(be.ptr(&sel_w)),
            Arg::Ptr(be.ptr(&logits.data)),
            Arg::U32(n as u32),
            Arg::U32(experts as u32),
            Arg::U32(top_k as u32),
            Arg::I32(mode),
        ],
    );

    let gu = be.scratch::<f32>(jobs * 2 * w);
    gemv(
        be,
        ex.gate_up,
        ex.gate_up_bias,
        &GemvJob {
            out: be.ptr(&gu),
            x: be.ptr(&x.data),
            experts: be.ptr(&sel_e),
            jobs: jobs as u32,
            nx: 1,
            x_div: top_k as u32,
            k: hidden as u32,
            m: (2 * w) as u32,
        },
    );

    let act = be.scratch::<f32>(jobs * w);
    let (code, alpha, limit) = match p.act {
        ExpertAct::SwiGlu => (0, 0.0, 0.0),
        ExpertAct::ClampedSwiGlu { alpha, limit } => (1, alpha, limit),
    };
    let n_act = (jobs * w) as u64;
    be.launch(
        &be.k.moe_act,
        grid_for(n_act),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&act)),
            Arg::Ptr(be.ptr(&gu)),
            Arg::U32(jobs as u32),
            Arg::U32(w as u32),
            Arg::I32(code),
            Arg::F32(alpha),
            Arg::F32(limit),
        ],
    );

    let y = be.scratch::<f32>(jobs * hidden);
    gemv(
        be,
        ex.down,
        ex.down_bias,
        &GemvJob {
            out: be.ptr(&y),
            x: be.ptr(&act),
            experts: be.ptr(&sel_e),
            jobs: jobs as u32,
            nx: 1,
            x_div: 1,
            k: w as u32,
            m: hidden as u32,
        },
    );

    let n_out = (n * hidden) as u64;
    be.launch(
        &be.k.moe_combine,
        grid_for(n_out),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&out.data)),
            Arg::Ptr(be.ptr(&y)),
            Arg::Ptr(be.ptr(&sel_w)),
            Arg::U32(n as u32),
            Arg::U32(top_k as u32),
            Arg::U32(hidden as u32),
        ],
    );
}
