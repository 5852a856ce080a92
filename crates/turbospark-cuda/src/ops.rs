//! Row-wise operations: embedding lookup, RMSNorm, residual add, gated
//! activations, scale, softcap (kernels/elementwise.cu, norm.cu; RoPE is
//! `crate::rope_kv`'s). This module checks shapes and launches; the
//! numerics (f32, the CPU backend's formulas and order) are documented in
//! the kernels. It must not synchronise with the host.

use turbospark_format::Activation;

use crate::kernels::{Arg, BLOCK, grid_for};
use crate::weight::CudaWeight;
use crate::{Cuda, CudaBatch, CudaTensor};

fn len(t: &CudaTensor) -> u64 {
    (t.rows * t.cols) as u64
}

pub fn embed(be: &Cuda, table: &CudaWeight, batch: &CudaBatch, out: &mut CudaTensor) {
    let tokens = &batch.host_tokens;
    let d = table.cols();
    assert_eq!(
        (out.rows, out.cols),
        (tokens.len(), d),
        "embed: out is not [tokens, {d}]"
    );
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.rows()) {
        panic!("embed: token {t} outside a table of {} rows", table.rows());
    }
    if tokens.is_empty() || d == 0 {
        return;
    }
    let (w, dt) = table.dense_ptr(be, "embed");
    be.launch(
        &be.k.embed,
        grid_for(len(out)),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&out.data)),
            Arg::Ptr(w),
            Arg::I32(dt),
            Arg::Ptr(be.ptr(&batch.tokens)),
            Arg::U32(tokens.len() as u32),
            Arg::U32(d as u32),
        ],
    );
}

/// RMSNorm of x's groups of `w.len()`.
pub fn rms_norm(be: &Cuda, x: &CudaTensor, w: &CudaWeight, eps: f32, out: &mut CudaTensor) {
    let d = w.numel();
    assert_eq!(
        (x.rows, x.cols),
        (out.rows, out.cols),
        "rms_norm: x and out differ in shape"
    );
    assert!(
        d > 0 && x.cols.is_multiple_of(d),
        "rms_norm: rows of {} are not groups of {d}",
        x.cols
    );
    let groups = len(x) / d as u64;
    if groups == 0 {
        return;
    }
    let (wp, dt) = w.dense_ptr(be, "rms_norm");
    // About four values a thread: a warp for a head-sized group, up to
    // 1024 threads for a hidden-sized one.
    let threads = (d.div_ceil(4).next_multiple_of(32)).clamp(32, 1024) as u32;
    let args = [
        Arg::Ptr(be.ptr(&out.data)),
        Arg::Ptr(be.ptr(&x.data)),
        Arg::Ptr(wp),
        Arg::I32(dt),
        Arg::U32(d as u32),
        Arg::F32(eps),
    ];
    be.launch(&be.k.rms_norm, (groups as u32, 1, 1), threads, &args);
}

pub fn add(be: &Cuda, x: &mut CudaTensor, y: &CudaTensor) {
    assert_eq!((x.rows, x.cols), (y.rows, y.cols), "add: shapes differ");
    let n = len(x);
    if n == 0 {
        return;
    }
    be.launch(
        &be.k.add_inplace,
        grid_for(n),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&x.data)),
            Arg::Ptr(be.ptr(&y.data)),
            Arg::U64(n),
        ],
    );
}

pub fn glu(be: &Cuda, gate: &CudaTensor, up: &CudaTensor, act: Activation, out: &mut CudaTensor) {
    let shape = (gate.rows, gate.cols);
    assert!(
        shape == (up.rows, up.cols) && shape == (out.rows, out.cols),
        "glu: shapes differ"
    );
    let n = len(out);
    if n == 0 {
        return;
    }
    let act = match act {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
    };
    be.launch(
        &be.k.glu,
        grid_for(n),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&out.data)),
            Arg::Ptr(be.ptr(&gate.data)),
            Arg::Ptr(be.ptr(&up.data)),
            Arg::U64(n),
            Arg::I32(act),
        ],
    );
}

pub fn scale(be: &Cuda, x: &mut CudaTensor, s: f32) {
    let n = len(x);
    if n > 0 {
        let args = [Arg::Ptr(be.ptr(&x.data)), Arg::F32(s), Arg::U64(n)];
        be.launch(&be.k.scale_inplace, grid_for(n), BLOCK, &args);
    }
}

pub fn softcap(be: &Cuda, x: &mut CudaTensor, cap: f32) {
    let n = len(x);
    if n > 0 {
        let args = [Arg::Ptr(be.ptr(&x.data)), Arg::F32(cap), Arg::U64(n)];
        be.launch(&be.k.softcap_inplace, grid_for(n), BLOCK, &args);
    }
}

/// `out[r, c] += bias[c]` (the bias of the cuBLAS path of `linear`).
pub fn add_bias(be: &Cuda, out: &mut CudaTensor, bias: &CudaWeight) {
    assert_eq!(
        bias.numel(),
        out.cols,
        "bias of {} values for {} columns",
        bias.numel(),
        out.cols
    );
    let n = len(out);
    if n == 0 {
        return;
    }
    let (b, dt) = bias.dense_ptr(be, "bias");
    be.launch(
        &be.k.add_bias,
        grid_for(n),
        BLOCK,
        &[
            Arg::Ptr(be.ptr(&out.data)),
            Arg::Ptr(b),
            Arg::I32(dt),
            Arg::U32(out.rows as u32),
            Arg::U32(out.cols as u32),
        ],
    );
}
