//! Launching the GEMV kernels (kernels/gemv_common.cuh, gemv_dense.cu,
//! gemv_grouped.cu): the segment table of a launch (up to three matrices
//! that read the same x), what it does around its product (a fused input
//! norm, a residual add), the kernel for a weight format, and the launch
//! geometry (warps per row and persistent grids that keep the resident
//! blocks busy); which one-row launches take the streamed kernels (weights
//! through a shared-memory ring filled before the PDL wait) is [`stream`]'s.
//! The MoE layer's per-token jobs launch through [`gemv`]. It must not
//! synchronise with the host.

use turbospark_backend::Quant;
use turbospark_backend::quant::scale_shift;
use turbospark_format::{Activation, ExpertAct};

use crate::kernels::Arg;
use crate::weight::{CudaWeight, Dense, WeightData};
use crate::{Cuda, CudaTensor, Precision};

mod stream;
pub(crate) use stream::{QX_STREAM_MAX_SHARED, STREAM_MAX_SHARED};

/// Warps per GEMV block.
const GEMV_WARPS_PER_BLOCK: u32 = 8;
/// Output rows one warp computes: 1 for dense weights, `GR` = 4 for the
/// grouped formats (kernels/gemv_grouped.cu), which share each x load over 4 rows.
const fn rows_per_warp(grouped: bool) -> u32 {
    if grouped { 4 } else { 1 }
}

/// Warps per output row (or row quad) of a grouped f32-activation GEMV
/// (one block per block of work): the fewest of 1, 2, 4, 8 that give about
/// four blocks per SM. A GEMV is only as fast as the weight
/// bytes it has in flight, so a small matrix (a KV projection, a router)
/// splits its rows over more warps rather than leave SMs idle.
fn warps_per_row(sm_count: u32, jobs: u32, m: u32, per_warp: u32) -> u32 {
    let want = 4 * sm_count;
    [1, 2, 4, 8]
        .into_iter()
        .find(|&w| jobs.saturating_mul(gemv_blocks(m, w, per_warp)) >= want)
        .unwrap_or(8)
}

/// Blocks along y of a persistent GEMV launch (integer activations, or a
/// dense one with a fused norm) that has `blocks` blocks of work per job
/// and room for `resident` blocks at once: each block takes the same
/// number of them in turn (as few as fill the GPU), so the work is even
/// and each block prepares its x row once.
fn persistent_blocks(blocks: u32, jobs: u32, resident: u32) -> u32 {
    let per_job = (resident / jobs.max(1)).max(1);
    blocks.div_ceil(blocks.div_ceil(per_job))
}

/// Warps per row and blocks along y of a persistent GEMV launch (one whose
/// blocks loop over blocks of work: the dense kernels and the
/// integer-activation ones) with room for `resident` blocks at once and
/// `jobs` jobs of `rows` rows, at most `max_wpr` warps a row. A GEMV is
/// only as fast as the weight bytes it has in flight, so what matters is
/// how many of the resident slots stay busy: each job's blocks of work are
/// dealt in equal turns to its share of the slots, which keeps
/// work / (turns · slots) of them busy. One warp a row can leave many
/// idle (Llama-8B's q+k+v: 768 blocks in two turns of 384 of 528 slots,
/// 73%); more warps a row split it into more, smaller blocks (two: 1,536
/// in three turns of 512, 97%) at the cost of a shared-memory exchange
/// each turn. So: the fewest warps a row that keep 90% busy, else the
/// busiest.
fn persistent_geometry(
    resident: u32,
    jobs: u32,
    rows: u32,
    per_warp: u32,
    max_wpr: u32,
) -> (u32, u32) {
    let slots = (resident / jobs.max(1)).max(1);
    let busy = |w: u32| {
        let work = gemv_blocks(rows, w, per_warp);
        f64::from(work) / (f64::from(work.div_ceil(slots)) * f64::from(slots))
    };
    let ws = [1, 2, 4, 8].into_iter().filter(|&w| w <= max_wpr.max(1));
    let wpr = ws
        .clone()
        .find(|&w| busy(w) >= 0.9)
        .unwrap_or_else(|| ws.fold(1, |best, w| if busy(w) > busy(best) { w } else { best }));
    let blocks = gemv_blocks(rows, wpr, per_warp);
    (wpr, persistent_blocks(blocks, jobs, resident))
}

