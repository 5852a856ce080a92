//! The prefill products through cuBLAS (`cublasGemmEx`, f32 accumulation
//! and output). Operands, per weight format:
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
//! names; the MoE layer's grouped path calls it per expert. It must not
//! synchronise with the host.

use std::ffi::c_void;

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use turbospark_backend::Quant;
use turbospark_backend::quant::scale_shift;

use crate::DeviceBuf;
use crate::kernels::{Arg, BLOCK, grid_for};
use crate::weight::{CudaWeight, Dense, WeightData};
use crate::{Cuda, CudaTensor, Precision};

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
pub fn weight_scratch(be: &Cuda, w: &CudaWeight, rows: usize) -> Option<DeviceBuf<u8>> {
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
    scratch: Option<&DeviceBuf<u8>>,
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
    scratch: Option<&DeviceBuf<u8>>,
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
            be.launch(&be.k.mxfp4_to_bf16, grid_for(groups * 4), BLOCK, &args);
            run_gemm(be, &GemmCall { a: wide, ..call });
        }
        WeightData::Quantized {
            quant,
            codes,
            scales,
            group,
        } => {
            assert!(k.is_multiple_of(32), "gemm: quantized rows of {k} values");
            let (kind, code_bytes) = match quant {
                Quant::Int8 => (0, first),
                Quant::Int4 => (1, first / 2),
            };
            let args = [
                Arg::Ptr(wide),
                Arg::Ptr(be.ptr(codes) + code_bytes),
                Arg::Ptr(be.ptr(scales) + first / *group as u64 * 2),
                Arg::U64(groups),
                Arg::I32(kind),
                Arg::U32(scale_shift(*group)),
            ];
            be.launch(&be.k.dequant_bf16, grid_for(groups * 4), BLOCK, &args);
            run_gemm(be, &GemmCall { a: wide, ..call });
        }
    }
}

/// `out = x · Wᵀ` for all of W: x converted to [`XType::of`]`(w)`, then
/// [`gemm_rows`].
/// `out = x · Wᵀ + beta · out`.
pub(crate) fn gemm(be: &Cuda, x: &CudaTensor, w: &CudaWeight, out: &mut CudaTensor, beta: f32) {
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
