//! `out = x · Wᵀ (+ bias)` for x `[n, k]` and W `[m, k]`, and the matvec
//! jobs of the MoE layer.
//!
//! Two regimes, as on the CPU. Decode (n < 4) is bound by reading W once:
//! the GEMV kernels (kernels/gemv.cu) read each weight row in its stored
//! format with 16-byte loads and dot it with every row of x, f32
//! accumulation. Prefill (n ≥ 4) is bound by arithmetic and goes to cuBLAS
//! (`cublasGemmEx`, f32 accumulation and output). Precision choice for that
//! path, per weight format:
//! - bf16: x is split into bf16 hi + lo (kernels/convert.cu) and the two
//!   bf16 × bf16 products are accumulated in f32: 16 significand bits of x,
//!   so results match f32 arithmetic on the same weights to ~1e-5 relative,
//!   at twice the cost of one bf16 tensor-core GEMM.
//! - MXFP4: dequantised exactly to a bf16 scratch copy, then as bf16.
//! - f32: plain f32 GEMM with `CUBLAS_COMPUTE_32F_PEDANTIC` (no TF32).
//! - f16: widened to an f32 scratch copy, then as f32 (splitting x into f16
//!   halves would overflow f16's range).
//! - int8/int4: dequantised (code · scale in f32, as the CPU) to an f32
//!   scratch copy, then as f32.
//!
//! It owns the choice of kernel; it must not synchronise with the host.

use std::ffi::c_void;

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};

use turbospark_backend::Quant;

use crate::kernels::{Arg, BLOCK, grid_for};
use crate::weight::{CudaWeight, Dense, WeightData};
use crate::{Cuda, CudaTensor, ops};

/// Below this many rows of x, weight bandwidth dominates: use the GEMV path.
pub const GEMM_MIN_ROWS: usize = 4;
/// Output rows per GEMV block (one warp each).
const GEMV_ROWS_PER_BLOCK: u32 = 8;

/// One GEMV launch (see kernels/gemv.cu): `jobs` blocks-columns, each
/// multiplying `nx` rows of x (starting at row `(job / x_div) · nx`) by the
/// `m` rows of expert `experts[job]` (all of W when `experts` is 0) into
/// rows `job · nx ..` of `out`.
pub struct GemvJob {
    pub out: u64,
    pub x: u64,
    pub experts: u64,
    pub jobs: u32,
    pub nx: u32,
    pub x_div: u32,
    pub k: u32,
    pub m: u32,
}

pub fn linear(
    be: &Cuda,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    out: &mut CudaTensor,
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
        // The kernel adds the bias.
        let job = GemvJob {
            out: be.ptr(&out.data),
            x: be.ptr(&x.data),
            experts: 0,
            jobs: 1,
            nx: n as u32,
            x_div: 1,
            k: k as u32,
            m: m as u32,
        };
        return gemv(be, w, bias, &job);
    }
    if k == 0 {
        be.stream
            .memset_zeros(&mut out.data)
            .unwrap_or_else(|e| panic!("CUDA: {e}"));
    } else {
        gemm(be, x, w, out);
    }
    if let Some(b) = bias {
        ops::add_bias(be, out, b);
    }
}

/// Launches the GEMV kernel for `w`'s format; the bias (dense, one value
/// per row of W, per expert) is added in the kernel.
pub fn gemv(be: &Cuda, w: &CudaWeight, bias: Option<&CudaWeight>, j: &GemvJob) {
    assert!(
        j.nx as usize <= 4 && j.nx > 0,
        "gemv: {} rows of x per job",
        j.nx
    );
    let blocks = j.m.div_ceil(GEMV_ROWS_PER_BLOCK);
    assert!(blocks <= 65535, "gemv: {} output rows exceed the grid", j.m);
    let (bias_ptr, bias_dt) = bias.map_or((0, 0), |b| b.dense_ptr(be, "bias"));
    let tail = [
        Arg::Ptr(bias_ptr),
        Arg::I32(bias_dt),
        Arg::Ptr(j.experts),
        Arg::U32(j.nx),
        Arg::U32(j.x_div),
        Arg::U32(j.k),
        Arg::U32(j.m),
    ];
    let grid = (j.jobs, blocks, 1);
    let threads = 32 * GEMV_ROWS_PER_BLOCK;
    let mut args = vec![Arg::Ptr(j.out), Arg::Ptr(j.x)];
    let f = match &w.data {
        WeightData::Dense { dtype, bytes } => {
            args.push(Arg::Ptr(be.ptr(bytes)));
            match dtype {
                Dense::F32 => &be.k.gemv_f32,
                Dense::Bf16 => &be.k.gemv_bf16,
                Dense::F16 => &be.k.gemv_f16,
            }
        }
        WeightData::Mxfp4 { blocks, scales } => {
            assert!(j.k.is_multiple_of(32), "gemv: MXFP4 rows of {} values", j.k);
            args.push(Arg::Ptr(be.ptr(blocks)));
            args.push(Arg::Ptr(be.ptr(scales)));
            &be.k.gemv_mxfp4
        }
        WeightData::Quantized {
            quant,
            codes,
            scales,
        } => {
            assert!(
                j.k.is_multiple_of(32),
                "gemv: quantized rows of {} values",
                j.k
            );
            args.push(Arg::Ptr(be.ptr(codes)));
            args.push(Arg::Ptr(be.ptr(scales)));
            match quant {
                Quant::Int8 => &be.k.gemv_q8,
                Quant::Int4 => &be.k.gemv_q4,
            }
        }
    };
    args.extend(tail);
    be.launch(f, grid, threads, &args);
}

