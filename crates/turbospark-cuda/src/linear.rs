//! `out = x · Wᵀ (+ bias)` for x `[n, k]` and W `[m, k]`, the matvec jobs
//! of the MoE layer, and the GEMMs of its grouped (prefill) path.
//!
//! Two regimes, as on the CPU. Decode (n < 4) is bound by reading W once:
//! the GEMV kernels (kernels/gemv.cu) read each weight row in its stored
//! format with 16-byte loads and dot it with every row of x, f32
//! accumulation. Prefill (n ≥ 4) is bound by arithmetic and goes to cuBLAS
//! (`cublasGemmEx`, f32 accumulation and output). Operands of that path,
//! per weight format:
//! - bf16: x is rounded once to bf16 (kernels/convert.cu) and multiplies
//!   the stored weights in one bf16 × bf16 tensor-core GEMM
//!   (`CUBLAS_COMPUTE_32F`). Rounding x to bf16 (8 significand bits)
//!   costs ~2⁻⁹ relative per product: results are within ~1e-2 of the rms
//!   of the f32 arithmetic on the same weights.
//! - MXFP4: dequantised exactly to a bf16 scratch copy, then as bf16.
//! - int8/int4: dequantised to a bf16 scratch copy (code · scale in f32,
//!   as the CPU, then rounded to bf16), then as bf16.
//! - f32: f32 GEMM with `CUBLAS_COMPUTE_32F_PEDANTIC` (no TF32).
//! - f16: widened to an f32 scratch copy, then as f32 (rounding f16 to bf16
//!   would lose weight bits).
//!
//! With [`Precision::F32`] (`--precision f32`), bf16-operand products
//! instead split x into bf16 hi + lo and accumulate two GEMMs: 16
//! significand bits of x, results within ~1e-5 of f32 arithmetic, at twice
//! the GEMM cost (for checks against references).
//!
//! [`gemm_rows`] runs one such product on a block of rows of W (one expert
//! of a stacked weight) with x already in the operand type [`XType::of`]
//! names; the MoE layer's grouped path calls it per expert.
//!
//! It owns the choice of kernel; it must not synchronise with the host.

use std::ffi::c_void;

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::CudaSlice;

use turbospark_backend::{Backend, Quant};

use crate::kernels::{Arg, BLOCK, grid_for};
use crate::weight::{CudaWeight, Dense, WeightData};
use crate::{Cuda, CudaTensor, Precision, ops};

/// Below this many rows of x, weight bandwidth dominates: use the GEMV path.
pub const GEMM_MIN_ROWS: usize = 4;
/// Warps per GEMV block.
const GEMV_WARPS_PER_BLOCK: u32 = 8;
/// Output rows one warp computes: 1 for dense weights, `GR` = 4 for the
/// grouped formats (kernels/gemv.cu), which share each x load over 4 rows.
const fn rows_per_warp(grouped: bool) -> u32 {
    if grouped { 4 } else { 1 }
}

/// Warps per output row (or row quad) in a GEMV: the fewest of 1, 2, 4, 8
/// that give about four blocks per SM. A GEMV is only as fast as the weight
/// bytes it has in flight, so a small matrix (a KV projection, a router)
/// splits its rows over more warps rather than leave SMs idle.
fn warps_per_row(sm_count: u32, jobs: u32, m: u32, per_warp: u32) -> u32 {
    let want = 4 * sm_count;
    [1, 2, 4, 8]
        .into_iter()
        .find(|&w| jobs.saturating_mul(gemv_blocks(m, w, per_warp)) >= want)
        .unwrap_or(8)
}

/// Blocks along y of a persistent (integer-activation) GEMV launch that has
/// `blocks` blocks of work per job and room for `resident` blocks at once:
/// each block takes the same number of them in turn (as few as fill the
/// GPU), so the work is even and each block rounds its x row once.
fn persistent_blocks(blocks: u32, jobs: u32, resident: u32) -> u32 {
    let per_job = (resident / jobs.max(1)).max(1);
    blocks.div_ceil(blocks.div_ceil(per_job))
}