/// Blocks along y for `m` output rows with `wpr` warps per row group.
fn gemv_blocks(m: u32, wpr: u32, per_warp: u32) -> u32 {
    m.div_ceil(GEMV_WARPS_PER_BLOCK / wpr * per_warp)
}

/// The x side of one GEMV launch (see kernels/gemv_common.cuh): `jobs`
/// block-columns, each multiplying `nx` rows of x (starting at row
/// `(job / x_div) · nx`) by the rows of expert `experts[job]` of each
/// matrix (all of it when `experts` is 0), into rows `job · nx ..` of that
/// matrix's output.
pub struct GemvJob {
    pub x: u64,
    pub experts: u64,
    pub jobs: u32,
    pub nx: u32,
    pub x_div: u32,
    pub k: u32,
}

/// The GEMV job of a plain linear: every row of `x` times each matrix.
pub(crate) fn x_job(be: &Cuda, x: &CudaTensor) -> GemvJob {
    GemvJob {
        x: be.ptr(&x.data),
        experts: 0,
        jobs: 1,
        nx: x.rows as u32,
        x_div: 1,
        k: x.cols as u32,
    }
}

/// Whether one-row GEMVs of format `w` with rows of `k` values can read x
/// through a fused norm: the integer-activation kernels (which round x in
/// shared memory anyway), and the dense ones where x (k f32) fits in shared
/// memory and is whole 8-value chunks.
pub(crate) fn norm_prologue(be: &Cuda, w: &WeightData, k: u32) -> bool {
    match w {
        WeightData::Dense { .. } => k.is_multiple_of(8) && k * 4 <= MAX_DYNAMIC_SHARED,
        _ => qx_path(be, w, k),
    }
}

/// Whether one-row GEMVs of grouped format `w` take the integer-activation
/// kernels (kernels/gemv_grouped.cu): unless f32-level results are asked for, and
/// while the rounded x fits in shared memory.
fn qx_path(be: &Cuda, w: &WeightData, k: u32) -> bool {
    be.precision() == Precision::Bf16 && grouped_qx_shared(w, k) <= MAX_DYNAMIC_SHARED
}

/// Launches the GEMV kernel for `w`'s format into `out`, `m` rows of W per
/// job (an expert's rows when the job picks experts); the bias (dense, one
/// value per row of W, per expert) is added in the kernel, and `edges` says
/// what else it does.
pub fn gemv(
    be: &Cuda,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    out: u64,
    m: u32,
    j: &GemvJob,
    edges: &GemvEdges,
) {
    launch_gemv(be, &[(w, bias, out, m)], j, edges);
}

/// One GEMV launch for several matrices of one format and input width
/// (`GemvSegs` in kernels/gemv_common.cuh): `x` `[nx, k]` times each `w`, plus its
/// bias, into its `out` `[nx, w.rows()]`.
pub(crate) fn gemv_segments(
    be: &Cuda,
    x: &CudaTensor,
    parts: &[(&CudaWeight, Option<&CudaWeight>)],
    outs: &mut [&mut CudaTensor],
    edges: &GemvEdges,
) {
    let segs: Vec<_> = parts
        .iter()
        .zip(outs.iter())
        .map(|(&(w, b), out)| (w, b, be.ptr(&out.data), w.rows() as u32))
        .collect();
    launch_gemv(be, &segs, &x_job(be, x), edges);
}

