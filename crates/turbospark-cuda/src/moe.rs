//! Mixture-of-experts on the device: routing (kernels/moe.cu) writes each
//! token's selected (expert, weight) pairs sorted by expert; the expert
//! products run in one of two ways, with the activation between them; the
//! weighted sum follows. A decode row's whole block ([`rms_norm_moe`])
//! routes in one launch from the residual stream: norm, router and
//! selection (`moe_norm_route`).
//!
//! - Decode (fewer than [`GEMM_MIN_ROWS`] rows, while a graph is being
//!   recorded, or in `Precision::F32`): GEMV jobs, one per (token, selected
//!   expert), that read the expert index from device memory; the gate_up
//!   GEMV writes the activation of its gate/up pairs, not the pairs. No host
//!   round trip.
//! - Prefill (grouped, `Precision::Bf16`): the selected expert ids are copied to the host (the
//!   layer's one synchronisation), which lists each expert's (token, slot)
//!   pairs; each expert's token rows are gathered into one contiguous block
//!   and its gate_up and down run as cuBLAS GEMMs ([`gemm_rows`]), so each
//!   expert's weights are read (and, for MXFP4, dequantised to bf16) once
//!   per layer rather than once per token. Operands are bf16 for bf16 and
//!   MXFP4 experts (x and the activations rounded once to bf16, f32
//!   accumulation), as in `linear`'s GEMM path.
//!
//! Numerics and order are the CPU's (crates/turbospark-cpu/src/moe.rs):
//! biases are added before the activation and before the weighting, and a
//! token's weighted outputs are summed from zero in ascending expert index,
//! and the sum is added to `out` (the residual stream).

use turbospark_backend::{Backend, Experts, MoeParams, rms_norm_moe_parts};
use turbospark_format::{ExpertAct, Routing};

use cudarc::driver::CudaSlice;

use crate::gemm::{XType, gemm_rows, weight_scratch};
use crate::gemv::{GemvEdges, GemvGlu, GemvJob, gemv};
use crate::kernels::{Arg, BLOCK, grid_for};
use crate::linear::GEMM_MIN_ROWS;
use crate::weight::{CudaWeight, Dense, WeightData};
use crate::{Cuda, CudaTensor, Precision};

/// Most experts a token may select (one lane of the routing warp each).
pub const MAX_TOP_K: usize = 32;

pub fn moe(
    be: &Cuda,
    x: &CudaTensor,
    logits: &CudaTensor,
    ex: &Experts<'_, CudaWeight>,
    p: &MoeParams,
    out: &mut CudaTensor,
) {
    let (n, hidden, top_k, experts) = (x.rows, x.cols, p.top_k, p.num_experts);
    assert_eq!(
        (logits.rows, logits.cols),
        (n, experts),
        "moe: router logits are not [{n}, {experts}]"
    );
    check(x, ex, p, out);
    if n == 0 || hidden == 0 {
        return;
    }
    let jobs = n * top_k;
    let sel_e = be.scratch::<i32>(jobs);
    let sel_w = be.scratch::<f32>(jobs);
    be.launch(
        &be.k.moe_route,
        // One warp a token.
        ((n as u32).div_ceil(4), 1, 1),
        128,
        &[
            Arg::Ptr(be.ptr(&sel_e)),
            Arg::Ptr(be.ptr(&sel_w)),
            Arg::Ptr(be.ptr(&logits.data)),
            Arg::U32(n as u32),
            Arg::U32(experts as u32),
            Arg::U32(top_k as u32),
            Arg::I32(routing_mode(p.routing)),
        ],
    );
    if n >= GEMM_MIN_ROWS && !be.recording() && be.precision() == Precision::Bf16 {
        grouped(be, x, ex, p, &sel_e, &sel_w, out);
    } else {
        per_token(be, x, ex, p, &sel_e, &sel_w, out);
    }
}