/// Blocks along y for `m` output rows with `wpr` warps per row group.
fn gemv_blocks(m: u32, wpr: u32, per_warp: u32) -> u32 {
    m.div_ceil(GEMV_WARPS_PER_BLOCK / wpr * per_warp)
}

/// The x side of one GEMV launch (see kernels/gemv.cu): `jobs`
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

/// `out = x · Wᵀ (+ bias)`.
pub fn linear(
    be: &Cuda,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    out: &mut CudaTensor,
) {
    project(be, x, w, bias, out, false);
}

/// `acc += x · Wᵀ (+ bias)`: the GEMV adds into `acc` as it stores (decode),
/// the GEMM with beta = 1 (prefill).
pub fn linear_add(
    be: &Cuda,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    acc: &mut CudaTensor,
) {
    project(be, x, w, bias, acc, true);
}

/// `out = x · Wᵀ (+ bias)`, or with `add` `out +=` it: the GEMV kernels
/// below [`GEMM_MIN_ROWS`] rows (they add the bias, and with `add` they
/// add into `out` as they store), cuBLAS above (beta = 1 with `add`).
fn project(
    be: &Cuda,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    out: &mut CudaTensor,
    add: bool,
) {
    let (n, k, m) = (x.rows, w.cols(), w.rows());
    assert_eq!(x.cols, k, "linear: x is [{n}, {}], W is [{m}, {k}]", x.cols);
    assert_eq!(
        (out.rows, out.cols),
        (n, m),
        "linear: out is not [{n}, {m}]"
    );
    if n == 0 || m == 0 {
        return;
    }
    if n < GEMM_MIN_ROWS {
        let segs = [(w, bias, be.ptr(&out.data), m as u32)];
        let edges = GemvEdges {
            accumulate: add,
            ..GemvEdges::default()
        };
        return launch_gemv(be, &segs, &x_job(be, x), &edges);
    }
    match (k, add) {
        (0, true) => {}
        (0, false) => be
            .stream
            .memset_zeros(&mut out.data)
            .unwrap_or_else(|e| panic!("CUDA: {e}")),
        _ => gemm(be, x, w, out, if add { 1.0 } else { 0.0 }),
    }
    if let Some(b) = bias {
        ops::add_bias(be, out, b);
    }
}

/// `outs[i] = rms_norm(x) · Wᵢᵀ (+ biasᵢ)`, and the normed rows into
/// `normed` when given. One row of x whose weights share a kernel that
/// can read x through the norm (the dense and integer-activation GEMVs,
/// with x staged in shared memory): one launch, the norm computed by each
/// block as it reads x. Otherwise the norm kernel, then [`linears`].
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_linears(
    be: &Cuda,
    x: &CudaTensor,
    w: &CudaWeight,
    eps: f32,
    parts: &[(&CudaWeight, Option<&CudaWeight>)],
    outs: &mut [&mut CudaTensor],
    normed: Option<&mut CudaTensor>,
) {
    assert_eq!(parts.len(), outs.len(), "linears: one output per weight");
    assert_eq!(w.numel(), x.cols, "rms_norm: weights for another width");
    if let Some(t) = normed.as_deref() {
        assert_eq!(
            (t.rows, t.cols),
            (x.rows, x.cols),
            "rms_norm: out differs from x"
        );
    }
    let fused = x.rows == 1
        && fusable(x, parts, outs)
        && norm_prologue(be, &parts[0].0.data, x.cols as u32);
    if !fused {
        let mut own = None;
        let normed = match normed {
            Some(t) => t,
            None => own.insert(be.tensor(x.rows, x.cols)),
        };
        ops::rms_norm(be, x, w, eps, normed);
        return linears(be, normed, parts, outs);
    }
    let edges = GemvEdges {
        norm: Some((w, eps)),
        normed: normed.map_or(0, |t| be.ptr(&t.data)),
        ..GemvEdges::default()
    };
    gemv_segments(be, x, parts, outs, &edges);
}

/// The GEMV job of a plain linear: every row of `x` times each matrix.
fn x_job(be: &Cuda, x: &CudaTensor) -> GemvJob {
    GemvJob {
        x: be.ptr(&x.data),
        experts: 0,
        jobs: 1,
        nx: x.rows as u32,
        x_div: 1,
        k: x.cols as u32,
    }
}

