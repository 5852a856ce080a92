//! The CUDA backend's products against the CPU reference: `linear` (GEMV
//! and GEMM regimes, every weight format), several weights in one launch
//! (`linears`), the input norm read through the projections
//! (`rms_norm_linears`), the output projection into the residual stream
//! (`linear_add`) and the streamed GEMVs (MoE: parity_moe.rs). Both
//! backends get the same weight bytes. Tolerances:
//! `common/tolerances.rs`.
//!
//! Without a CUDA device each test prints "skipped: no CUDA device" and
//! passes.

use turbospark_backend::{Backend, Quant};
use turbospark_cpu::{Cpu, CpuTensor, CpuWeight};
use turbospark_cuda::{Cuda, CudaTensor, CudaWeight, Precision};
use turbospark_format::{Activation, DType};

mod common;

use common::*;

/// One linear on both backends; bias of `bias` dtype when given.
fn linear_case(
    g: &Cuda,
    rng: &mut Rng,
    w: &(CpuWeight, CudaWeight),
    n: usize,
    bias: Option<DType>,
    what: &str,
) {
    let (k, m) = (w.0.cols(), w.0.rows());
    let b = bias.map(|dt| weight(g, &rng.vec(m, 1.0), &[m], dt));
    let (cx, gx) = tensors(g, &rng.vec(n * k, 1.0), n, k);
    let (mut c, mut o) = (Cpu.tensor(n, m), g.tensor(n, m));
    Cpu.linear(&cx, &w.0, b.as_ref().map(|b| &b.0), &mut c);
    g.linear(&gx, &w.1, b.as_ref().map(|b| &b.1), &mut o);
    let tol = linear_tol(g, &w.1, n);
    check(
        &format!("linear {what} n={n} k={k} m={m} bias={bias:?}"),
        g,
        &o,
        &c,
        tol,
    );
}

#[test]
fn linear_dense_formats_in_both_regimes() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(7);
    for (k, m) in [(7, 5), (33, 70), (64, 130), (2880, 96)] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let w = weight(&g, &rng.vec(m * k, 0.5), &[m, k], dtype);
            for n in [1, 3, 5, 64] {
                for bias in [None, Some(DType::F32), Some(DType::BF16)] {
                    linear_case(&g, &mut rng, &w, n, bias, &format!("{dtype:?}"));
                }
            }
        }
    }
}

/// In both precisions: one row of x takes the integer-activation kernels
/// in `Bf16`, the f32 ones in `F32`. 40,000 rows are more blocks of work
/// than fit on an H200 at once, so the persistent integer-activation
/// blocks take three turns each; 12,000 rows of 4,096 take two turns of
/// two iterations of loads a lane.
#[test]
fn linear_grouped_formats_in_both_regimes() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(8);
    for (precision, k, m) in [
        (Precision::Bf16, 32, 5),
        (Precision::Bf16, 64, 70),
        (Precision::Bf16, 2880, 96),
        (Precision::Bf16, 14336, 40),
        (Precision::Bf16, 64, 40_000),
        (Precision::Bf16, 4096, 12_000),
        (Precision::F32, 64, 70),
        (Precision::F32, 2880, 96),
    ] {
        g.set_precision(precision);
        let mut formats = vec![("mxfp4".to_string(), mxfp4(&g, &mut rng, &[m], k))];
        // 128-value scales where the rows take them (2,880: 64; 32: 32).
        for (q, group) in [
            (Quant::Int8, 32),
            (Quant::Int4, 32),
            (Quant::Int8, 128),
            (Quant::Int4, 128),
        ] {
            formats.push((
                format!("{q:?}/{group}"),
                quantized(&g, &rng.vec(m * k, 0.5), [m, k], q, group),
            ));
        }
        for (name, w) in &formats {
            for n in [1, 3, 5, 64] {
                let what = format!("{name} {precision:?}");
                linear_case(&g, &mut rng, w, n, Some(DType::BF16), &what);
            }
        }
    }
}

type Pair = (CpuWeight, CudaWeight);