/// The shapes `moe` needs of x, the experts and `out`.
fn check(x: &CudaTensor, ex: &Experts<'_, CudaWeight>, p: &MoeParams, out: &CudaTensor) {
    let (n, hidden, w, top_k, experts) = (x.rows, x.cols, p.width, p.top_k, p.num_experts);
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
    assert!(
        n * top_k <= i32::MAX as usize,
        "moe: {n} rows × top-{top_k} exceed the kernels' int"
    );
}

/// moe_route's `mode` argument (kernels/moe.cu).
fn routing_mode(r: Routing) -> i32 {
    match r {
        Routing::TopKSoftmax => 0,
        Routing::SoftmaxTopK { renormalize: false } => 1,
        Routing::SoftmaxTopK { renormalize: true } => 2,
    }
}

/// Threads of `moe_norm_route`, and the most values of x it holds a
/// thread (kernels/moe.cu: NR_WARPS, NR_HELD).
const NR_THREADS: u32 = 8 * 32;
const NR_HELD: usize = 16;
/// Router rows a `moe_norm_route` block takes: one, so the many short
/// copies of a 128-expert router finish in the shadow of the previous
/// kernel (BENCHMARKS.md, twenty-seventh session: gpt-oss-120b 374.1 ->
/// 379.8 tok/s against one cluster of 16 blocks of 8 rows, Qwen3-30B-A3B
/// 306.2 -> 311.0 with two rows a block; gpt-oss-20b level, 542.5 ->
/// 543.5, against 8 blocks of 4).
const ROUTE_ROWS: usize = 1;

/// `x += moe(rms_norm(x))`, routed by `rms_norm(x) · Rᵀ (+ rb)`. One decode
/// row whose router (bf16 or f16) rows fit in a block's shared memory
/// ([`route_geometry`]): `moe_norm_route` (sm_90) copies the router there,
/// norms the row, writes it for the experts and routes it in one launch
/// (the layer's experts then wait for one kernel, not for the router GEMV
/// and the routing), and the experts run as in [`moe`]. Otherwise
/// [`rms_norm_moe_parts`]: the router GEMV with the norm fused, then
/// [`moe`].
pub fn rms_norm_moe(
    be: &Cuda,
    x: &mut CudaTensor,
    norm: &CudaWeight,
    eps: f32,
    router: (&CudaWeight, Option<&CudaWeight>),
    ex: &Experts<'_, CudaWeight>,
    p: &MoeParams,
) {
    let Some((blocks, shared)) = fused_route(be, x, norm, router.0, p) else {
        return rms_norm_moe_parts(be, x, norm, eps, router, ex, p);
    };
    check(x, ex, p, x);
    let normed = be.empty(1, x.cols);
    let sel_e = be.scratch::<i32>(p.top_k);
    let sel_w = be.scratch::<f32>(p.top_k);
    let logits = be.scratch::<f32>(p.num_experts);
    let (norm_ptr, norm_dt) = norm.dense_ptr(be, "norm");
    let (router_ptr, router_dt) = router.0.dense_ptr(be, "router");
    let (bias_ptr, bias_dt) = router.1.map_or((0, 0), |b| b.dense_ptr(be, "router bias"));
    let args = [
        Arg::Ptr(be.ptr(&sel_e)),
        Arg::Ptr(be.ptr(&sel_w)),
        Arg::Ptr(be.ptr(&normed.data)),
        Arg::Ptr(be.ptr(&x.data)),
        Arg::Ptr(norm_ptr),
        Arg::I32(norm_dt),
        Arg::F32(eps),
        Arg::Ptr(router_ptr),
        Arg::I32(router_dt),
        Arg::Ptr(bias_ptr),
        Arg::I32(bias_dt),
        Arg::U32(x.cols as u32),
        Arg::U32(p.num_experts as u32),
        Arg::U32(p.top_k as u32),
        Arg::I32(routing_mode(p.routing)),
        Arg::Ptr(be.ptr(&logits)),
        Arg::Ptr(be.ptr(&be.route_ticket)),
    ];
    be.launch_shared(
        &be.k.moe_norm_route,
        (blocks, 1, 1),
        NR_THREADS,
        shared,
        &args,
    );
    per_token(be, &normed, ex, p, &sel_e, &sel_w, x);
}