/// Whether `parts` can share one GEMV launch on `x` into `outs`.
fn fusable(
    x: &CudaTensor,
    parts: &[(&CudaWeight, Option<&CudaWeight>)],
    outs: &[&mut CudaTensor],
) -> bool {
    x.rows > 0
        && x.rows < GEMM_MIN_ROWS
        && !parts.is_empty()
        && parts.len() <= MAX_SEGS
        && parts.iter().zip(outs.iter()).all(|(&(w, _), o)| {
            same_gemv_kernel(parts[0].0, w)
                && w.cols() == x.cols
                && w.rows() > 0
                && (o.rows, o.cols) == (x.rows, w.rows())
        })
}

/// Whether one-row GEMVs of format `w` with rows of `k` values can read x
/// through a fused norm: the integer-activation kernels (which round x in
/// shared memory anyway), and the dense ones where x (k f32) fits in shared
/// memory and is whole 8-value chunks.
fn norm_prologue(be: &Cuda, w: &WeightData, k: u32) -> bool {
    match w {
        WeightData::Dense { .. } => k.is_multiple_of(8) && k * 4 <= MAX_DYNAMIC_SHARED,
        _ => qx_path(be, w, k),
    }
}

/// Whether one-row GEMVs of grouped format `w` take the integer-activation
/// kernels (kernels/gemv.cu): unless f32-level results are asked for, and
/// while the rounded x fits in shared memory.
fn qx_path(be: &Cuda, w: &WeightData, k: u32) -> bool {
    be.precision() == Precision::Bf16 && grouped_qx_shared(w, k) <= MAX_DYNAMIC_SHARED
}

/// `outs[i] = x · Wᵢᵀ (+ biasᵢ)`: one GEMV launch for decode when the
/// weights share a kernel and input width, else one [`linear`] each.
pub fn linears(
    be: &Cuda,
    x: &CudaTensor,
    parts: &[(&CudaWeight, Option<&CudaWeight>)],
    outs: &mut [&mut CudaTensor],
) {
    assert_eq!(parts.len(), outs.len(), "linears: one output per weight");
    let fused = fusable(x, parts, outs);
    if fused {
        gemv_segments(be, x, parts, outs, &GemvEdges::default());
    } else {
        for (&(w, bias), out) in parts.iter().zip(outs.iter_mut()) {
            linear(be, x, w, bias, out);
        }
    }
}

/// Launches the GEMV kernel for `w`'s format into `out`, `m` rows of W per
/// job (an expert's rows when the job picks experts); the bias (dense, one
/// value per row of W, per expert) is added in the kernel.
pub fn gemv(be: &Cuda, w: &CudaWeight, bias: Option<&CudaWeight>, out: u64, m: u32, j: &GemvJob) {
    launch_gemv(be, &[(w, bias, out, m)], j, &GemvEdges::default());
}

/// One GEMV launch for several matrices of one format and input width
/// (`GemvSegs` in kernels/gemv.cu): `x` `[nx, k]` times each `w`, plus its
/// bias, into its `out` `[nx, w.rows()]`.
fn gemv_segments(
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
        (WeightData::Quantized { quant: x, .. }, WeightData::Quantized { quant: y, .. }) => x == y,
        _ => false,
    }
}

/// The kernel's segment table (`struct GemvSegs` in kernels/gemv.cu).
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
}

/// What a GEMV launch does around its product (the last fields of
/// `GemvSegs`; one row of x and one job only): read x through an RMSNorm
/// (its weights and eps), also writing the normed row to `normed` (a device
/// address, 0 for none), and add into the outputs instead of overwriting
/// them.
#[derive(Default)]
pub struct GemvEdges<'a> {
    pub norm: Option<(&'a CudaWeight, f32)>,
    pub normed: u64,
    pub accumulate: bool,
}

/// Most matrices one GEMV launch holds (`GEMV_MAX_SEGS`).
pub const MAX_SEGS: usize = 3;

