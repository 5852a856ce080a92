//! MXFP4 decode dot products in integers: x rounded to int16 per group of
//! 32 (step max|x| / 32,767, as the GPU's MXFP4 GEMVs round it), each code
//! looked up as twice its E2M1 value (an integer in −12..12), a group's 32
//! products summed exactly in i32 (at most 32 · 12 · 32,767 < 2^24, so the
//! sum is exact in f32 too) and scaled by the block's 2^(s − 127) / 2 times
//! x's step in f32. x's rounding is 256 times finer than int8's: a relative
//! error of ~1e-5 of each group's largest value.
//!
//! Why: widening every code to f32 and multiplying f32 x (`simd::dot_mxfp4`,
//! which stays the reference: `CpuWeight::with_f32_x`) bound gpt-oss's
//! experts at ~6 GB/s a core, a third of what a core streams; `vpmaddwd`
//! takes 16 products a step. Prefill's few rows (an expert's tokens) go
//! four x rows a call ([`dot_inputs`]), each block looked up once for them.

use crate::quant::round_group;
use crate::simd::{E2M1_TWICE as TWICE, e8m0};

/// The largest code of x's rounding (int16, symmetric).
const X_MAX: f32 = 32767.0;

/// One row of x rounded for MXFP4 dot products.
pub struct RoundedX16 {
    /// Per group of 32: the codes of its 16 even values, then of its 16
    /// odd ones, the order in which a block's 16 bytes give their low
    /// nibbles and then their high ones.
    codes: Vec<i16>,
    /// max|x| / 32,767 per group (NaN where the group holds a NaN).
    steps: Vec<f32>,
}

impl RoundedX16 {
    /// Rounds `x` (a multiple of 32 long).
    pub fn new(x: &[f32]) -> Self {
        let mut r = RoundedX16 {
            codes: vec![0; x.len()],
            steps: vec![0.0; x.len() / 32],
        };
        for (g, v) in x.chunks_exact(32).enumerate() {
            let codes = &mut r.codes[g * 32..(g + 1) * 32];
            r.steps[g] = round_group(v, X_MAX, |i, c| codes[i / 2 + (i % 2) * 16] = c as i16);
        }
        r
    }
}

/// Σ x·w over one row of MXFP4 blocks (`blocks.len() == 16 · scales.len()`),
/// with x rounded by [`RoundedX16::new`].
pub fn dot(x: &RoundedX16, blocks: &[u8], scales: &[u8]) -> f32 {
    dot_inputs([x], blocks, scales)[0]
}

/// [`dot`] for N rows of x at once: each block's codes are looked up and
/// widened once for all of them (prefill's few rows: an MoE expert's
/// tokens, a short prompt).
pub fn dot_inputs<const N: usize>(xs: [&RoundedX16; N], blocks: &[u8], scales: &[u8]) -> [f32; N] {
    assert!(
        blocks.len() == 16 * scales.len() && xs.iter().all(|x| x.steps.len() == scales.len()),
        "mxfp4::dot_inputs: a row of x does not match the weight row's {} blocks",
        scales.len()
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: features checked; lengths checked above.
        return unsafe { x86::dot(xs, blocks, scales) };
    }
    xs.map(|x| dot_portable(x, blocks, scales))
}