/// Weights `[m, k]` of format `fmt` (bf16, f32, mxfp4, int8, int4; int8
/// and int4 with 32-value scales, or `int8/128` and `int4/128` with 128)
/// for each m, and a bf16 bias for every part but the second.
fn weight_set(
    g: &Cuda,
    rng: &mut Rng,
    fmt: &str,
    k: usize,
    ms: &[usize],
) -> (Vec<Pair>, Vec<Option<Pair>>) {
    let ws = ms
        .iter()
        .map(|&m| match fmt {
            "bf16" => weight(g, &rng.vec(m * k, 0.5), &[m, k], DType::BF16),
            "f32" => weight(g, &rng.vec(m * k, 0.5), &[m, k], DType::F32),
            "mxfp4" => mxfp4(g, rng, &[m], k),
            "int8" => quantized(g, &rng.vec(m * k, 0.5), [m, k], Quant::Int8, 32),
            "int8/128" => quantized(g, &rng.vec(m * k, 0.5), [m, k], Quant::Int8, 128),
            "int4/128" => quantized(g, &rng.vec(m * k, 0.5), [m, k], Quant::Int4, 128),
            _ => quantized(g, &rng.vec(m * k, 0.5), [m, k], Quant::Int4, 32),
        })
        .collect();
    let biases = ms
        .iter()
        .enumerate()
        .map(|(i, &m)| (i != 1).then(|| weight(g, &rng.vec(m, 1.0), &[m], DType::BF16)))
        .collect();
    (ws, biases)
}

/// The GPU side of a [`weight_set`], as `linears` takes it.
fn gpu_parts<'a>(
    ws: &'a [Pair],
    biases: &'a [Option<Pair>],
) -> Vec<(&'a CudaWeight, Option<&'a CudaWeight>)> {
    ws.iter()
        .zip(biases)
        .map(|(w, b)| (&w.1, b.as_ref().map(|b| &b.1)))
        .collect()
}

/// Each of `outs` against the CPU's `x · Wᵢᵀ + biasᵢ` for the parts of a
/// [`weight_set`], at the GEMV bounds of `x`'s row count.
fn check_parts(
    g: &Cuda,
    x: &CpuTensor,
    ws: &[Pair],
    biases: &[Option<Pair>],
    outs: &[CudaTensor],
    what: &str,
) {
    let n = Cpu.shape(x).0;
    for (i, ((w, b), out)) in ws.iter().zip(biases).zip(outs).enumerate() {
        let mut c = Cpu.tensor(n, w.0.rows());
        Cpu.linear(x, &w.0, b.as_ref().map(|b| &b.0), &mut c);
        check(
            &format!("{what} part {i}"),
            g,
            out,
            &c,
            gemv_tol(g, &w.1, n),
        );
    }
}

/// Several weights in one GEMV launch (`linears`: q/k/v, gate/up) give each
/// weight its own product: segments of odd row counts (padded to a warp's
/// rows), every format, biases on some parts, 1 and 3 rows of x; and large
/// segments (one warp per row).
#[test]
fn linears_share_one_launch_per_format() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(24);
    for (k, ms) in [(64, vec![37, 5, 12]), (2880, vec![4096, 512, 512])] {
        for fmt in ["bf16", "f32", "mxfp4", "int8", "int4"] {
            let (ws, biases) = weight_set(&g, &mut rng, fmt, k, &ms);
            let parts = gpu_parts(&ws, &biases);
            for n in [1, 3] {
                let (cx, gx) = tensors(&g, &rng.vec(n * k, 1.0), n, k);
                let mut outs: Vec<CudaTensor> = ms.iter().map(|&m| g.tensor(n, m)).collect();
                g.linears(&gx, &parts, &mut outs.iter_mut().collect::<Vec<_>>());
                let what = format!("linears {fmt} k={k} n={n}");
                check_parts(&g, &cx, &ws, &biases, &outs, &what);
            }
        }
    }
}