/// `segs`: (weight, bias, output address, rows per job) of the same kernel.
fn launch_gemv(
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
    // results are asked for (kernels/gemv.cu).
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
    let mut wpr = warps_per_row(be.sm_count, j.jobs, rows, per_warp);
    if qx {
        wpr = wpr.min(qx_warps_cap(j.k));
    }
    let blocks = gemv_blocks(rows, wpr, per_warp);
    assert!(blocks <= 65535, "gemv: {rows} output rows exceed the grid");
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
    let args = [
        Arg::Segs(Box::new(table)),
        Arg::Ptr(j.x),
        Arg::I32(bias_dt.unwrap_or(0)),
        Arg::Ptr(j.experts),
        Arg::U32(j.nx),
        Arg::U32(j.x_div),
        Arg::U32(j.k),
        Arg::U32(wpr),
    ];
    let threads = 32 * GEMV_WARPS_PER_BLOCK;
    // The integer-activation kernels round x into shared memory, and dense
    // ones with a fused norm stage w_norm · x (k f32) there; both then run
    // persistent, so each block prepares x once.
    let shared = match (qx, edges.norm.is_some()) {
        (true, _) => Some(grouped_qx_shared(&w0.data, j.k)),
        (false, true) => Some(4 * j.k),
        (false, false) => None,
    };
    match shared {
        Some(shared) => {
            let per_sm = f
                .occupancy_max_active_blocks_per_multiprocessor(threads, shared as usize, None)
                .unwrap_or_else(|e| panic!("CUDA: occupancy query: {e}"));
            let grid_y = persistent_blocks(blocks, j.jobs, per_sm.max(1) * be.sm_count);
            be.launch_shared(f, (j.jobs, grid_y, 1), threads, shared, &args);
        }
        None => be.launch(f, (j.jobs, blocks, 1), threads, &args),
    }
}

/// Groups a lane of an integer-activation GEMV has in flight
/// (`QX_UNROLL` in kernels/gemv.cu).
const QX_UNROLL: u32 = 2;

/// Most warps per row quad of an integer-activation GEMV with rows of `k`
/// values: its lanes take whole 32-value groups, [`QX_UNROLL`] at a time,
/// so more warps than a row's groups fill that way would idle.
fn qx_warps_cap(k: u32) -> u32 {
    let fill = (k / 32 / (32 * QX_UNROLL)).max(1);
    1 << fill.ilog2()
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

/// The element type the GEMM path reads x in, for a weight's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XType {
    /// x rounded to bf16: bf16, MXFP4, int8 and int4 weights.
    Bf16,
    /// x as it is: f32 and f16 weights (an f32 GEMM).
    F32,
}

impl XType {
    pub fn of(w: &CudaWeight) -> XType {
        match &w.data {
            WeightData::Dense {
                dtype: Dense::F32 | Dense::F16,
                ..
            } => XType::F32,
            _ => XType::Bf16,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            XType::Bf16 => 2,
            XType::F32 => 4,
        }
    }
}

/// Bytes of converted weights that [`gemm_rows`] needs for `rows` rows of
/// `w`: bf16 for MXFP4 and int8/int4, f32 for f16, none for f32 and bf16
/// (cuBLAS reads them as stored).
fn scratch_bytes(w: &CudaWeight, rows: usize) -> usize {
    let values = rows * w.cols();
    match &w.data {
        WeightData::Dense {
            dtype: Dense::F32 | Dense::Bf16,
            ..
        } => 0,
        WeightData::Dense {
            dtype: Dense::F16, ..
        } => values * 4,
        WeightData::Mxfp4 { .. } | WeightData::Quantized { .. } => values * 2,
    }
}

/// Scratch for the converted weights of [`gemm_rows`] calls on `w` with up
/// to `rows` rows of it (`None` where none is needed). Calls queued on the
/// stream run in order, so one scratch serves a sequence of them (the
/// experts of a layer).
pub fn weight_scratch(be: &Cuda, w: &CudaWeight, rows: usize) -> Option<CudaSlice<u8>> {
    let bytes = scratch_bytes(w, rows);
    (bytes > 0).then(|| be.scratch::<u8>(bytes))
}