/// Whether `a` and `b` take the same GEMV kernel (one launch can hold
/// both).
pub fn same_gemv_kernel(a: &CudaWeight, b: &CudaWeight) -> bool {
    match (&a.data, &b.data) {
        (WeightData::Dense { dtype: x, .. }, WeightData::Dense { dtype: y, .. }) => x == y,
        (WeightData::Mxfp4 { .. }, WeightData::Mxfp4 { .. }) => true,
        (
            WeightData::Quantized {
                quant: x, group: g, ..
            },
            WeightData::Quantized {
                quant: y, group: h, ..
            },
        ) => x == y && g == h,
        _ => false,
    }
}

/// The kernel's segment table (`struct GemvSegs` in kernels/gemv_common.cuh).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct GemvSegs {
    w: [u64; MAX_SEGS],
    scales: [u64; MAX_SEGS],
    bias: [u64; MAX_SEGS],
    out: [u64; MAX_SEGS],
    m: [u32; MAX_SEGS],
    count: u32,
    norm: u64,
    normed: u64,
    norm_dt: i32,
    eps: f32,
    accumulate: u32,
    glu: i32,
    glu_alpha: f32,
    glu_limit: f32,
    experts_settled: u32,
    scale_shift: u32,
}

/// What a GEMV launch does around its product (the last fields of
/// `GemvSegs`): read x through an RMSNorm (its weights and eps; one row of
/// x and one job), also writing the normed row to `normed` (a device
/// address, 0 for none); add into the outputs instead of overwriting them;
/// or write the activation of gate/up row pairs instead of the rows
/// ([`GemvGlu`]).
#[derive(Default)]
pub struct GemvEdges<'a> {
    pub norm: Option<(&'a CudaWeight, f32)>,
    pub normed: u64,
    pub accumulate: bool,
    pub glu: Option<GemvGlu>,
    /// The job's experts were written before the kernel this launch waits
    /// for (an MoE's down: its routing ran before gate/up), so its blocks
    /// may fetch their first weights before the wait (the integer-format
    /// GEMVs do; the dense ones keep skipping an expert launch's L2
    /// prefetch: kernels/gemv_dense.cu). Sound because every
    /// kernel releases its dependents only once past its own wait
    /// (`pdl_enter`: wait, then launch_dependents): when this launch
    /// starts, the kernel two back has finished and its writes are in L2.
    pub experts_settled: bool,
}

/// Which rows pair up in a launch that writes activations: an MoE expert's
/// gate_up (one matrix, rows in the activation's layout; half as many
/// values a job), or a dense MLP's gate and up (two segments of the same
/// height, one row of x; the activation into the first one's output).
#[derive(Clone, Copy)]
pub enum GemvGlu {
    Expert(ExpertAct),
    Dense(Activation),
}

/// `GLU_*` in kernels/gemv_common.cuh.
const GLU_SWIGLU_HALVES: i32 = 1;
const GLU_CLAMPED_PAIRS: i32 = 2;
const GLU_SEGS_SILU: i32 = 3;
const GLU_SEGS_GELU_TANH: i32 = 4;

/// Most matrices one GEMV launch holds (`GEMV_MAX_SEGS`).
pub const MAX_SEGS: usize = 3;

