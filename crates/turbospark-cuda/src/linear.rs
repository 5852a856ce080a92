//! `out = x · Wᵀ (+ bias)` for x `[n, k]` and W `[m, k]`, and the pairs a
//! block fuses around it: the input norm read through the projections
//! (`rms_norm_linears`) and the output projection added into the residual
//! stream (`linear_add`).
//!
//! Two regimes, as on the CPU. Decode (n < 4) is bound by reading W once:
//! the GEMV kernels (`crate::gemv`, kernels/gemv_*.cu) read each weight row
//! in its stored format with 16-byte loads and dot it with every row of x,
//! f32 accumulation; one launch holds several matrices that read the same
//! x, and does the norm and the residual add around the product. Prefill
//! (n ≥ 4) is bound by arithmetic and goes to cuBLAS (`crate::gemm`, whose
//! documentation gives the operand types and their rounding), with the
//! norm as its own kernel before it.
//!
//! It owns the choice between the two and which fusions a call gets; it
//! must not synchronise with the host.

use turbospark_backend::Backend;
use turbospark_format::Activation;

use crate::gemm::gemm;
use crate::gemv::{
    GemvEdges, GemvGlu, MAX_SEGS, gemv_segments, launch_gemv, norm_prologue, same_gemv_kernel,
    x_job,
};
use crate::weight::CudaWeight;
use crate::{Cuda, CudaTensor, ops};

/// Below this many rows of x, weight bandwidth dominates: use the GEMV path.
pub const GEMM_MIN_ROWS: usize = 4;
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
            .memset_zeros(&mut *out.data)
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
            None => own.insert(be.empty(x.rows, x.cols)),
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

/// A weight and its bias.
type Part<'a> = (&'a CudaWeight, Option<&'a CudaWeight>);

/// `out = act(rms_norm(x) · Gᵀ + bg) * (rms_norm(x) · Uᵀ + bu)`: on one row
/// of x whose gate and up share a kernel that reads x through the norm,
/// one launch that writes the activation (`GemvGlu::Dense`: gate and up
/// rows interleaved so each pair meets in a block); otherwise
/// [`rms_norm_linears`] into gate and up, then the glu kernel.
pub fn rms_norm_glu(
    be: &Cuda,
    x: &CudaTensor,
    w: &CudaWeight,
    eps: f32,
    (gate, up): (Part, Part),
    act: Activation,
    out: &mut CudaTensor,
) {
    let m = gate.0.rows();
    let fused = x.rows == 1
        && same_gemv_kernel(gate.0, up.0)
        && up.0.rows() == m
        && m > 0
        && gate.0.cols() == x.cols
        && up.0.cols() == x.cols
        && (out.rows, out.cols) == (1, m)
        && w.numel() == x.cols
        && norm_prologue(be, &gate.0.data, x.cols as u32);
    if !fused {
        let mut g = be.empty(x.rows, m);
        let mut u = be.empty(x.rows, up.0.rows());
        rms_norm_linears(be, x, w, eps, &[gate, up], &mut [&mut g, &mut u], None);
        return ops::glu(be, &g, &u, act, out);
    }
    let edges = GemvEdges {
        norm: Some((w, eps)),
        glu: Some(GemvGlu::Dense(act)),
        ..GemvEdges::default()
    };
    // The activation goes to the gate segment's output; the up segment's
    // is never written.
    let dst = be.ptr(&out.data);
    let segs = [(gate.0, gate.1, dst, m as u32), (up.0, up.1, dst, m as u32)];
    launch_gemv(be, &segs, &x_job(be, x), &edges);
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
