//! The CUDA backend's mixture-of-experts against the CPU reference: `moe`
//! (the per-token GEMV jobs of decode and the grouped prefill path, every
//! routing mode and activation, MXFP4 and bf16 experts) and
//! `rms_norm_moe` (the whole block, routed in one launch for a decode
//! row). Both backends get the same weight bytes. Tolerances:
//! `common/tolerances.rs`.
//!
//! Without a CUDA device each test prints "skipped: no CUDA device" and
//! passes.

use turbospark_backend::{Backend, Experts, MoeParams};
use turbospark_cpu::{Cpu, CpuWeight};
use turbospark_cuda::{Cuda, CudaWeight, Precision};
use turbospark_format::{DType, ExpertAct, Routing};

mod common;

use common::*;

/// gpt-oss's expert activation.
const CLAMPED: ExpertAct = ExpertAct::ClampedSwiGlu {
    alpha: 1.702,
    limit: 7.0,
};

fn params(
    num_experts: usize,
    top_k: usize,
    width: usize,
    routing: Routing,
    act: ExpertAct,
) -> MoeParams {
    MoeParams {
        num_experts,
        top_k,
        width,
        routing,
        act,
    }
}

/// One layer's experts `[experts, 2·width, hidden]` / `[experts, hidden,
/// width]` on both backends, with a bf16 gate_up bias and an f32 down bias
/// when `biases`. MXFP4 experts get scales 2^−5 ..= 2^−4: outputs of a
/// magnitude at which the biases matter, and no 2^7 spread of row scales
/// (which would inflate the bf16 paths' max |Δ| / rms; see the header).
struct ExpertSet {
    gate_up: (CpuWeight, CudaWeight),
    down: (CpuWeight, CudaWeight),
    gate_up_bias: Option<(CpuWeight, CudaWeight)>,
    down_bias: Option<(CpuWeight, CudaWeight)>,
}

impl ExpertSet {
    fn new(g: &Cuda, rng: &mut Rng, mx: bool, shape: [usize; 3], biases: bool) -> Self {
        let [experts, hidden, width] = shape;
        let (gate_up, down) = if mx {
            (
                mxfp4_scaled(g, rng, &[experts, 2 * width], hidden, 122..=123),
                mxfp4_scaled(g, rng, &[experts, hidden], width, 122..=123),
            )
        } else {
            (
                weight(
                    g,
                    &rng.vec(experts * 2 * width * hidden, 0.3),
                    &[experts, 2 * width, hidden],
                    DType::BF16,
                ),
                weight(
                    g,
                    &rng.vec(experts * hidden * width, 0.3),
                    &[experts, hidden, width],
                    DType::BF16,
                ),
            )
        };
        let gate_up_bias = biases.then(|| {
            weight(
                g,
                &rng.vec(experts * 2 * width, 0.5),
                &[experts, 2 * width],
                DType::BF16,
            )
        });
        let down_bias = biases.then(|| {
            weight(
                g,
                &rng.vec(experts * hidden, 0.5),
                &[experts, hidden],
                DType::F32,
            )
        });
        ExpertSet {
            gate_up,
            down,
            gate_up_bias,
            down_bias,
        }
    }

    fn cpu(&self) -> Experts<'_, CpuWeight> {
        Experts {
            gate_up: &self.gate_up.0,
            gate_up_bias: self.gate_up_bias.as_ref().map(|b| &b.0),
            down: &self.down.0,
            down_bias: self.down_bias.as_ref().map(|b| &b.0),
        }
    }

    fn gpu(&self) -> Experts<'_, CudaWeight> {
        Experts {
            gate_up: &self.gate_up.1,
            gate_up_bias: self.gate_up_bias.as_ref().map(|b| &b.1),
            down: &self.down.1,
            down_bias: self.down_bias.as_ref().map(|b| &b.1),
        }
    }
}