/// `out = x · Wᵀ` through cuBLAS (column-major): outᵀ [m, n] = op(W) · xᵀ
/// with W seen as a k × m column-major matrix (transposed) and x as k × n.
fn gemm(be: &Cuda, x: &CudaTensor, w: &CudaWeight, out: &mut CudaTensor) {
    let (n, k, m) = (x.rows, x.cols, w.rows());
    let dims = [n, k, m];
    assert!(
        dims.iter().all(|&d| d <= i32::MAX as usize),
        "linear: {dims:?} exceed cuBLAS's int"
    );
    let mk = (m * k) as u64;
    let f32_call = GemmCall {
        a: 0,
        b: be.ptr(&x.data),
        c: be.ptr(&out.data),
        ty: cudaDataType::CUDA_R_32F,
        // No TF32 or other reduced-precision shortcut for f32 inputs.
        compute: cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
        beta: 0.0,
        mnk: (m as i32, n as i32, k as i32),
    };
    match &w.data {
        WeightData::Dense {
            dtype: Dense::F32,
            bytes,
        } => {
            run_gemm(
                be,
                &GemmCall {
                    a: be.ptr(bytes),
                    ..f32_call
                },
            );
        }
        WeightData::Dense {
            dtype: Dense::F16,
            bytes,
        } => {
            let wide = be.scratch::<f32>(mk as usize);
            let args = [
                Arg::Ptr(be.ptr(&wide)),
                Arg::Ptr(be.ptr(bytes)),
                Arg::I32(Dense::F16.code()),
                Arg::U64(mk),
            ];
            be.launch(&be.k.widen_f32, grid_for(mk), BLOCK, &args);
            run_gemm(
                be,
                &GemmCall {
                    a: be.ptr(&wide),
                    ..f32_call
                },
            );
        }
        WeightData::Dense {
            dtype: Dense::Bf16,
            bytes,
        } => {
            gemm_split_bf16(be, x, be.ptr(bytes), f32_call);
        }
        WeightData::Mxfp4 { blocks, scales } => {
            let wide = be.scratch::<u16>(mk as usize);
            let args = [
                Arg::Ptr(be.ptr(&wide)),
                Arg::Ptr(be.ptr(blocks)),
                Arg::Ptr(be.ptr(scales)),
                Arg::U64(mk),
            ];
            be.launch(&be.k.mxfp4_to_bf16, grid_for(mk), BLOCK, &args);
            gemm_split_bf16(be, x, be.ptr(&wide), f32_call);
        }
        WeightData::Quantized {
            quant,
            codes,
            scales,
        } => {
            let wide = be.scratch::<f32>(mk as usize);
            let kind = match quant {
                Quant::Int8 => 0,
                Quant::Int4 => 1,
            };
            let args = [
                Arg::Ptr(be.ptr(&wide)),
                Arg::Ptr(be.ptr(codes)),
                Arg::Ptr(be.ptr(scales)),
                Arg::U64(mk),
                Arg::I32(kind),
            ];
            be.launch(&be.k.dequant_f32, grid_for(mk), BLOCK, &args);
            run_gemm(
                be,
                &GemmCall {
                    a: be.ptr(&wide),
                    ..f32_call
                },
            );
        }
    }
}

/// W (bf16 at `w`) times x split into bf16 hi + lo: out = W·hi, out += W·lo.
fn gemm_split_bf16(be: &Cuda, x: &CudaTensor, w: u64, call: GemmCall) {
    let nk = (x.rows * x.cols) as u64;
    let hi = be.scratch::<u16>(nk as usize);
    let lo = be.scratch::<u16>(nk as usize);
    let args = [
        Arg::Ptr(be.ptr(&hi)),
        Arg::Ptr(be.ptr(&lo)),
        Arg::Ptr(be.ptr(&x.data)),
        Arg::U64(nk),
    ];
    be.launch(&be.k.split_bf16, grid_for(nk), BLOCK, &args);
    let bf16 = GemmCall {
        a: w,
        ty: cudaDataType::CUDA_R_16BF,
        compute: cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ..call
    };
    run_gemm(
        be,
        &GemmCall {
            b: be.ptr(&hi),
            beta: 0.0,
            ..bf16
        },
    );
    run_gemm(
        be,
        &GemmCall {
            b: be.ptr(&lo),
            beta: 1.0,
            ..bf16
        },
    );
}

/// C (f32, m × n, ld m) = 1 · op(A)ᵀ · B + beta · C with A (k × m, ld k) and
/// B (k × n, ld k) both of type `ty`.
#[derive(Clone, Copy)]
struct GemmCall {
    a: u64,
    b: u64,
    c: u64,
    ty: cudaDataType,
    compute: cublasComputeType_t,
    beta: f32,
    mnk: (i32, i32, i32),
}

fn run_gemm(be: &Cuda, g: &GemmCall) {
    let (m, n, k) = g.mnk;
    let alpha = 1.0f32;
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
            &g.beta as *const f32 as *const c_void,
            g.c as *mut c_void,
            cudaDataType::CUDA_R_32F,
            m,
            g.compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .unwrap_or_else(|e| panic!("cuBLAS GEMM [{m}x{k}]ᵀ·[{k}x{n}]: {e}"));
}