/// A block's input norm and its first projections (`rms_norm_linears`):
/// one row of x takes the fused GEMVs (dense: w_norm · x staged in shared
/// memory; integer activations: w_norm · x rounded, the norm's factor
/// applied to each sum), with and without the normed row written out
/// (block (0, 0)'s copy); 3 rows and `Precision::F32`'s grouped formats
/// take the norm kernel, then `linears`. x has rms 3 and the norm weights
/// rms 2, so a missing norm, factor or weight is off by far more than the
/// tolerances; widths 64, 2880 (gpt-oss) and 4096 (Llama); bf16 and f32
/// norm weights.
#[test]
fn rms_norm_linears_reads_x_through_the_norm() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(23);
    for precision in [Precision::Bf16, Precision::F32] {
        g.set_precision(precision);
        for (k, ms) in [(64, vec![37, 5]), (2880, vec![512, 32]), (4096, vec![1024])] {
            for fmt in [
                "bf16", "f32", "mxfp4", "int8", "int4", "int8/128", "int4/128",
            ] {
                let (ws, biases) = weight_set(&g, &mut rng, fmt, k, &ms);
                let parts = gpu_parts(&ws, &biases);
                // f32 norm weights are how Gemma's (1 + w) norms arrive.
                let dt = if k == 2880 { DType::F32 } else { DType::BF16 };
                let (cn, gn) = weight(&g, &rng.vec(k, 2.0), &[k], dt);
                for (n, write_normed) in [(1, true), (1, false), (3, true)] {
                    let (cx, gx) = tensors(&g, &rng.vec(n * k, 3.0), n, k);
                    let mut normed = Cpu.tensor(n, k);
                    Cpu.rms_norm(&cx, &cn, 1e-5, &mut normed);
                    let mut outs: Vec<CudaTensor> = ms.iter().map(|&m| g.tensor(n, m)).collect();
                    let mut g_normed = g.tensor(n, k);
                    g.rms_norm_linears(
                        &gx,
                        &gn,
                        1e-5,
                        &parts,
                        &mut outs.iter_mut().collect::<Vec<_>>(),
                        write_normed.then_some(&mut g_normed),
                    );
                    let what = format!("rms_norm_linears {fmt} {precision:?} k={k} n={n}");
                    if write_normed {
                        check(&format!("{what} normed"), &g, &g_normed, &normed, F32_TOL);
                    }
                    check_parts(&g, &normed, &ws, &biases, &outs, &what);
                }
            }
        }
    }
}

/// A gated MLP's input norm, gate and up projections and activation
/// (`rms_norm_glu`): one row of x takes one GEMV launch that interleaves
/// the gate and up rows and writes silu(gate) · up or gelu_tanh(gate) · up
/// (odd heights, every format, a bias on gate, both precisions); 3 rows
/// take the norm kernel, the GEMVs and the glu kernel. Against the CPU's
/// norm, products and activation at three times the GEMV bounds: the
/// activation's error adds the gate's and the up's, and over 1,024
/// outputs of int8 x the largest measured 5.6e-2 of the rms (int8 weights)
/// to 6.6e-2 (int4 with 128-value scales, whose coarser weights make
/// the output's rms smaller beside the same x rounding), where a scale
/// read from the wrong group gives NaN or far more.
#[test]
fn rms_norm_glu_writes_the_activation() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(28);
    for precision in [Precision::Bf16, Precision::F32] {
        g.set_precision(precision);
        for (k, m) in [(64, 37), (2880, 101), (4096, 1024)] {
            for fmt in [
                "bf16", "f32", "mxfp4", "int8", "int4", "int8/128", "int4/128",
            ] {
                let (ws, biases) = weight_set(&g, &mut rng, fmt, k, &[m, m]);
                let parts = gpu_parts(&ws, &biases);
                let (cn, gn) = weight(&g, &rng.vec(k, 2.0), &[k], DType::BF16);
                // Up's bias only with silu: both with and without one run.
                let up_bias = weight(&g, &rng.vec(m, 1.0), &[m], DType::BF16);
                for act in [Activation::Silu, Activation::GeluTanh] {
                    let ub = (act == Activation::Silu).then_some(&up_bias);
                    for n in [1, 3] {
                        let (cx, gx) = tensors(&g, &rng.vec(n * k, 1.0), n, k);
                        let cparts = [
                            (&ws[0].0, biases[0].as_ref().map(|b| &b.0)),
                            (&ws[1].0, ub.map(|b| &b.0)),
                        ];
                        let up = (parts[1].0, ub.map(|b| &b.1));
                        let mut c = Cpu.tensor(n, m);
                        Cpu.rms_norm_glu(&cx, &cn, 1e-5, cparts[0], cparts[1], act, &mut c);
                        let mut o = g.tensor(n, m);
                        g.rms_norm_glu(&gx, &gn, 1e-5, parts[0], up, act, &mut o);
                        let what = format!("rms_norm_glu {fmt} {precision:?} {act:?} k={k} n={n}");
                        check(&what, &g, &o, &c, 3.0 * gemv_tol(&g, &ws[0].1, n));
                    }
                }
            }
        }
    }
}