/// One `moe` call on both backends with random x and router logits; the
/// experts in `never` get logits far below every other, so no row selects
/// them. Fewer than 4 rows run the per-token GEMV jobs (f32 tolerance),
/// more the grouped bf16 GEMMs.
fn moe_case(
    g: &Cuda,
    rng: &mut Rng,
    set: &ExpertSet,
    p: &MoeParams,
    rows: usize,
    never: &[usize],
    what: &str,
) {
    let (experts, hidden) = (p.num_experts, set.gate_up.0.cols());
    let mut logits = rng.vec(rows * experts, 3.0);
    for r in 0..rows {
        for &e in never {
            logits[r * experts + e] = -30.0;
        }
    }
    let (cx, gx) = tensors(g, &rng.vec(rows * hidden, 1.0), rows, hidden);
    let (cl, gl) = tensors(g, &logits, rows, experts);
    let (mut c, mut o) = (Cpu.tensor(rows, hidden), g.tensor(rows, hidden));
    Cpu.moe(&cx, &cl, &set.cpu(), p, &mut c);
    g.moe(&gx, &gl, &set.gpu(), p, &mut o);
    // The per-token jobs (< 4 rows) are GEMVs on one row each.
    let tol = match (g.precision(), rows < 4) {
        (_, true) => gemv_tol(g, &set.gate_up.1, 1),
        (Precision::F32, false) => F32_TOL,
        (Precision::Bf16, false) => MOE_GROUPED_TOL,
    };
    check(&format!("moe {what} {p:?} rows={rows}"), g, &o, &c, tol);
    // The sum is added to what `out` holds (the residual stream): a second
    // call doubles it.
    Cpu.moe(&cx, &cl, &set.cpu(), p, &mut c);
    g.moe(&gx, &gl, &set.gpu(), p, &mut o);
    check(
        &format!("moe {what} {p:?} rows={rows}, twice"),
        g,
        &o,
        &c,
        tol,
    );
}

#[test]
fn moe_routing_modes_activations_and_formats() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(11);
    let (experts, hidden, width) = (8, 64, 32);
    let routings = [
        Routing::TopKSoftmax,
        Routing::SoftmaxTopK { renormalize: false },
        Routing::SoftmaxTopK { renormalize: true },
    ];
    let acts = [ExpertAct::SwiGlu, CLAMPED];
    for mx in [false, true] {
        for biases in [false, true] {
            let set = ExpertSet::new(&g, &mut rng, mx, [experts, hidden, width], biases);
            for (routing, act, top_k) in [
                (routings[0], acts[1], 4),
                (routings[1], acts[0], 2),
                (routings[2], acts[0], 3),
                (routings[2], acts[1], 1),
            ] {
                let p = params(experts, top_k, width, routing, act);
                for precision in [Precision::Bf16, Precision::F32] {
                    g.set_precision(precision);
                    for rows in [1, 3, 5, 33] {
                        let what = format!("mxfp4={mx} biases={biases} {precision:?}");
                        moe_case(&g, &mut rng, &set, &p, rows, &[], &what);
                    }
                }
            }
        }
    }
}

/// The grouped (prefill) path on 37 rows: 12 experts, one of which no row
/// selects (an expert with no rows is skipped) while the others get
/// different row counts; top-2 and top-4; both routing orders (and
/// renormalisation); both activations; MXFP4 and bf16 experts with biases.
/// The bf16 experts have sizes that are not multiples of 8 (36 × 20), so
/// expert slices and gathered row blocks start at addresses cuBLAS cannot
/// read with 16-byte vectors.
#[test]
fn moe_grouped_prefill_by_expert() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(23);
    let experts = 12;
    for (mx, hidden, width) in [(true, 96, 64), (false, 36, 20)] {
        let set = ExpertSet::new(&g, &mut rng, mx, [experts, hidden, width], true);
        for (routing, act, top_k) in [
            (Routing::TopKSoftmax, CLAMPED, 4),
            (Routing::TopKSoftmax, ExpertAct::SwiGlu, 2),
            (
                Routing::SoftmaxTopK { renormalize: true },
                ExpertAct::SwiGlu,
                4,
            ),
            (Routing::SoftmaxTopK { renormalize: false }, CLAMPED, 2),
        ] {
            let p = params(experts, top_k, width, routing, act);
            moe_case(&g, &mut rng, &set, &p, 37, &[5], &format!("mxfp4={mx}"));
        }
    }
}

