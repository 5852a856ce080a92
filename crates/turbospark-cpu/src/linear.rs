//! `out = x · Wᵀ + b` on the CPU, for x `[n, k]` and W `[m, k]` in f32, bf16
//! or f16.
//!
//! Two regimes, chosen per weight format by the number of x rows
//! (`gemm_min_rows`). Decode (few rows) is bound by reading W once: each thread takes
//! a band of W's rows and runs the SIMD dot kernel against every x row, so
//! 16-bit weights are read as 16-bit (and int8/int4 multiply x's rows
//! rounded once to integer codes, `quant.rs`). Prefill (many rows) is bound by
//! arithmetic: each thread widens a block of W's rows to f32 once and hands
//! the block to the `gemm` crate's packed micro-kernels, so the conversion is
//! paid once per block rather than once per token.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::weight::{CpuWeight, WeightData};

/// The fewest rows of x that take the GEMM path for `w`: below it the dot
/// path, which reads each weight row once from memory and multiplies it by
/// every x row from L1, is faster than widening the weights and a GEMM.
/// Measured on the developers' 2-core Xeon (a 16,384 × 2,048 weight, 1 to 32
/// rows, both paths forced; BENCHMARKS.md, thirty-ninth session): the
/// integer dots of int8, int4 and MXFP4 equal the GEMM at ~16-20 rows
/// (int4 at 16: 13.9 against 17.1 ms), the f32 dots of 16-bit weights at
/// ~12 (bf16 at 8: 9.2 against 11.0 ms). MXFP4, whose dot path takes four
/// x rows a call and looks each block up once for them, equals the GEMM at
/// ~28 (fortieth session: 24 rows 17.0 against 17.6 ms, 32 rows 23.2
/// against 21.8). A reference weight that widens
/// its rows for f32 x ([`CpuWeight::with_f32_x`]) widens them again for
/// every x row, so it keeps to the dot path only below 4.
fn gemm_min_rows(w: &CpuWeight) -> usize {
    match &w.data {
        WeightData::Mxfp4 { int_x: true, .. } => 28,
        WeightData::Quantized { int_x: true, .. } => 16,
        WeightData::Quantized { .. } => 4,
        _ => 12,
    }
}
/// Rows of W per parallel task in the dot path.
const DOT_BAND: usize = 16;
/// Rows of x a dot-path call takes together ([`CpuWeight::dot_row_inputs`]).
const X_ROWS: usize = 4;
/// Rows of W widened and multiplied together in the GEMM path.
const GEMM_BLOCK: usize = 64;

/// A raw output pointer shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a disjoint set of columns of the output.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// A method (not a field access) so closures capture the whole `Send`
    /// wrapper rather than the raw pointer inside it.
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

pub fn linear(x: &[f32], n: usize, w: &CpuWeight, bias: Option<&[f32]>, out: &mut [f32]) {
    linear_rows(x, n, w, 0, w.rows(), bias, out);
}

/// [`linear`] with only rows `row0..row0 + m` of W (one expert of a
/// stacked `[experts, rows, cols]` weight).
pub fn linear_rows(
    x: &[f32],
    n: usize,
    w: &CpuWeight,
    row0: usize,
    m: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let k = w.cols();
    assert_eq!(x.len(), n * k, "linear: x is not [n, {k}]");
    assert_eq!(out.len(), n * m, "linear: out is not [n, {m}]");
    if n < gemm_min_rows(w) {
        linear_dot(x, k, row0, m, w, out);
    } else {
        linear_gemm(x, n, k, row0, m, w, out);
    }
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(m) {
            for (o, &bv) in row.iter_mut().zip(b) {
                *o += bv;
            }
        }
    }
}

fn linear_dot(x: &[f32], k: usize, row0: usize, m: usize, w: &CpuWeight, out: &mut [f32]) {
    let ptr = OutPtr(out.as_mut_ptr());
    let inputs: Vec<_> = x.chunks_exact(k).map(|row| w.input(row)).collect();
    (0..m.div_ceil(DOT_BAND)).into_par_iter().for_each(|band| {
        let rows = band * DOT_BAND..((band + 1) * DOT_BAND).min(m);
        // x rows four at a time (a format that can share work between them
        // does, `dot_row_inputs`), each group against the band's weight
        // rows while it is in L1 (the rows come from L2 after the first
        // group: they are the smaller side, 4 to 16 bits a value against
        // x's 16 to 32), then the rest one at a time.
        let mut t = 0;
        while t + X_ROWS <= inputs.len() {
            let xs = std::array::from_fn::<_, X_ROWS, _>(|i| &inputs[t + i]);
            for r in rows.clone() {
                for (i, v) in w.dot_row_inputs(row0 + r, xs).into_iter().enumerate() {
                    // SAFETY: (t + i, r) is written by exactly this task.
                    unsafe { *ptr.at((t + i) * m + r) = v };
                }
            }
            t += X_ROWS;
        }
        for r in rows {
            for (t, input) in inputs.iter().enumerate().skip(t) {
                let v = w.dot_row(row0 + r, input);
                // SAFETY: (t, r) is written by exactly this task.
                unsafe { *ptr.at(t * m + r) = v };
            }
        }
    });
}