/// An output projection into the residual stream (`linear_add`): the
/// one-row and three-row GEMVs add into the accumulator as they store, the
/// GEMM (5 and 64 rows) with beta = 1; biases included. What is checked is
/// the change of the accumulator (rms 3 before) against the CPU's product,
/// so the product's own error is what the tolerance bounds.
#[test]
fn linear_add_accumulates_the_product() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(26);
    for (k, m) in [(64, 37), (2880, 512)] {
        for fmt in ["bf16", "f32", "mxfp4", "int8", "int4"] {
            let (ws, biases) = weight_set(&g, &mut rng, fmt, k, &[m]);
            let (w, b) = (&ws[0], biases[0].as_ref());
            for n in [1, 3, 5, 64] {
                let (cx, gx) = tensors(&g, &rng.vec(n * k, 1.0), n, k);
                let before = rng.vec(n * m, 3.0);
                let (_, mut acc) = tensors(&g, &before, n, m);
                g.linear_add(&gx, &w.1, b.map(|b| &b.1), &mut acc);
                let delta: Vec<f32> = g
                    .to_host(&acc)
                    .iter()
                    .zip(&before)
                    .map(|(a, b)| a - b)
                    .collect();
                let (_, delta) = tensors(&g, &delta, n, m);
                let mut c = Cpu.tensor(n, m);
                Cpu.linear(&cx, &w.0, b.map(|b| &b.0), &mut c);
                let tol = linear_tol(&g, &w.1, n);
                check(
                    &format!("linear_add {fmt} k={k} m={m} n={n}"),
                    &g,
                    &delta,
                    &c,
                    tol,
                );
            }
        }
    }
}

/// The streamed one-row GEMVs (bf16/f16 weights copied to a shared-memory
/// ring by bulk copies; kernels/gemv_dense.cu) with every edge they serve,
/// streamed and not (`set_stream_gemv`), against the CPU: a plain linear
/// and one into the residual stream (bias, residual add), three segments
/// read through a norm (normed row written), and a gate/up pair with each
/// activation. The shapes give an H200's blocks (132 SMs) the 12 stages
/// of 2,048 values a block that the streamed kernel is taken for
/// (src/gemv.rs), with rows cut into stages every way: 4,104 (two whole
/// stages and 8 values), 2,100 (a short last stage), 2,880 (gpt-oss).
#[test]
fn streamed_gemvs_equal_the_cpus() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(29);
    for stream in [true, false] {
        g.set_stream_gemv(stream);
        for dt in [DType::BF16, DType::F16] {
            let what = |op: &str, k: usize| format!("streamed={stream} {op} {dt:?} k={k}");
            for (k, m) in [(4104, 3500), (2100, 6001)] {
                let w = weight(&g, &rng.vec(m * k, 0.5), &[m, k], dt);
                linear_case(&g, &mut rng, &w, 1, Some(DType::BF16), &what("linear", k));
                let b = weight(&g, &rng.vec(m, 1.0), &[m], DType::F32);
                let (cx, gx) = tensors(&g, &rng.vec(k, 1.0), 1, k);
                let before = rng.vec(m, 3.0);
                let (mut c, mut acc) = tensors(&g, &before, 1, m);
                Cpu.linear_add(&cx, &w.0, Some(&b.0), &mut c);
                g.linear_add(&gx, &w.1, Some(&b.1), &mut acc);
                check(
                    &what("linear_add", k),
                    &g,
                    &acc,
                    &c,
                    linear_tol(&g, &w.1, 1),
                );
            }
            let k = 2880;
            let ms = [4097, 1031, 1031];
            let ws: Vec<Pair> = ms
                .iter()
                .map(|&m| weight(&g, &rng.vec(m * k, 0.5), &[m, k], dt))
                .collect();
            let biases: Vec<Option<Pair>> = ms
                .iter()
                .enumerate()
                .map(|(i, &m)| (i != 1).then(|| weight(&g, &rng.vec(m, 1.0), &[m], DType::BF16)))
                .collect();
            let (cn, gn) = weight(&g, &rng.vec(k, 2.0), &[k], DType::BF16);
            let (cx, gx) = tensors(&g, &rng.vec(k, 3.0), 1, k);
            let mut normed = Cpu.tensor(1, k);
            Cpu.rms_norm(&cx, &cn, 1e-5, &mut normed);
            let mut outs: Vec<CudaTensor> = ms.iter().map(|&m| g.tensor(1, m)).collect();
            let mut g_normed = g.tensor(1, k);
            g.rms_norm_linears(
                &gx,
                &gn,
                1e-5,
                &gpu_parts(&ws, &biases),
                &mut outs.iter_mut().collect::<Vec<_>>(),
                Some(&mut g_normed),
            );
            check(&what("normed", k), &g, &g_normed, &normed, F32_TOL);
            check_parts(
                &g,
                &normed,
                &ws,
                &biases,
                &outs,
                &what("rms_norm_linears", k),
            );
            let (k, m) = (2100, 3001);
            let (ws, biases) = (
                [0, 1].map(|_| weight(&g, &rng.vec(m * k, 0.5), &[m, k], dt)),
                weight(&g, &rng.vec(m, 1.0), &[m], DType::BF16),
            );
            let (cn, gn) = weight(&g, &rng.vec(k, 2.0), &[k], DType::BF16);
            for act in [Activation::Silu, Activation::GeluTanh] {
                let (cx, gx) = tensors(&g, &rng.vec(k, 1.0), 1, k);
                let mut c = Cpu.tensor(1, m);
                let (gate, up) = ((&ws[0].0, Some(&biases.0)), (&ws[1].0, None));
                Cpu.rms_norm_glu(&cx, &cn, 1e-5, gate, up, act, &mut c);
                let mut o = g.tensor(1, m);
                let (gate, up) = ((&ws[0].1, Some(&biases.1)), (&ws[1].1, None));
                g.rms_norm_glu(&gx, &gn, 1e-5, gate, up, act, &mut o);
                let tol = 2.0 * gemv_tol(&g, &ws[0].1, 1);
                check(&what(&format!("rms_norm_glu {act:?}"), k), &g, &o, &c, tol);
            }
        }
    }
}