/// The same integer block sums as the SIMD kernel, scaled and summed in
/// block order (the kernel sums in lanes: results differ by float rounding
/// only).
fn dot_portable(x: &RoundedX16, blocks: &[u8], scales: &[u8]) -> f32 {
    let mut total = 0.0f32;
    for (g, &s) in scales.iter().enumerate() {
        let xc = &x.codes[g * 32..(g + 1) * 32];
        let sum: i32 = blocks[g * 16..(g + 1) * 16]
            .iter()
            .enumerate()
            .map(|(j, &b)| {
                i32::from(TWICE[usize::from(b & 0x0F)]) * i32::from(xc[j])
                    + i32::from(TWICE[usize::from(b >> 4)]) * i32::from(xc[16 + j])
            })
            .sum();
        total += sum as f32 * (e8m0(s) * 0.5 * x.steps[g]);
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{RoundedX16, TWICE};
    use crate::simd::{e8m0, hsum, prefetch_ahead};

    /// Block g's codes looked up as twice their values (`pshufb`) and
    /// widened to i16: its 16 even values (low nibbles), then its 16 odd
    /// ones (high nibbles).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn widen(blocks: &[u8], g: usize) -> [__m256i; 2] {
        unsafe {
            let lut = _mm_loadu_si128(TWICE.as_ptr().cast());
            let low4 = _mm_set1_epi8(0x0F);
            let b = _mm_loadu_si128(blocks.as_ptr().add(g * 16).cast());
            let high = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
            [
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(lut, _mm_and_si128(b, low4))),
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(lut, high)),
            ]
        }
    }

    /// A widened block's 32 products with x's codes of group g, four to an
    /// f32 lane (exact: < 2^24).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn products(w: &[__m256i; 2], x: &RoundedX16, g: usize) -> __m256 {
        unsafe {
            let xp = x.codes.as_ptr().add(g * 32);
            let sums = _mm256_add_epi32(
                _mm256_madd_epi16(w[0], _mm256_loadu_si256(xp.cast())),
                _mm256_madd_epi16(w[1], _mm256_loadu_si256(xp.add(16).cast())),
            );
            _mm256_cvtepi32_ps(sums)
        }
    }

    /// Per block: its codes widened once ([`widen`]) and multiplied by each
    /// of the N rows of x's codes in pairs (`vpmaddwd`: 8 i32 lanes),
    /// widened to f32 and added times the block's combined scale for that
    /// row, into two accumulators a row in turn so that the FMA's latency
    /// does not chain every block. The lookup and widening are most of a
    /// block's instructions, so N rows cost far less than N calls.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot<const N: usize>(
        xs: [&RoundedX16; N],
        blocks: &[u8],
        scales: &[u8],
    ) -> [f32; N] {
        // Loops over `t` have a constant count and unroll, so every
        // accumulator is a register.
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        let mut combined = [[0.0f32; 8]; N];
        unsafe {
            let groups = scales.len();
            for g0 in (0..groups).step_by(8) {
                let n = 8.min(groups - g0);
                prefetch_ahead(blocks.as_ptr().add(g0 * 16), 128);
                if n == 8 {
                    // 2^(s − 127) is the float with exponent bits s (s = 0
                    // is the subnormal 2^−127), times ½ (the codes are
                    // looked up doubled) and x's step.
                    let s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(scales.as_ptr().add(g0).cast()));
                    let pow = _mm256_castsi256_ps(_mm256_slli_epi32(s, 23));
                    let zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(s, _mm256_setzero_si256()));
                    let pow = _mm256_blendv_ps(pow, _mm256_set1_ps(e8m0(0)), zero);
                    let half = _mm256_mul_ps(pow, _mm256_set1_ps(0.5));
                    for t in 0..N {
                        let c = _mm256_mul_ps(half, _mm256_loadu_ps(xs[t].steps.as_ptr().add(g0)));
                        _mm256_storeu_ps(combined[t].as_mut_ptr(), c);
                    }
                } else {
                    for t in 0..N {
                        for (i, c) in combined[t].iter_mut().enumerate().take(n) {
                            *c = e8m0(scales[g0 + i]) * 0.5 * xs[t].steps[g0 + i];
                        }
                    }
                }
                let mut i = 0;
                while i + 1 < n {
                    let (a, b) = (widen(blocks, g0 + i), widen(blocks, g0 + i + 1));
                    for t in 0..N {
                        let (ca, cb) = (&combined[t][i], &combined[t][i + 1]);
                        let pa = products(&a, xs[t], g0 + i);
                        let pb = products(&b, xs[t], g0 + i + 1);
                        acc[t][0] = _mm256_fmadd_ps(pa, _mm256_broadcast_ss(ca), acc[t][0]);
                        acc[t][1] = _mm256_fmadd_ps(pb, _mm256_broadcast_ss(cb), acc[t][1]);
                    }
                    i += 2;
                }
                if i < n {
                    let a = widen(blocks, g0 + i);
                    for t in 0..N {
                        let pa = products(&a, xs[t], g0 + i);
                        let ca = &combined[t][i];
                        acc[t][0] = _mm256_fmadd_ps(pa, _mm256_broadcast_ss(ca), acc[t][0]);
                    }
                }
            }
            let mut out = [0.0; N];
            for t in 0..N {
                out[t] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code and a spread of scales (0 included), against the
    /// exact sum of the decoded weights times the decoded x codes, for the
    /// dispatched kernel and the portable loop; and within x's rounding of
    /// the f32 dot product.
    #[test]
    fn integer_dots_equal_the_decoded_products() {
        for groups in [1, 2, 5, 90] {
            let k = groups * 32;
            let blocks: Vec<u8> = (0..k / 2).map(|i| (i * 37 + i / 7) as u8).collect();
            let scales: Vec<u8> = (0..groups).map(|g| [118, 127, 130, 0][g % 4]).collect();
            let x: Vec<f32> = (0..k).map(|i| ((i * 11 % 19) as f32 - 9.0) / 5.0).collect();
            let r = RoundedX16::new(&x);
            let mut w = vec![0.0; k];
            for (g, o) in w.chunks_exact_mut(32).enumerate() {
                crate::simd::decode_mxfp4_block(&blocks[g * 16..g * 16 + 16], scales[g], o);
            }
            let (mut exact, mut scale, mut f32_dot, mut bound) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for (i, (&wv, &xv)) in w.iter().zip(&x).enumerate() {
                let (g, j) = (i / 32, i % 32);
                let step = f64::from(r.steps[g]);
                let code = f64::from(r.codes[g * 32 + j / 2 + (j % 2) * 16]);
                exact += f64::from(wv) * code * step;
                scale += f64::from((wv * xv).abs());
                f32_dot += f64::from(wv) * f64::from(xv);
                bound += f64::from(wv.abs()) * step * 0.5;
            }
            for (how, got) in [
                ("dispatched", dot(&r, &blocks, &scales)),
                ("portable", dot_portable(&r, &blocks, &scales)),
            ] {
                assert!(
                    (f64::from(got) - exact).abs() <= 1e-6 * scale,
                    "{how} groups={groups}: {got} vs {exact}"
                );
            }
            assert!((exact - f32_dot).abs() <= bound, "{exact} vs {f32_dot}");
            assert!(
                bound < 1e-4 * scale,
                "int16 steps are fine: {bound} of {scale}"
            );
        }
    }

    /// Four rows of x at once give each row exactly what a call of its
    /// own gives (same products, same order), over full and partial scale
    /// batches and an odd last block.
    #[test]
    fn rows_of_x_together_equal_rows_alone() {
        for groups in [1, 3, 8, 13, 90] {
            let k = groups * 32;
            let blocks: Vec<u8> = (0..k / 2).map(|i| (i * 37 + i / 7) as u8).collect();
            let scales: Vec<u8> = (0..groups).map(|g| [118, 127, 130, 0][g % 4]).collect();
            let xs: Vec<RoundedX16> = (0..4)
                .map(|t| {
                    let x: Vec<f32> = (0..k)
                        .map(|i| ((i * (7 + 2 * t) % 19) as f32 - 9.0) / (3.0 + t as f32))
                        .collect();
                    RoundedX16::new(&x)
                })
                .collect();
            let together = dot_inputs([&xs[0], &xs[1], &xs[2], &xs[3]], &blocks, &scales);
            for (t, x) in xs.iter().enumerate() {
                assert_eq!(
                    together[t].to_bits(),
                    dot(x, &blocks, &scales).to_bits(),
                    "groups={groups} row {t}"
                );
            }
        }
    }
}