/// `segs`: (weight, bias, output address, rows per job) of the same kernel.
pub(crate) fn launch_gemv(
    be: &Cuda,
    segs: &[(&CudaWeight, Option<&CudaWeight>, u64, u32)],
    j: &GemvJob,
    edges: &GemvEdges,
) {
    assert!(
        j.nx as usize <= 4 && j.nx > 0,
        "gemv: {} rows of x per job",
        j.nx
    );
    assert!(
        !segs.is_empty() && segs.len() <= MAX_SEGS,
        "gemv: {} matrices in one launch",
        segs.len()
    );
    let w0 = segs[0].0;
    assert!(
        segs.iter().all(|s| same_gemv_kernel(w0, s.0)),
        "gemv: matrices of different formats in one launch"
    );
    let grouped = !matches!(w0.data, WeightData::Dense { .. });
    let per_warp = rows_per_warp(grouped);
    let mut table = GemvSegs {
        count: segs.len() as u32,
        ..GemvSegs::default()
    };
    let mut bias_dt = None;
    for (i, &(w, bias, out, m)) in segs.iter().enumerate() {
        let (codes, scales) = match &w.data {
            WeightData::Dense { bytes, .. } => (be.ptr(bytes), 0),
            WeightData::Mxfp4 { blocks, scales } => (be.ptr(blocks), be.ptr(scales)),
            WeightData::Quantized { codes, scales, .. } => (be.ptr(codes), be.ptr(scales)),
        };
        assert!(
            !grouped || j.k.is_multiple_of(32),
            "gemv: grouped rows of {} values",
            j.k
        );
        if let Some(b) = bias {
            let (ptr, dt) = b.dense_ptr(be, "bias");
            assert!(
                bias_dt.is_none_or(|d| d == dt),
                "gemv: biases of different dtypes in one launch"
            );
            bias_dt = Some(dt);
            table.bias[i] = ptr;
        }
        (table.w[i], table.scales[i], table.out[i], table.m[i]) = (codes, scales, out, m);
    }
    // Rows laid end to end, each segment padded to whole warps' rows.
    let rows: u32 = segs.iter().map(|s| s.3.next_multiple_of(per_warp)).sum();
    // One row of x (decode) has kernels of its own with fewer registers;
    // the grouped formats' take integer activations unless f32-level
    // results are asked for (kernels/gemv_grouped.cu).
    let one = j.nx == 1;
    let qx = grouped && one && qx_path(be, &w0.data, j.k);
    if let Some((norm, eps)) = edges.norm {
        assert!(
            one && j.jobs == 1 && norm_prologue(be, &w0.data, j.k),
            "gemv: a fused norm needs one row of x and a kernel that reads it so"
        );
        assert_eq!(
            norm.numel(),
            j.k as usize,
            "gemv: norm weights for another width"
        );
        let (ptr, dt) = norm.dense_ptr(be, "norm");
        (table.norm, table.norm_dt, table.eps, table.normed) = (ptr, dt, eps, edges.normed);
    }
    table.accumulate = edges.accumulate.into();
    table.experts_settled = edges.experts_settled.into();
    if let WeightData::Quantized { group, .. } = &w0.data {
        table.scale_shift = scale_shift(*group);
    }
    // The most warps a row: each warp's part of a row stays long enough to
    // keep its loads streaming (qx_warps_cap, dense_warps_cap; qx_max_wpr
    // below); a glu launch's pairs meet in one block, so a dense one keeps
    // an even number of rows a block.
    let mut max_wpr = if qx {
        qx_warps_cap(j.k)
    } else {
        dense_warps_cap(j.k)
    };
    if let Some(glu) = edges.glu {
        let one_matrix = segs.len() == 1 && segs[0].3.is_multiple_of(2);
        let (shape_ok, mode, alpha, limit) = match glu {
            GemvGlu::Expert(ExpertAct::SwiGlu) => (one_matrix, GLU_SWIGLU_HALVES, 0.0, 0.0),
            GemvGlu::Expert(ExpertAct::ClampedSwiGlu { alpha, limit }) => {
                (one_matrix, GLU_CLAMPED_PAIRS, alpha, limit)
            }
            GemvGlu::Dense(act) => {
                let two = segs.len() == 2 && segs[0].3 == segs[1].3 && one && j.jobs == 1;
                let mode = match act {
                    Activation::Silu => GLU_SEGS_SILU,
                    Activation::GeluTanh => GLU_SEGS_GELU_TANH,
                };
                (two, mode, 0.0, 0.0)
            }
        };
        assert!(
            shape_ok && !edges.accumulate,
            "gemv: a fused activation needs gate/up row pairs (one matrix, or two of one height on one row of x)"
        );
        (table.glu, table.glu_alpha, table.glu_limit) = (mode, alpha, limit);
        // A dense launch's pairs of rows meet in one block: an even number
        // of them a block. A grouped launch's meet in one warp's row quad.
        if !grouped {
            max_wpr = max_wpr.min(GEMV_WARPS_PER_BLOCK / 2);
        }
    }
    if stream::launch(be, &w0.data, &table, j, rows, qx, bias_dt.unwrap_or(0)) {
        return;
    }
    let k = &be.k;
    let f = match &w0.data {
        WeightData::Dense { dtype, .. } => match (dtype, one) {
            (Dense::F32, true) => &k.gemv_f32_x1,
            (Dense::F32, false) => &k.gemv_f32,
            (Dense::Bf16, true) => &k.gemv_bf16_x1,
            (Dense::Bf16, false) => &k.gemv_bf16,
            (Dense::F16, true) => &k.gemv_f16_x1,
            (Dense::F16, false) => &k.gemv_f16,
        },
        WeightData::Mxfp4 { .. } if qx => &k.gemv_mxfp4_qx,
        WeightData::Mxfp4 { .. } if one => &k.gemv_mxfp4_x1,
        WeightData::Mxfp4 { .. } => &k.gemv_mxfp4,
        WeightData::Quantized { quant, .. } => match (quant, one, qx) {
            (Quant::Int8, _, true) => &k.gemv_q8_qx,
            (Quant::Int8, true, false) => &k.gemv_q8_x1,
            (Quant::Int8, false, _) => &k.gemv_q8,
            (Quant::Int4, _, true) => &k.gemv_q4_qx,
            (Quant::Int4, true, false) => &k.gemv_q4_x1,
            (Quant::Int4, false, _) => &k.gemv_q4,
        },
    };
    let threads = 32 * GEMV_WARPS_PER_BLOCK;
    let args = |wpr: u32| {
        [
            Arg::Segs(Box::new(table)),
            Arg::Ptr(j.x),
            Arg::I32(bias_dt.unwrap_or(0)),
            Arg::Ptr(j.experts),
            Arg::U32(j.nx),
            Arg::U32(j.x_div),
            Arg::U32(j.k),
            Arg::U32(wpr),
        ]
    };
    if grouped && !qx {
        // The f32-activation grouped kernels take one block of work each.
        let wpr = warps_per_row(be.sm_count, j.jobs, rows, per_warp).min(max_wpr);
        let blocks = gemv_blocks(rows, wpr, per_warp);
        assert!(blocks <= 65535, "gemv: {rows} output rows exceed the grid");
        be.launch(f, (j.jobs, blocks, 1), threads, &args(wpr));
        return;
    }
    // The integer-activation kernels round x into shared memory, and dense
    // ones with a fused norm stage w_norm · x (k f32) there; both run
    // persistent, so each block prepares x once. Dense ones without run
    // persistent too, for the geometry's sake.
    let shared = match (qx, edges.norm.is_some()) {
        (true, _) => grouped_qx_shared(&w0.data, j.k),
        (false, true) => 4 * j.k,
        (false, false) => 0,
    };
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(threads, shared as usize, None)
        .unwrap_or_else(|e| panic!("CUDA: occupancy query: {e}"));
    let resident = per_sm.max(1) * be.sm_count;
    if qx {
        let blocks_at_one = gemv_blocks(rows, 1, per_warp).saturating_mul(j.jobs);
        max_wpr = qx_max_wpr(max_wpr, blocks_at_one, resident);
    } else {
        let blocks_at_cap = gemv_blocks(rows, max_wpr, per_warp).saturating_mul(j.jobs);
        let limit = if table.glu != 0 {
            GEMV_WARPS_PER_BLOCK / 2
        } else {
            GEMV_WARPS_PER_BLOCK
        };
        max_wpr = dense_max_wpr(max_wpr, limit, blocks_at_cap, resident);
    }
    let (wpr, grid_y) = persistent_geometry(resident, j.jobs, rows, per_warp, max_wpr);
    be.launch_shared(f, (j.jobs, grid_y, 1), threads, shared, &args(wpr));
}