/// `rms_norm_moe` (the whole block on the residual stream) on both
/// backends. One row takes `moe_norm_route` (norm, router and routing in
/// one launch, one block a router row, the last block to finish routing)
/// where the router is bf16 or f16: gpt-oss-20b's shape with MXFP4 experts
/// and a router bias (32 blocks), 128 experts, 16 experts of 24 values, 8
/// experts with an f16 router. An f32 router, a row wider than the kernel
/// holds (4,104) and 3 rows take the router GEMV and `moe`. x is the
/// residual stream: a second call adds the experts' share of the new x.
/// Every launch after the first finds the ticket its predecessor reset.
#[test]
fn norm_routed_moe_equals_the_cpus() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(31);
    let renorm = Routing::SoftmaxTopK { renormalize: true };
    for (mx, [experts, hidden, width], rdt, bias, routing, act, top_k) in [
        (
            true,
            [32, 2880, 64],
            DType::BF16,
            true,
            Routing::TopKSoftmax,
            CLAMPED,
            4,
        ),
        (
            false,
            [8, 64, 32],
            DType::F16,
            false,
            renorm,
            ExpertAct::SwiGlu,
            2,
        ),
        (
            false,
            [16, 24, 8],
            DType::BF16,
            true,
            Routing::TopKSoftmax,
            ExpertAct::SwiGlu,
            1,
        ),
        (
            false,
            [128, 1024, 16],
            DType::BF16,
            false,
            renorm,
            ExpertAct::SwiGlu,
            8,
        ),
        (
            false,
            [8, 64, 32],
            DType::F32,
            true,
            Routing::TopKSoftmax,
            CLAMPED,
            2,
        ),
        (
            false,
            [4, 4104, 8],
            DType::BF16,
            false,
            renorm,
            ExpertAct::SwiGlu,
            2,
        ),
    ] {
        let set = ExpertSet::new(&g, &mut rng, mx, [experts, hidden, width], false);
        let norm = weight(&g, &rng.vec(hidden, 1.0), &[hidden], DType::BF16);
        let router = weight(&g, &rng.vec(experts * hidden, 0.3), &[experts, hidden], rdt);
        let router_bias = bias.then(|| weight(&g, &rng.vec(experts, 0.5), &[experts], DType::F32));
        let p = params(experts, top_k, width, routing, act);
        for precision in [Precision::Bf16, Precision::F32] {
            g.set_precision(precision);
            for rows in [1, 3] {
                let (mut c, mut o) = tensors(&g, &rng.vec(rows * hidden, 1.0), rows, hidden);
                let tol = gemv_tol(&g, &set.gate_up.1, 1);
                for call in ["once", "twice"] {
                    Cpu.rms_norm_moe(
                        &mut c,
                        &norm.0,
                        1e-5,
                        (&router.0, router_bias.as_ref().map(|b| &b.0)),
                        &set.cpu(),
                        &p,
                    );
                    g.rms_norm_moe(
                        &mut o,
                        &norm.1,
                        1e-5,
                        (&router.1, router_bias.as_ref().map(|b| &b.1)),
                        &set.gpu(),
                        &p,
                    );
                    let what = format!(
                        "rms_norm_moe {experts}x{hidden} {rdt:?} {p:?} {precision:?} rows={rows} {call}"
                    );
                    check(&what, &g, &o, &c, tol);
                }
            }
        }
    }
}