/// `moe_norm_route`'s blocks for `experts` router rows of `hidden` values
/// ([`ROUTE_ROWS`] a block, one a warp), and each block's dynamic shared
/// memory: its rows (2 bytes a value), the normed row and the logits
/// (f32).
fn route_geometry(experts: usize, hidden: usize) -> (usize, usize) {
    let blocks = experts.div_ceil(ROUTE_ROWS).max(1);
    (
        blocks,
        experts.div_ceil(blocks) * hidden * 2 + (hidden + experts) * 4,
    )
}

/// `moe_norm_route`'s blocks and the dynamic shared memory each needs for
/// this call (its router rows, the normed row and the logits), or None
/// where it does not apply: more than one row, a router other than
/// bf16/f16 `[experts, hidden]`, a row wider than the kernel holds, or
/// more memory than a block gets.
fn fused_route(
    be: &Cuda,
    x: &CudaTensor,
    norm: &CudaWeight,
    router: &CudaWeight,
    p: &MoeParams,
) -> Option<(u32, u32)> {
    let (e, h) = (p.num_experts, x.cols);
    let two_bytes = matches!(
        router.data,
        WeightData::Dense {
            dtype: Dense::Bf16 | Dense::F16,
            ..
        }
    );
    let (blocks, bytes) = route_geometry(e, h);
    let fits = x.rows == 1
        && two_bytes
        && matches!(norm.data, WeightData::Dense { .. })
        && norm.numel() == h
        && (router.rows(), router.cols()) == (e, h)
        && h > 0
        && h.is_multiple_of(8)
        && h <= NR_HELD * NR_THREADS as usize
        && p.top_k > 0
        && p.top_k <= e.min(MAX_TOP_K)
        && bytes <= be.route_shared as usize;
    (be.fused_route && fits).then_some((blocks as u32, bytes as u32))
}

/// (code, alpha, limit) of the activation kernels' `act` arguments.
fn act_args(act: ExpertAct) -> (i32, f32, f32) {
    match act {
        ExpertAct::SwiGlu => (0, 0.0, 0.0),
        ExpertAct::ClampedSwiGlu { alpha, limit } => (1, alpha, limit),
    }
}

/// Decode: one GEMV job per (token, selected expert).
fn per_token(
    be: &Cuda,
    x: &CudaTensor,
    ex: &Experts<'_, CudaWeight>,
    p: &MoeParams,
    sel_e: &CudaSlice<i32>,
    sel_w: &CudaSlice<f32>,
    out: &mut CudaTensor,
) {
    let (n, hidden, w, top_k) = (x.rows, x.cols, p.width, p.top_k);
    let jobs = n * top_k;
    // gate_up with the activation fused into its store: [jobs, width].
    let act = be.scratch::<f32>(jobs * w);
    gemv(
        be,
        ex.gate_up,
        ex.gate_up_bias,
        be.ptr(&act),
        (2 * w) as u32,
        &GemvJob {
            x: be.ptr(&x.data),
            experts: be.ptr(sel_e),
            jobs: jobs as u32,
            nx: 1,
            x_div: top_k as u32,
            k: hidden as u32,
        },
        &GemvEdges {
            glu: Some(GemvGlu::Expert(p.act)),
            ..GemvEdges::default()
        },
    );

    let y = be.scratch::<f32>(jobs * hidden);
    gemv(
        be,
        ex.down,
        ex.down_bias,
        be.ptr(&y),
        hidden as u32,
        &GemvJob {
            x: be.ptr(&act),
            experts: be.ptr(sel_e),
            jobs: jobs as u32,
            nx: 1,
            x_div: 1,
            k: w as u32,
        },
        &GemvEdges {
            experts_settled: true,
            ..GemvEdges::default()
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
            Arg::Ptr(be.ptr(sel_w)),
            Arg::U32(n as u32),
            Arg::U32(top_k as u32),
            Arg::U32(hidden as u32),
        ],
    );
}