/// Groups a lane of an integer-activation GEMV has in flight
/// (`QX_UNROLL` in kernels/gemv_grouped.cu).
const QX_UNROLL: u32 = 2;

/// Most warps per row quad of an integer-activation GEMV with rows of `k`
/// values: its lanes take whole 32-value groups, [`QX_UNROLL`] at a time,
/// so more warps than a row's groups fill that way would idle.
fn qx_warps_cap(k: u32) -> u32 {
    let fill = (k / 32 / (32 * QX_UNROLL)).max(1);
    1 << fill.ilog2()
}

/// Most warps per row quad of an integer-activation launch that would
/// take `blocks_at_one` blocks of work at one warp a quad, `resident`
/// blocks fitting at once, given the row's cap: one where that is more
/// than one turn of the resident blocks (each warp then streams whole
/// rows with no exchange between warps, and every slot stays busy
/// anyway), else the cap, so that a launch of one turn (q+k+v, o, down)
/// keeps more of the slots busy. Measured on the H200 in one process
/// (Llama-8B): against the geometry's choice everywhere, one warp for the
/// many-turn gate/up gave int4 346 → 361 tok/s and int8 254 → 261; against
/// one warp everywhere, the cap for one-turn launches gave int4 357 → 364
/// and int8 240 → 263 (another machine).
fn qx_max_wpr(cap: u32, blocks_at_one: u32, resident: u32) -> u32 {
    if blocks_at_one > resident { 1 } else { cap }
}