fn linear_gemm(
    x: &[f32],
    n: usize,
    k: usize,
    row0: usize,
    m: usize,
    w: &CpuWeight,
    out: &mut [f32],
) {
    let ptr = OutPtr(out.as_mut_ptr());
    (0..m.div_ceil(GEMM_BLOCK))
        .into_par_iter()
        .for_each(|block| {
            let r0 = block * GEMM_BLOCK;
            let rows = GEMM_BLOCK.min(m - r0);
            let run = |wblock: &[f32]| {
                // dst[t, j] = Σ_kk x[t, kk] · W[r0 + j, kk]; dst is out's columns
                // r0..r0+rows with row stride m.
                // SAFETY: all pointers and strides describe in-bounds matrices:
                // x is [n, k], wblock is [rows, k], the dst block lies inside out.
                unsafe {
                    gemm::gemm(
                        n,
                        rows,
                        k,
                        ptr.at(r0),
                        1,
                        m as isize,
                        false,
                        x.as_ptr(),
                        1,
                        k as isize,
                        wblock.as_ptr(),
                        k as isize,
                        1,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    );
                }
            };
            let first = (row0 + r0) * k;
            match &w.data {
                WeightData::F32(v) => run(&v[first..first + rows * k]),
                _ => SCRATCH.with(|s| {
                    let mut s = s.borrow_mut();
                    s.resize(rows * k, 0.0);
                    w.read_f32(first, &mut s[..rows * k]);
                    run(&s[..rows * k]);
                }),
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], n: usize, w: &[f32], m: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0.0; n * m];
        for t in 0..n {
            for r in 0..m {
                let mut s = 0.0f64;
                for i in 0..k {
                    s += x[t * k + i] as f64 * w[r * k + i] as f64;
                }
                out[t * m + r] = s as f32;
            }
        }
        out
    }

    #[test]
    fn both_regimes_match_a_plain_loop_for_every_dtype() {
        for &(n, m, k) in &[(1, 5, 7), (3, 70, 33), (4, 65, 40), (13, 130, 64)] {
            let x: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
                .collect();
            let wv: Vec<f32> = (0..m * k)
                .map(|i| ((i * 11 % 17) as f32 - 8.0) / 7.0)
                .collect();
            // Round through bf16 so every format holds the same values.
            let wv: Vec<f32> = wv
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect();
            let expected = reference(&x, n, &wv, m, k);
            let shape = vec![m, k];
            let weights = [
                CpuWeight {
                    data: WeightData::F32(wv.clone().into()),
                    shape: shape.clone(),
                },
                CpuWeight {
                    data: WeightData::BF16(
                        wv.iter()
                            .map(|&v| half::bf16::from_f32(v).to_bits())
                            .collect(),
                    ),
                    shape: shape.clone(),
                },
                CpuWeight {
                    data: WeightData::F16(
                        wv.iter()
                            .map(|&v| half::f16::from_f32(v).to_bits())
                            .collect(),
                    ),
                    shape: shape.clone(),
                },
            ];
            let bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.5).collect();
            for w in &weights {
                let mut out = vec![0.0; n * m];
                linear(&x, n, w, Some(&bias), &mut out);
                for (i, (&o, &e)) in out.iter().zip(&expected).enumerate() {
                    let e = e + bias[i % m];
                    assert!(
                        (o - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "n={n} m={m} k={k} i={i}: {o} vs {e}"
                    );
                }
            }
        }
    }

    /// int8/int4 weights: both regimes against a plain loop over the
    /// dequantized weights. The dot regime (1-15 rows) multiplies x rounded
    /// to int8 codes, so it may differ by x's rounding: at most half a step
    /// (max|x| / 127 of the group) times |w| per value; the GEMM regime
    /// (16+ rows) widens the weights and multiplies f32 x, as the dot regime
    /// of a weight made `with_f32_x` does.
    #[test]
    fn quantized_weights_match_a_plain_loop_in_both_regimes() {
        use turbospark_backend::{Quant, quant::quantize};
        // Mostly positive weights and x, so that the sums do not cancel and
        // an x rounded to the wrong scale (a few percent off) shows.
        let (m, k) = (37, 96);
        let wv: Vec<f32> = (0..m * k)
            .map(|i| ((i * 11 % 17) as f32 - 2.0) / 7.0)
            .collect();
        for q in [Quant::Int8, Quant::Int4] {
            let (codes, scales) = quantize(&wv, q, 32).unwrap();
            let w = CpuWeight {
                data: WeightData::Quantized {
                    quant: q,
                    codes,
                    scales,
                    group: 32,
                    int_x: true,
                },
                shape: vec![m, k],
            };
            let mut wd = vec![0.0; m * k];
            w.read_f32(0, &mut wd);
            let WeightData::Quantized { codes, scales, .. } = &w.data else {
                unreachable!()
            };
            let exact = CpuWeight {
                data: WeightData::Quantized {
                    quant: q,
                    codes: codes.clone(),
                    scales: scales.clone(),
                    group: 32,
                    int_x: true,
                },
                shape: vec![m, k],
            }
            .with_f32_x();
            let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 1.0) / 5.0).collect();
            let mut out = vec![0.0; m];
            linear(&x, 1, &exact, None, &mut out);
            for (i, (&o, &e)) in out.iter().zip(&reference(&x, 1, &wd, m, k)).enumerate() {
                assert!(
                    (o - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{q:?} with f32 x, row {i}: {o} vs {e}"
                );
            }
            for n in [1, 3, 17] {
                let x: Vec<f32> = (0..n * k)
                    .map(|i| ((i * 7 % 13) as f32 - 1.0) / 5.0)
                    .collect();
                let expected = reference(&x, n, &wd, m, k);
                let mut out = vec![0.0; n * m];
                linear(&x, n, &w, None, &mut out);
                for (i, (&o, &e)) in out.iter().zip(&expected).enumerate() {
                    let (t, r) = (i / m, i % m);
                    let xr = &x[t * k..(t + 1) * k];
                    let rounding: f32 = if n < gemm_min_rows(&w) {
                        (0..k)
                            .map(|c| {
                                let g = &xr[c / 32 * 32..c / 32 * 32 + 32];
                                let step = g.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
                                wd[r * k + c].abs() * step * 0.5
                            })
                            .sum()
                    } else {
                        0.0
                    };
                    assert!(
                        (o - e).abs() <= rounding + 1e-4 * (1.0 + e.abs()),
                        "{q:?} n={n} i={i}: {o} vs {e} (x rounding bound {rounding})"
                    );
                }
                if n == 1 {
                    // Rounding x really happens in the dot regime.
                    assert!(out.iter().zip(&expected).any(|(o, e)| o != e), "{q:?}");
                }
            }
        }
    }

    /// MXFP4 in the dot regime multiplies x rounded to int16 (it differs
    /// from the f32-x product of a `with_f32_x` copy, by at most half an
    /// int16 step times |w| per value), and its GEMM regime equals that
    /// copy's.
    #[test]
    fn mxfp4_decode_multiplies_x_rounded_to_int16() {
        let (m, k) = (37, 96);
        let blocks: Vec<u8> = (0..m * k / 2).map(|i| (i * 37 + i / 7) as u8).collect();
        let scales: Vec<u8> = (0..m * k / 32).map(|i| 124 + (i % 5) as u8).collect();
        let make = || CpuWeight {
            data: WeightData::Mxfp4 {
                blocks: blocks.clone().into(),
                scales: scales.clone().into(),
                int_x: true,
            },
            shape: vec![m, k],
        };
        let (w, exact) = (make(), make().with_f32_x());
        let mut wd = vec![0.0; m * k];
        w.read_f32(0, &mut wd);
        for n in [1, 17] {
            let x: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7 % 13) as f32 - 1.0) / 5.0)
                .collect();
            let (mut out, mut reference) = (vec![0.0; n * m], vec![0.0; n * m]);
            linear(&x, n, &w, None, &mut out);
            linear(&x, n, &exact, None, &mut reference);
            if n >= gemm_min_rows(&w) {
                assert_eq!(out, reference, "the GEMM regime widens the same weights");
                continue;
            }
            assert!(
                out.iter().zip(&reference).any(|(o, e)| o != e),
                "x was rounded"
            );
            for (i, (&o, &e)) in out.iter().zip(&reference).enumerate() {
                let (t, r) = (i / m, i % m);
                let bound: f32 = (0..k)
                    .map(|c| {
                        let g = &x[t * k + c / 32 * 32..t * k + c / 32 * 32 + 32];
                        let step = g.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 32767.0;
                        wd[r * k + c].abs() * step * 0.5
                    })
                    .sum();
                assert!(
                    (o - e).abs() <= bound + 1e-5 * (1.0 + e.abs()),
                    "row {i}: {o} vs {e}"
                );
            }
        }
    }
}