/// The grouped path's layout: rows of the gathered blocks ordered by expert
/// (ascending), within an expert by slot (token-major), so each expert's
/// rows are contiguous.
#[derive(Debug, PartialEq)]
struct Plan {
    /// Per expert: (first row, rows).
    spans: Vec<(usize, usize)>,
    /// Rows in all (selections of an expert in range).
    rows: usize,
    /// The kernels' index arrays, one upload: `row_token` (rows), then
    /// `row_expert` (rows), then `slot_row` (one per slot, −1 for an expert
    /// index out of range, which NaN logits can produce).
    index: Vec<i32>,
}

/// Lays out the slots `sel` (token t's k selected experts at t·k ..).
fn plan(sel: &[i32], top_k: usize, experts: usize) -> Plan {
    let valid = |e: i32| (0..experts as i32).contains(&e);
    let mut count = vec![0usize; experts];
    for &e in sel.iter().filter(|&&e| valid(e)) {
        count[e as usize] += 1;
    }
    let mut spans = Vec::with_capacity(experts);
    let mut rows = 0;
    for &c in &count {
        spans.push((rows, c));
        rows += c;
    }
    let mut index = vec![0i32; 2 * rows + sel.len()];
    let (row_token, rest) = index.split_at_mut(rows);
    let (row_expert, slot_row) = rest.split_at_mut(rows);
    let mut next: Vec<usize> = spans.iter().map(|s| s.0).collect();
    for (s, &e) in sel.iter().enumerate() {
        slot_row[s] = if valid(e) {
            let r = next[e as usize];
            next[e as usize] += 1;
            row_token[r] = (s / top_k) as i32;
            row_expert[r] = e;
            r as i32
        } else {
            -1
        };
    }
    Plan { spans, rows, index }
}