/// Values of a row each warp of a dense persistent GEMV takes at least:
/// two of its steps (a step is 32 lanes × 4 loads × 8 values), so that
/// splitting rows over warps for the slots' sake does not leave each warp
/// one round trip and an exchange (gpt-oss's 2,880-value rows over four
/// warps: 414 tok/s against 426 with one).
const DENSE_VALUES_PER_WARP: u32 = 2 * 32 * 4 * 8;

/// Most warps a row of `k` values of a dense GEMV takes (a power of two):
/// 2 for Llama's 4,096, 4 for its 14,336, 1 for gpt-oss's 2,880.
fn dense_warps_cap(k: u32) -> u32 {
    let fill = (k / DENSE_VALUES_PER_WARP).max(1);
    1 << fill.ilog2().min(GEMV_WARPS_PER_BLOCK.ilog2())
}

/// Most warps a row of a dense persistent launch may take, given the row's
/// `cap` (dense_warps_cap), the launch's `limit` (a block's warps; half for
/// glu pairs) and its blocks of work at the cap: the cap, unless those
/// fill less than a quarter of the `resident` slots (a router: gpt-oss's 32
/// rows of 2,880 are four blocks at one warp a row, each warp's row three
/// round trips of loads), when rows spread over up to `limit` warps, so
/// that more SMs take part and each warp's part is one round trip.
/// gpt-oss-20b on the H200, in one process, three runs each: 431.0, 437.7,
/// 439.1 tok/s against 431.3, 430.2, 431.7 at the cap.
fn dense_max_wpr(cap: u32, limit: u32, blocks_at_cap: u32, resident: u32) -> u32 {
    if blocks_at_cap < resident / 4 {
        cap.max(limit)
    } else {
        cap
    }
}

/// Dynamic shared memory a block may use without opting in.
const MAX_DYNAMIC_SHARED: u32 = 48 * 1024;