/// Runs `op` with the streamed GEMV kernels and without, on the same
/// inputs: (streamed, unstreamed) outputs.
fn both_ways(
    g: &mut Cuda,
    op: impl Fn(&Cuda) -> Vec<CudaTensor>,
) -> (Vec<CudaTensor>, Vec<CudaTensor>) {
    g.set_stream_gemv(true);
    let streamed = op(g);
    g.set_stream_gemv(false);
    let plain = op(g);
    g.set_stream_gemv(true);
    (streamed, plain)
}

/// Streamed and unstreamed integer GEMVs add the same integer group sums
/// (x rounded the same way); only the order of their float sums differs.
const STREAMED_QX_TOL: f32 = 2e-5;

fn same_both_ways(g: &Cuda, (s, p): &(Vec<CudaTensor>, Vec<CudaTensor>), what: &str) {
    for (i, (s, p)) in s.iter().zip(p).enumerate() {
        let err = rel_err(&g.to_host(s), &g.to_host(p));
        assert!(
            err <= STREAMED_QX_TOL,
            "{what} part {i}: streamed against unstreamed max|Δ|/rms = {err}"
        );
    }
}

/// The streamed int8 GEMVs (kernels/gemv_grouped_stream.cu) against the
/// CPU, and tighter against the integer-activation kernels they stand in
/// for: stages of 8 whole rows (k = 4,096 and 3,072) and of 2 (k =
/// 14,336); a plain linear, one into the residual stream, three segments
/// whose boundaries cut stages (q/k/v) behind a fused norm, gate/up pairs
/// of an odd height with their activation, and a launch with as many rows
/// a block as an lm_head has (100,000 rows: ~760 a block, 95 stages
/// through a ring of 16); with 32- and 128-value scales.
#[test]
fn streamed_integer_gemvs_equal_the_cpus_and_the_unstreamed() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(31);
    // 32-value scales, and 128 (a quarter of the scale bytes in the ring;
    // k = 2,560 does not stream with them: 40 bytes of scales a row).
    for fmt in ["int8", "int8/128"] {
        let what = |op: &str, k: usize| format!("streamed {op} {fmt} k={k}");
        streamed_linear(&mut g, &mut rng, fmt, 4096, 5000, &what("linear", 4096));

        let (k, m) = (14336, 1500);
        let (ws, _) = weight_set(&g, &mut rng, fmt, k, &[m]);
        let b = weight(&g, &rng.vec(m, 1.0), &[m], DType::F32);
        let (cx, gx) = tensors(&g, &rng.vec(k, 1.0), 1, k);
        let before = rng.vec(m, 3.0);
        let mut c = Cpu.tensor(1, m);
        c.data.copy_from_slice(&before);
        Cpu.linear_add(&cx, &ws[0].0, Some(&b.0), &mut c);
        let outs = both_ways(&mut g, |g| {
            let mut acc = tensors(g, &before, 1, m).1;
            g.linear_add(&gx, &ws[0].1, Some(&b.1), &mut acc);
            vec![acc]
        });
        same_both_ways(&g, &outs, &what("linear_add", k));
        check(
            &what("linear_add", k),
            &g,
            &outs.0[0],
            &c,
            gemv_tol(&g, &ws[0].1, 1),
        );

        let (k, ms) = (3072, [4097, 1031, 1031]);
        let (ws, biases) = weight_set(&g, &mut rng, fmt, k, &ms);
        let (cn, gn) = weight(&g, &rng.vec(k, 2.0), &[k], DType::BF16);
        let (cx, gx) = tensors(&g, &rng.vec(k, 3.0), 1, k);
        let mut normed = Cpu.tensor(1, k);
        Cpu.rms_norm(&cx, &cn, 1e-5, &mut normed);
        let outs = both_ways(&mut g, |g| {
            let mut outs: Vec<CudaTensor> = ms.iter().map(|&m| g.tensor(1, m)).collect();
            let mut g_normed = g.tensor(1, k);
            let mut refs: Vec<&mut CudaTensor> = outs.iter_mut().collect();
            let parts = gpu_parts(&ws, &biases);
            g.rms_norm_linears(&gx, &gn, 1e-5, &parts, &mut refs, Some(&mut g_normed));
            outs.push(g_normed);
            outs
        });
        same_both_ways(&g, &outs, &what("rms_norm_linears", k));
        let (outs_s, normed_s) = outs.0.split_at(ms.len());
        check(&what("normed", k), &g, &normed_s[0], &normed, F32_TOL);
        check_parts(
            &g,
            &normed,
            &ws,
            &biases,
            outs_s,
            &what("rms_norm_linears", k),
        );

        let (k, m) = (2560, 1001);
        let (ws, biases) = weight_set(&g, &mut rng, fmt, k, &[m, m]);
        let (cn, gn) = weight(&g, &rng.vec(k, 2.0), &[k], DType::BF16);
        for act in [Activation::Silu, Activation::GeluTanh] {
            let (cx, gx) = tensors(&g, &rng.vec(k, 1.0), 1, k);
            let mut c = Cpu.tensor(1, m);
            let cparts = [
                (&ws[0].0, biases[0].as_ref().map(|b| &b.0)),
                (&ws[1].0, None),
            ];
            Cpu.rms_norm_glu(&cx, &cn, 1e-5, cparts[0], cparts[1], act, &mut c);
            let outs = both_ways(&mut g, |g| {
                let parts = gpu_parts(&ws, &biases);
                let mut o = g.tensor(1, m);
                g.rms_norm_glu(&gx, &gn, 1e-5, parts[0], parts[1], act, &mut o);
                vec![o]
            });
            let op = format!("rms_norm_glu {act:?}");
            same_both_ways(&g, &outs, &what(&op, k));
            check(
                &what(&op, k),
                &g,
                &outs.0[0],
                &c,
                2.0 * gemv_tol(&g, &ws[0].1, 1),
            );
        }

        // Last, so that the cases above keep the random inputs they were
        // written with.
        let what = what("long linear", 1024);
        streamed_linear(&mut g, &mut rng, fmt, 1024, 100_000, &what);
    }
}

/// One plain linear of `m` rows of `k` values in format `fmt`, streamed
/// and not, against each other and the CPU.
fn streamed_linear(g: &mut Cuda, rng: &mut Rng, fmt: &str, k: usize, m: usize, what: &str) {
    let (ws, biases) = weight_set(g, rng, fmt, k, &[m]);
    let (cx, gx) = tensors(g, &rng.vec(k, 1.0), 1, k);
    let outs = both_ways(g, |g| {
        let mut o = g.tensor(1, m);
        g.linear(&gx, &ws[0].1, biases[0].as_ref().map(|b| &b.1), &mut o);
        vec![o]
    });
    same_both_ways(g, &outs, what);
    check_parts(g, &cx, &ws, &biases, &outs.0, what);
}