/// `out = x · W[row0 .. row0 + rows]ᵀ` through cuBLAS: x is `[n, k]` at
/// device address `x` in [`XType::of`]`(w)`, `out` is f32 `[n, rows]`; no
/// bias. `scratch` comes from [`weight_scratch`] for at least `rows` rows.
///
/// cuBLAS is column-major: outᵀ [rows, n] = op(W) · xᵀ with W seen as a
/// k × rows column-major matrix (transposed) and x as k × n.
#[allow(clippy::too_many_arguments)]
pub fn gemm_rows(
    be: &Cuda,
    x: u64,
    n: usize,
    w: &CudaWeight,
    row0: usize,
    rows: usize,
    out: u64,
    scratch: Option<&CudaSlice<u8>>,
) {
    gemm_rows_beta(be, x, n, w, row0, rows, out, scratch, 0.0);
}

/// [`gemm_rows`] into `out = x · Wᵀ + beta · out`.
#[allow(clippy::too_many_arguments)]
fn gemm_rows_beta(
    be: &Cuda,
    x: u64,
    n: usize,
    w: &CudaWeight,
    row0: usize,
    rows: usize,
    out: u64,
    scratch: Option<&CudaSlice<u8>>,
    beta: f32,
) {
    let k = w.cols();
    assert!(
        row0 + rows <= w.rows(),
        "gemm: rows {row0}..{} of a {}-row weight",
        row0 + rows,
        w.rows()
    );
    let dims = [n, k, rows];
    assert!(
        dims.iter().all(|&d| d <= i32::MAX as usize),
        "gemm: {dims:?} exceed cuBLAS's int"
    );
    if n == 0 || rows == 0 {
        return;
    }
    let values = (rows * k) as u64;
    // Where converted weights go (0: read as stored).
    let need = scratch_bytes(w, rows);
    let wide = if need == 0 {
        0
    } else {
        let s = scratch
            .filter(|s| s.len() >= need)
            .unwrap_or_else(|| panic!("gemm: no scratch of {need} bytes for {rows} rows"));
        be.ptr(s)
    };
    let call = GemmCall {
        a: 0,
        b: x,
        c: out,
        ty: cudaDataType::CUDA_R_16BF,
        compute: cublasComputeType_t::CUBLAS_COMPUTE_32F,
        mnk: (rows as i32, n as i32, k as i32),
        beta,
    };
    // No TF32 or other reduced-precision shortcut for f32 inputs.
    let f32_call = GemmCall {
        ty: cudaDataType::CUDA_R_32F,
        compute: cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
        ..call
    };
    let groups = values / 32;
    let first = row0 as u64 * k as u64;
    match &w.data {
        WeightData::Dense {
            dtype: Dense::F32,
            bytes,
        } => run_gemm(
            be,
            &GemmCall {
                a: be.ptr(bytes) + first * 4,
                ..f32_call
            },
        ),
        WeightData::Dense {
            dtype: Dense::Bf16,
            bytes,
        } => run_gemm(
            be,
            &GemmCall {
                a: be.ptr(bytes) + first * 2,
                ..call
            },
        ),
        WeightData::Dense {
            dtype: Dense::F16,
            bytes,
        } => {
            let args = [
                Arg::Ptr(wide),
                Arg::Ptr(be.ptr(bytes) + first * 2),
                Arg::I32(Dense::F16.code()),
                Arg::U64(values),
            ];
            be.launch(&be.k.widen_f32, grid_for(values), BLOCK, &args);
            run_gemm(
                be,
                &GemmCall {
                    a: wide,
                    ..f32_call
                },
            );
        }
        WeightData::Mxfp4 { blocks, scales } => {
            assert!(k.is_multiple_of(32), "gemm: MXFP4 rows of {k} values");
            let g0 = first / 32;
            let args = [
                Arg::Ptr(wide),
                Arg::Ptr(be.ptr(blocks) + g0 * 16),
                Arg::Ptr(be.ptr(scales) + g0),
                Arg::U64(groups),
            ];
            be.launch(&be.k.mxfp4_to_bf16, grid_for(groups), BLOCK, &args);
            run_gemm(be, &GemmCall { a: wide, ..call });
        }
        WeightData::Quantized {
            quant,
            codes,
            scales,
        } => {
            assert!(k.is_multiple_of(32), "gemm: quantized rows of {k} values");
            let (kind, code_bytes) = match quant {
                Quant::Int8 => (0, first),
                Quant::Int4 => (1, first / 2),
            };
            let args = [
                Arg::Ptr(wide),
                Arg::Ptr(be.ptr(codes) + code_bytes),
                Arg::Ptr(be.ptr(scales) + first / 32 * 4),
                Arg::U64(groups),
                Arg::I32(kind),
            ];
            be.launch(&be.k.dequant_bf16, grid_for(groups), BLOCK, &args);
            run_gemm(be, &GemmCall { a: wide, ..call });
        }
    }
}