/// Shared bytes of an integer-activation GEMV block for rows of `k`
/// values: one code a value (int16 for MXFP4, int8 for int8/int4) and one
/// f32 step per 32.
fn grouped_qx_shared(w: &WeightData, k: u32) -> u32 {
    let code = if matches!(w, WeightData::Mxfp4 { .. }) {
        2
    } else {
        1
    };
    k * code + k / 32 * 4
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The launch geometry on an H200 (132 SMs): big matrices keep one warp
    /// per row, small ones spread over more warps until about four blocks
    /// per SM are in flight, and the count never goes past eight.
    #[test]
    fn warps_per_row_fill_the_gpu() {
        let sms = 132;
        // Llama-8B gate+up (28,672 rows): 3,584 blocks with one warp a row.
        assert_eq!(warps_per_row(sms, 1, 28_672, 1), 1);
        assert_eq!(gemv_blocks(28_672, 1, 1), 3_584);
        // q+k+v (6,144 rows): 768 blocks already fill it.
        assert_eq!(warps_per_row(sms, 1, 6_144, 1), 1);
        // A KV projection alone (1,024 rows): four warps a row would give
        // 512 blocks, short of 528, so eight.
        assert_eq!(warps_per_row(sms, 1, 1_024, 1), 8);
        assert_eq!(gemv_blocks(1_024, 4, 1), 512);
        assert_eq!(gemv_blocks(1_024, 8, 1), 1_024);
        // A 32-expert router: as many warps as a row can have.
        assert_eq!(warps_per_row(sms, 1, 32, 1), 8);
        // Four MXFP4 expert jobs of 5,760 rows, four rows per warp.
        assert_eq!(warps_per_row(sms, 4, 5_760, 4), 1);
        assert_eq!(gemv_blocks(5_760, 1, 4), 180);
        // Grouped segments are padded to whole quads: 37 rows take 10 warps'
        // worth (40 rows) of blocks.
        assert_eq!(gemv_blocks(37_u32.next_multiple_of(4), 8, 4), 10);
    }

    /// Small dense launches (routers) spread their rows over a block's
    /// warps; launches that fill the GPU keep the row's cap.
    #[test]
    fn small_dense_launches_take_more_warps_a_row() {
        let resident = 4 * 132;
        // gpt-oss's router: 32 rows of 2,880 (cap 1), four blocks.
        let cap = dense_warps_cap(2_880);
        assert_eq!(cap, 1);
        assert_eq!(dense_max_wpr(cap, 8, gemv_blocks(32, cap, 1), resident), 8);
        assert_eq!(persistent_geometry(resident, 1, 32, 1, 8), (8, 32));
        // Qwen3-30B-A3B's: 128 rows of 2,048, 16 blocks.
        assert_eq!(dense_max_wpr(1, 8, gemv_blocks(128, 1, 1), resident), 8);
        // gpt-oss's o projection (2,880 rows: 360 blocks) keeps the cap,
        // and so does a glu launch past the limit's quarter.
        assert_eq!(
            dense_max_wpr(cap, 8, gemv_blocks(2_880, cap, 1), resident),
            1
        );
        assert_eq!(dense_max_wpr(2, 4, 131, resident), 4);
        assert_eq!(dense_max_wpr(2, 4, 132, resident), 2);
    }

    #[test]
    fn persistent_blocks_share_the_work_evenly() {
        // Llama-8B int4 gate+up: 896 blocks of work, 528 resident: two
        // each for 448 blocks.
        assert_eq!(persistent_blocks(896, 1, 528), 448);
        // Fewer than fit: one each.
        assert_eq!(persistent_blocks(300, 1, 528), 300);
        // Four MXFP4 expert jobs of 180 blocks, 396 resident (99 a job).
        assert_eq!(persistent_blocks(180, 4, 396), 90);
        // More jobs than resident blocks: still one block a job.
        assert_eq!(persistent_blocks(7, 600, 396), 1);
    }

    /// Persistent launches on an H200 (132 SMs, 4 blocks an SM resident):
    /// the fewest warps a row that keep 90% of the slots busy.
    #[test]
    fn persistent_geometry_keeps_the_slots_busy() {
        let resident = 4 * 132;
        // Llama-8B gate+up: 3,584 blocks in 7 turns of 512 (97%).
        assert_eq!(persistent_geometry(resident, 1, 28_672, 1, 8), (1, 512));
        // q+k+v (6,144 rows): one warp a row would be 768 blocks in two
        // turns of 384 (73%); two, 1,536 in three turns of 512.
        assert_eq!(persistent_geometry(resident, 1, 6_144, 1, 8), (2, 512));
        // gpt-oss q+k+v (5,120 rows): 61%, 81%, then 97% with four.
        assert_eq!(persistent_geometry(resident, 1, 5_120, 1, 8), (4, 512));
        // Capped (a glu launch keeps pairs in a block): the busiest allowed.
        assert_eq!(persistent_geometry(resident, 1, 5_120, 1, 2), (2, 427));
        // Llama-8B o (4,096 rows): 512 blocks in one turn.
        assert_eq!(persistent_geometry(resident, 1, 4_096, 1, 8), (1, 512));
        // A 32-row router: as many warps as a row can have, one turn.
        assert_eq!(persistent_geometry(resident, 1, 32, 1, 8), (8, 32));
        // Four MXFP4 expert jobs of 5,760 rows, four a warp, 132 slots
        // each: 180 blocks in two turns of 90 (68%), 360 in three of 120
        // (91%).
        assert_eq!(persistent_geometry(resident, 4, 5_760, 4, 8), (2, 120));
    }

    #[test]
    fn integer_activation_warps_stay_within_a_rows_groups() {
        // A warp's lanes take 32 groups a step, two steps at a time.
        // gpt-oss rows (2,880 values = 90 groups) and anything up to 127
        // groups: one warp a row quad.
        assert_eq!(qx_warps_cap(2_880), 1);
        assert_eq!(qx_warps_cap(32), 1);
        // Llama-8B's 4,096 (128 groups): two; the down projection's
        // 14,336 (448 groups, 7 batches): four, not seven.
        assert_eq!(qx_warps_cap(4_096), 2);
        assert_eq!(qx_warps_cap(14_336), 4);
        // Wide rows leave warps_per_row's choice (at most 8) alone.
        assert_eq!(qx_warps_cap(65_536), 32);
    }

    /// Llama-8B int4 on an H200 (2 blocks an SM, 264 resident): gate/up
    /// (28,672 rows: 896 blocks of 8 quads) takes several turns, one warp
    /// a quad; q+k+v (192 blocks), o (128) and down (128) take one turn
    /// and keep the row's cap.
    #[test]
    fn integer_activation_launches_of_many_turns_take_one_warp_a_quad() {
        let resident = 264;
        assert_eq!(
            qx_max_wpr(qx_warps_cap(4_096), gemv_blocks(28_672, 1, 4), resident),
            1
        );
        assert_eq!(
            qx_max_wpr(qx_warps_cap(4_096), gemv_blocks(6_144, 1, 4), resident),
            2
        );
        assert_eq!(
            qx_max_wpr(qx_warps_cap(4_096), gemv_blocks(4_096, 1, 4), resident),
            2
        );
        assert_eq!(
            qx_max_wpr(qx_warps_cap(14_336), gemv_blocks(4_096, 1, 4), resident),
            4
        );
        // Four MXFP4 expert jobs of gpt-oss (5,760 rows, 2,880 values).
        assert_eq!(
            qx_max_wpr(qx_warps_cap(2_880), 4 * gemv_blocks(5_760, 1, 4), resident),
            1
        );
    }

    #[test]
    fn dense_warps_keep_two_steps_of_a_row() {
        assert_eq!(dense_warps_cap(2_880), 1);
        assert_eq!(dense_warps_cap(4_096), 2);
        assert_eq!(dense_warps_cap(14_336), 4);
        assert_eq!(dense_warps_cap(64), 1);
        assert_eq!(dense_warps_cap(1 << 20), 8);
    }
}