/// Prefill: tokens grouped by expert, one GEMM per expert and matrix.
fn grouped(
    be: &Cuda,
    x: &CudaTensor,
    ex: &Experts<'_, CudaWeight>,
    p: &MoeParams,
    sel_e: &CudaSlice<i32>,
    sel_w: &CudaSlice<f32>,
    out: &mut CudaTensor,
) {
    let (n, hidden, w, top_k) = (x.rows, x.cols, p.width, p.top_k);
    // The layer's one host round trip (the copy to pageable memory returns
    // when it is done): the expert ids size the GEMMs.
    let sel = be
        .stream
        .clone_dtoh(sel_e)
        .unwrap_or_else(|e| panic!("CUDA: copying the expert selection: {e}"));
    let plan = plan(&sel, top_k, p.num_experts);
    let rows = plan.rows;
    let index = be.upload_slice(&plan.index);
    let row_token = be.ptr(&index);
    let row_expert = row_token + 4 * rows as u64;
    let slot_row = row_expert + 4 * rows as u64;
    let bias = |b: Option<&CudaWeight>| b.map_or((0, 0), |b| b.dense_ptr(be, "moe bias"));

    // gate_up: x rows gathered per expert, in the GEMM's operand type.
    let xt = XType::of(ex.gate_up);
    let xe = be.scratch::<u8>(rows * hidden * xt.size());
    let n_x = (rows * hidden) as u64;
    be.launch(
        &be.k.moe_gather,
        grid_for(n_x),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&xe)),
            Arg::Ptr(be.ptr(&x.data)),
            Arg::Ptr(row_token),
            Arg::U32(rows as u32),
            Arg::U32(hidden as u32),
            Arg::I32((xt == XType::Bf16) as i32),
        ],
    );
    let gu = be.scratch::<f32>(rows * 2 * w);
    let scratch = weight_scratch(be, ex.gate_up, 2 * w);
    for (e, &(r0, count)) in plan.spans.iter().enumerate() {
        if count > 0 {
            gemm_rows(
                be,
                be.ptr(&xe) + (r0 * hidden * xt.size()) as u64,
                count,
                ex.gate_up,
                e * 2 * w,
                2 * w,
                be.ptr(&gu) + (r0 * 2 * w * 4) as u64,
                scratch.as_ref(),
            );
        }
    }
    // Freed in stream order: the down projection's scratch can reuse it.
    drop(scratch);

    // Bias + activation, written in the down GEMM's operand type.
    let at = XType::of(ex.down);
    let act = be.scratch::<u8>(rows * w * at.size());
    let (code, alpha, limit) = act_args(p.act);
    let (gub, gub_dt) = bias(ex.gate_up_bias);
    let n_act = (rows * w) as u64;
    be.launch(
        &be.k.moe_act_rows,
        grid_for(n_act),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&act)),
            Arg::Ptr(be.ptr(&gu)),
            Arg::Ptr(row_expert),
            Arg::Ptr(gub),
            Arg::I32(gub_dt),
            Arg::U32(rows as u32),
            Arg::U32(w as u32),
            Arg::I32(code),
            Arg::F32(alpha),
            Arg::F32(limit),
            Arg::I32((at == XType::Bf16) as i32),
        ],
    );

    let y = be.scratch::<f32>(rows * hidden);
    let scratch = weight_scratch(be, ex.down, hidden);
    for (e, &(r0, count)) in plan.spans.iter().enumerate() {
        if count > 0 {
            gemm_rows(
                be,
                be.ptr(&act) + (r0 * w * at.size()) as u64,
                count,
                ex.down,
                e * hidden,
                hidden,
                be.ptr(&y) + (r0 * hidden * 4) as u64,
                scratch.as_ref(),
            );
        }
    }

    // Down bias, weighting and the sum in ascending expert order.
    let (db, db_dt) = bias(ex.down_bias);
    let n_out = (n * hidden) as u64;
    be.launch(
        &be.k.moe_combine_rows,
        grid_for(n_out),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&out.data)),
            Arg::Ptr(be.ptr(&y)),
            Arg::Ptr(slot_row),
            Arg::Ptr(be.ptr(sel_e)),
            Arg::Ptr(be.ptr(sel_w)),
            Arg::Ptr(db),
            Arg::I32(db_dt),
            Arg::U32(n as u32),
            Arg::U32(top_k as u32),
            Arg::U32(hidden as u32),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_groups_slots_by_expert_in_token_order() {
        // 3 tokens, top-2, 4 experts; expert 2 unused, one bad id (NaN logits).
        let sel = [0, 3, 1, 3, 0, -1];
        let p = plan(&sel, 2, 4);
        assert_eq!(p.spans, vec![(0, 2), (2, 1), (3, 0), (3, 2)]);
        assert_eq!(p.rows, 5);
        let (row_token, rest) = p.index.split_at(5);
        let (row_expert, slot_row) = rest.split_at(5);
        assert_eq!(row_token, [0, 2, 1, 0, 1]);
        assert_eq!(row_expert, [0, 0, 1, 3, 3]);
        assert_eq!(slot_row, [0, 3, 2, 4, 1, -1]);
    }

    #[test]
    fn plan_of_nothing_valid_is_empty() {
        let p = plan(&[-1, 7], 1, 4);
        assert_eq!(p.rows, 0);
        assert_eq!(p.spans, vec![(0, 0); 4]);
        assert_eq!(p.index, vec![-1, -1]);
    }

    /// One router row a block: gpt-oss-20b's 32 rows of 2,880 in 32
    /// blocks, gpt-oss-120b's 128 in 128, Mixtral's 8 of 4,096 in 8; each
    /// block's shared memory holds its row, the normed row and the logits.
    #[test]
    fn the_fused_routing_gives_each_block_one_router_row() {
        assert_eq!(route_geometry(32, 2880), (32, 2880 * 2 + (2880 + 32) * 4));
        assert_eq!(
            route_geometry(128, 2880),
            (128, 2880 * 2 + (2880 + 128) * 4)
        );
        assert_eq!(route_geometry(8, 4096), (8, 4096 * 2 + (4096 + 8) * 4));
    }
}