/// `out = x · Wᵀ` for all of W: x converted to [`XType::of`]`(w)`, then
/// [`gemm_rows`].
/// `out = x · Wᵀ + beta · out`.
fn gemm(be: &Cuda, x: &CudaTensor, w: &CudaWeight, out: &mut CudaTensor, beta: f32) {
    let (n, m) = (x.rows, w.rows());
    let scratch = weight_scratch(be, w, m);
    let scratch = scratch.as_ref();
    let out = be.ptr(&out.data);
    match XType::of(w) {
        XType::F32 => gemm_rows_beta(be, be.ptr(&x.data), n, w, 0, m, out, scratch, beta),
        XType::Bf16 if be.precision() == Precision::F32 => {
            // x = hi + lo, both bf16: 16 significand bits of x, f32-level
            // products at twice the cost (the weights are bf16-exact).
            let nk = (n * x.cols) as u64;
            let hi = be.scratch::<u16>(nk as usize);
            let lo = be.scratch::<u16>(nk as usize);
            let args = [
                Arg::Ptr(be.ptr(&hi)),
                Arg::Ptr(be.ptr(&lo)),
                Arg::Ptr(be.ptr(&x.data)),
                Arg::U64(nk),
            ];
            be.launch(&be.k.split_bf16, grid_for(nk), BLOCK, &args);
            gemm_rows_beta(be, be.ptr(&hi), n, w, 0, m, out, scratch, beta);
            gemm_rows_beta(be, be.ptr(&lo), n, w, 0, m, out, scratch, 1.0);
        }
        XType::Bf16 => {
            let nk = (n * x.cols) as u64;
            let xb = be.scratch::<u16>(nk as usize);
            let args = [
                Arg::Ptr(be.ptr(&xb)),
                Arg::Ptr(be.ptr(&x.data)),
                Arg::U64(nk),
            ];
            be.launch(&be.k.to_bf16, grid_for(nk.div_ceil(4)), BLOCK, &args);
            gemm_rows_beta(be, be.ptr(&xb), n, w, 0, m, out, scratch, beta);
        }
    }
}

/// C (f32, m × n, ld m) = op(A)ᵀ · B with A (k × m, ld k) and B (k × n,
/// ld k) both of type `ty`.
#[derive(Clone, Copy)]
struct GemmCall {
    a: u64,
    b: u64,
    c: u64,
    ty: cudaDataType,
    compute: cublasComputeType_t,
    mnk: (i32, i32, i32),
    /// `C = op(A)ᵀ · B + beta · C`.
    beta: f32,
}

fn run_gemm(be: &Cuda, g: &GemmCall) {
    let (m, n, k) = g.mnk;
    let (alpha, beta) = (1.0f32, g.beta);
    let blas = be.blas.lock().unwrap_or_else(|e| e.into_inner());
    be.ctx
        .bind_to_thread()
        .unwrap_or_else(|e| panic!("CUDA: {e}"));
    // SAFETY: a, b and c are live device buffers of k·m, k·n and m·n
    // elements of the stated types; alpha and beta are host f32 (the
    // handle's default pointer mode) and outlive the call; the handle runs
    // on the backend's stream, so the call is ordered with every kernel.
    unsafe {
        gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            &alpha as *const f32 as *const c_void,
            g.a as *const c_void,
            g.ty,
            k,
            g.b as *const c_void,
            g.ty,
            k,
            &beta as *const f32 as *const c_void,
            g.c as *mut c_void,
            cudaDataType::CUDA_R_32F,
            m,
            g.compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .unwrap_or_else(|e| panic!("cuBLAS GEMM [{m}x{k}]ᵀ·[{k}x{n}]: {e}"));
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
}
