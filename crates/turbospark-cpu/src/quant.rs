//! Weight-only int8 and int4 on the CPU: widening (for the prefill GEMMs)
//! and the decode dot products over the format `turbospark_backend::quant`
//! defines (codes in groups of 32 values, one f16 scale per scale group of
//! 32-256 values: code group g reads scale `g >> shift`).
//!
//! A decode dot product multiplies integer codes by integer codes, as
//! llama.cpp's Q8_0/Q4_0 and this project's GPU integer-activation GEMVs
//! do: x is rounded once per row ([`RoundedX`]: a step of max|x|/127 per
//! group of 32, like `quantize_x` in the CUDA kernels), each group's 32
//! products are summed exactly in i32, and the group sum is scaled by the
//! weight's step times x's in f32. Widening every code to f32 and
//! multiplying by f32 x bound int8/int4 decode by the conversions (11 and
//! 8 GB/s of weights on Llama-3.2-1B, where bf16 streamed 19; BENCHMARKS.md,
//! thirty-ninth session); the integer products need one `vpmaddubsw` per 32
//! values instead of four conversions and four FMAs. x's rounding adds a relative error of about
//! 1/254 of each group's largest value, well inside int8 weights' own.

use half::f16;
#[cfg(test)]
use turbospark_backend::quant::{SCALE_GROUPS, quantize, scale_shift};
use turbospark_backend::{QUANT_GROUP, Quant};

/// Widens code groups starting at group `g0` into `out` (a multiple of 32
/// long); code group g's scale is `scales[g >> shift]`.
pub fn dequantize(codes: &[u8], scales: &[f16], q: Quant, shift: u32, g0: usize, out: &mut [f32]) {
    for (g, o) in out.chunks_exact_mut(QUANT_GROUP).enumerate() {
        let s = scales[(g0 + g) >> shift].to_f32();
        match q {
            Quant::Int8 => {
                let c = &codes[(g0 + g) * 32..(g0 + g + 1) * 32];
                o.iter_mut()
                    .zip(c)
                    .for_each(|(o, &c)| *o = c as i8 as f32 * s);
            }
            Quant::Int4 => {
                let c = &codes[(g0 + g) * 16..(g0 + g + 1) * 16];
                for (pair, &b) in o.chunks_exact_mut(2).zip(c) {
                    pair[0] = ((b & 0x0F) as i32 - 8) as f32 * s;
                    pair[1] = ((b >> 4) as i32 - 8) as f32 * s;
                }
            }
        }
    }
}

/// The largest code of x's rounding: int8, symmetric, so that |x| and a
/// sign-applied weight code fit `vpmaddubsw`'s u8 × i8 with pair sums below
/// i16's limit (2 · 127 · 127 = 32,258).
const X_MAX: f32 = 127.0;

/// Groups of an int4 x block: their even values' codes, then their odd
/// ones' (see [`RoundedX::slot`]).
const INT4_BLOCK: usize = 2;

/// Where a block's odd values start, after its groups' 16 even ones each.
const INT4_ODD: usize = INT4_BLOCK * QUANT_GROUP / 2;

/// Rounds one group of x (32 values) to integer codes of at most `x_max`:
/// each value to the nearest multiple of the group's step max|x| / x_max,
/// ties to even (`__float2int_rn` on the GPU, whose `quantize_x` this
/// follows operation for operation), handing `put` each value's index and
/// code; returns the step. A group holding a NaN gets codes 0 and a NaN
/// step, so the dot product is NaN, as the f32 one would be.
pub(crate) fn round_group(v: &[f32], x_max: f32, mut put: impl FnMut(usize, i32)) -> f32 {
    let nan = v.iter().any(|v| v.is_nan());
    let amax = v.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let inv = if amax > 0.0 && !nan {
        x_max / amax
    } else {
        0.0
    };
    for (i, &v) in v.iter().enumerate() {
        put(i, (v * inv).round_ties_even() as i32);
    }
    if nan { f32::NAN } else { amax * (1.0 / x_max) }
}

/// One row of x rounded for the integer dot products of one weight format.
pub struct RoundedX {
    quant: Quant,
    /// A code per value at [`RoundedX::slot`]; int4 rows are padded with
    /// zero codes to whole blocks.
    codes: Vec<i8>,
    /// |code| per value (int8 only: `vpmaddubsw`'s unsigned operand).
    abs: Vec<u8>,
    /// max|x| / 127 per group; NaN where the group holds a NaN (its codes
    /// are then 0 and the dot product is NaN, as the f32 one would be).
    steps: Vec<f32>,
    /// Σ codes per group: int4 codes are stored as value + 8, so a group's
    /// products carry 8 · Σ x codes too much.
    sums: Vec<i32>,
}

impl RoundedX {
    /// Rounds `x` (a multiple of 32 long) for weights in format `quant`:
    /// each value to the nearest multiple of its group's step, ties to even
    /// (`__float2int_rn` on the GPU).
    pub fn new(x: &[f32], quant: Quant) -> Self {
        let groups = x.len() / QUANT_GROUP;
        let len = match quant {
            Quant::Int8 => x.len(),
            Quant::Int4 => groups.div_ceil(INT4_BLOCK) * INT4_BLOCK * QUANT_GROUP,
        };
        let mut r = RoundedX {
            quant,
            codes: vec![0; len],
            abs: Vec::new(),
            steps: vec![0.0; groups],
            sums: vec![0; groups],
        };
        for (g, v) in x.chunks_exact(QUANT_GROUP).enumerate() {
            let mut sum = 0;
            r.steps[g] = round_group(v, X_MAX, |i, c| {
                r.codes[Self::slot(quant, g, i)] = c as i8;
                sum += c;
            });
            r.sums[g] = sum;
        }
        if quant == Quant::Int8 {
            r.abs = r.codes.iter().map(|c| c.unsigned_abs()).collect();
        }
        r
    }

    /// Where value `i` of group `g` is held. int8: in order. int4: in
    /// blocks of 2 groups, the 2 groups' even values (16 each), then their
    /// odd ones, which is how a group's 16 bytes give their low nibbles and
    /// then their high ones: two adjacent groups' 32 code bytes then meet
    /// two 32-byte runs of x, with no interleaving.
    fn slot(quant: Quant, g: usize, i: usize) -> usize {
        match quant {
            Quant::Int8 => g * QUANT_GROUP + i,
            Quant::Int4 => {
                let block = g / INT4_BLOCK * INT4_BLOCK * QUANT_GROUP;
                block + (i % 2) * INT4_ODD + (g % INT4_BLOCK) * 16 + i / 2
            }
        }
    }

    pub fn quant(&self) -> Quant {
        self.quant
    }
}

/// Σ x·w over one quantized row, with x rounded by [`RoundedX::new`] for
/// this row's format, code group g scaled by `scales[g >> shift]`
/// (`x.steps.len() == scales.len() << shift`, checked: the SIMD kernel's
/// scale loads rely on it).
pub fn dot(x: &RoundedX, codes: &[u8], scales: &[f16], shift: u32) -> f32 {
    assert_eq!(
        x.steps.len(),
        scales.len() << shift,
        "quant::dot: scales for another row"
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        // SAFETY: features checked; lengths follow from the row layout.
        return unsafe { x86::dot(x, codes, scales, shift) };
    }
    dot_portable(x, codes, scales, shift)
}

/// The same integer group sums as the SIMD kernels, scaled and summed in
/// group order (the kernels sum in lanes: results differ by float rounding
/// only).
fn dot_portable(x: &RoundedX, codes: &[u8], scales: &[f16], shift: u32) -> f32 {
    let mut total = 0.0f32;
    for g in 0..x.steps.len() {
        let s = scales[g >> shift];
        let xc = |i| i32::from(x.codes[RoundedX::slot(x.quant, g, i)]);
        let sum: i32 = match x.quant {
            Quant::Int8 => codes[g * 32..(g + 1) * 32]
                .iter()
                .enumerate()
                .map(|(i, &w)| i32::from(w as i8) * xc(i))
                .sum(),
            Quant::Int4 => codes[g * 16..(g + 1) * 16]
                .iter()
                .enumerate()
                .map(|(j, &b)| {
                    (i32::from(b & 0x0F) - 8) * xc(2 * j) + (i32::from(b >> 4) - 8) * xc(2 * j + 1)
                })
                .sum(),
        };
        total += sum as f32 * (s.to_f32() * x.steps[g]);
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;
    use turbospark_backend::Quant;

    use super::{INT4_ODD, RoundedX};
    use crate::simd::hsum;

    /// Groups whose combined scales (weight step × x step) are made at
    /// once: one F16C conversion and one multiply for eight groups.
    const BATCH: usize = 8;

    /// Per group of 32 values the products land in i32 lanes
    /// (`vpmaddubsw`, then `vpmaddwd` against ones), are widened to f32 and
    /// added times the group's combined scale, into two accumulators so
    /// that the FMA's latency does not chain every group.
    /// - int8, a group a step: |x| (u8) times the weight code with x's
    ///   sign applied (`vpsignb`), the usual way to get i8 × i8 from an
    ///   u8 × i8 instruction; 8 lanes a group.
    /// - int4, two groups a step: their 32 bytes' low nibbles against the
    ///   groups' 32 even x codes and high nibbles against the odd ones, the
    ///   two products added in i16 (at most 4 · 15 · 127); lanes 0-3 are
    ///   the first group's, 4-7 the second's. The codes are stored as
    ///   value + 8, so 8 · Σ x codes · scale comes off at the end.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(x: &RoundedX, codes: &[u8], scales: &[f16], shift: u32) -> f32 {
        let groups = x.steps.len();
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut offset = _mm256_setzero_ps();
        let mut combined = [0.0f32; BATCH];
        unsafe {
            for g0 in (0..groups).step_by(BATCH) {
                let n = BATCH.min(groups - g0);
                let group_bytes = match x.quant {
                    Quant::Int8 => 32,
                    Quant::Int4 => 16,
                };
                crate::simd::prefetch_ahead(
                    codes.as_ptr().add(g0 * group_bytes),
                    BATCH * group_bytes,
                );
                let cs = if n == BATCH {
                    let w = batch_scales(scales, g0, shift);
                    _mm256_mul_ps(w, _mm256_loadu_ps(x.steps.as_ptr().add(g0)))
                } else {
                    // Past the row: scale 0, so nothing is added.
                    for (i, c) in combined.iter_mut().enumerate() {
                        *c = if i < n {
                            scales[(g0 + i) >> shift].to_f32() * x.steps[g0 + i]
                        } else {
                            0.0
                        };
                    }
                    _mm256_loadu_ps(combined.as_ptr())
                };
                match x.quant {
                    Quant::Int8 => {
                        _mm256_storeu_ps(combined.as_mut_ptr(), cs);
                        let mut i = 0;
                        while i + 1 < n {
                            let a = int8_group(x, codes, g0 + i);
                            let b = int8_group(x, codes, g0 + i + 1);
                            acc[0] = _mm256_fmadd_ps(a, _mm256_broadcast_ss(&combined[i]), acc[0]);
                            acc[1] =
                                _mm256_fmadd_ps(b, _mm256_broadcast_ss(&combined[i + 1]), acc[1]);
                            i += 2;
                        }
                        if i < n {
                            let a = int8_group(x, codes, g0 + i);
                            acc[0] = _mm256_fmadd_ps(a, _mm256_broadcast_ss(&combined[i]), acc[0]);
                        }
                    }
                    Quant::Int4 => {
                        let sums = if n == BATCH {
                            _mm256_loadu_si256(x.sums.as_ptr().add(g0).cast())
                        } else {
                            let mut s = [0i32; BATCH];
                            s[..n].copy_from_slice(&x.sums[g0..g0 + n]);
                            _mm256_loadu_si256(s.as_ptr().cast())
                        };
                        offset = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), cs, offset);
                        // Pairs two at a time into the two accumulators,
                        // each pair's scales picked by a constant lane
                        // table, so both chains stay in registers.
                        let mut j = 0;
                        while j + 1 < n / 2 {
                            let p = int4_pair(x, codes, g0 + 2 * j);
                            let q = int4_pair(x, codes, g0 + 2 * j + 2);
                            acc[0] = _mm256_fmadd_ps(p, pair_scales(cs, j), acc[0]);
                            acc[1] = _mm256_fmadd_ps(q, pair_scales(cs, j + 1), acc[1]);
                            j += 2;
                        }
                        if j < n / 2 {
                            let p = int4_pair(x, codes, g0 + 2 * j);
                            acc[0] = _mm256_fmadd_ps(p, pair_scales(cs, j), acc[0]);
                        }
                        if n % 2 == 1 {
                            let p = int4_single(x, codes, g0 + n - 1);
                            let sc = _mm256_permutevar8x32_ps(cs, _mm256_set1_epi32(n as i32 - 1));
                            acc[0] = _mm256_fmadd_ps(p, sc, acc[0]);
                        }
                    }
                }
            }
            let total = hsum(_mm256_add_ps(acc[0], acc[1]));
            match x.quant {
                Quant::Int8 => total,
                Quant::Int4 => total - 8.0 * hsum(offset),
            }
        }
    }

    /// The weight scales of a whole batch (code groups g0 .. g0 + 8, g0 a
    /// multiple of 8) as f32 lanes, one F16C conversion: eight scales, or
    /// with larger scale groups the batch's 8 >> shift, each spread over
    /// its 1 << shift lanes. Those few are loaded straight into a register
    /// (a load of eight could pass the row's last scale): copied through
    /// the stack first, the 16-byte load after 2-byte stores missed store
    /// forwarding and int4 decode lost a third of its speed.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn batch_scales(scales: &[f16], g0: usize, shift: u32) -> __m256 {
        unsafe {
            let p = scales.as_ptr().add(g0 >> shift);
            let bits = match shift {
                0 => _mm_loadu_si128(p.cast()),
                1 => _mm_loadl_epi64(p.cast()),
                2 => _mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()),
                _ => _mm_cvtsi32_si128(i32::from((*p).to_bits())),
            };
            let lanes = _mm256_srlv_epi32(
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                _mm256_set1_epi32(shift as i32),
            );
            _mm256_permutevar8x32_ps(_mm256_cvtph_ps(bits), lanes)
        }
    }

    /// Lane tables for [`pair_scales`]: pair j's lanes 0-3 take scale 2j,
    /// 4-7 scale 2j + 1.
    const PAIR_LANES: [[i32; 8]; BATCH / 2] = {
        let mut t = [[0; 8]; BATCH / 2];
        let mut j = 0;
        while j < BATCH / 2 {
            let mut l = 0;
            while l < 8 {
                t[j][l] = (2 * j + l / 4) as i32;
                l += 1;
            }
            j += 1;
        }
        t
    };

    /// The combined scales of a batch's pair `j` (groups 2j and 2j + 1),
    /// spread over the lanes `int4_pair` gives them.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pair_scales(cs: __m256, j: usize) -> __m256 {
        unsafe {
            let lanes = _mm256_loadu_si256(PAIR_LANES[j].as_ptr().cast());
            _mm256_permutevar8x32_ps(cs, lanes)
        }
    }

    /// int8 group g's 32 products, four to an f32 lane (exact: < 2^24).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn int8_group(x: &RoundedX, codes: &[u8], g: usize) -> __m256 {
        unsafe {
            let w = _mm256_loadu_si256(codes.as_ptr().add(g * 32).cast());
            let xs = _mm256_loadu_si256(x.codes.as_ptr().add(g * 32).cast());
            let xa = _mm256_loadu_si256(x.abs.as_ptr().add(g * 32).cast());
            let pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, xs));
            _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }

    /// int4 groups g and g + 1 (g even): lanes 0-3 the first's products,
    /// 4-7 the second's.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn int4_pair(x: &RoundedX, codes: &[u8], g: usize) -> __m256 {
        unsafe {
            let low4 = _mm256_set1_epi8(0x0F);
            let b = _mm256_loadu_si256(codes.as_ptr().add(g * 16).cast());
            let lo = _mm256_and_si256(b, low4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
            let at = RoundedX::slot(Quant::Int4, g, 0);
            let even = _mm256_loadu_si256(x.codes.as_ptr().add(at).cast());
            let odd = _mm256_loadu_si256(x.codes.as_ptr().add(at + INT4_ODD).cast());
            let pairs = _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, even),
                _mm256_maddubs_epi16(hi, odd),
            );
            _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }

    /// int4 group g alone (a row's last of an odd count): lanes 0-3, the
    /// rest 0.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn int4_single(x: &RoundedX, codes: &[u8], g: usize) -> __m256 {
        unsafe {
            let low4 = _mm_set1_epi8(0x0F);
            let b = _mm_loadu_si128(codes.as_ptr().add(g * 16).cast());
            let lo = _mm_and_si128(b, low4);
            let hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
            let at = RoundedX::slot(Quant::Int4, g, 0);
            let even = _mm_loadu_si128(x.codes.as_ptr().add(at).cast());
            let odd = _mm_loadu_si128(x.codes.as_ptr().add(at + INT4_ODD).cast());
            let pairs = _mm_add_epi16(_mm_maddubs_epi16(lo, even), _mm_maddubs_epi16(hi, odd));
            let sums = _mm_madd_epi16(pairs, _mm_set1_epi16(1));
            _mm256_cvtepi32_ps(_mm256_zextsi128_si256(sums))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, mul: usize, modulo: usize, div: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * mul % modulo) as f32 - (modulo / 2) as f32) / div)
            .collect()
    }

    /// Every scale group: each value comes back within half its scale
    /// group's step (a code group reading another group's scale does not).
    #[test]
    fn weights_round_trip_within_half_a_step() {
        let mut w = values(512, 37, 41, 13.0);
        // Scale groups of very different sizes.
        w.iter_mut().skip(256).for_each(|v| *v *= 40.0);
        for (q, group) in SCALE_GROUPS
            .into_iter()
            .flat_map(|g| [(Quant::Int8, g), (Quant::Int4, g)])
        {
            let (codes, scales) = quantize(&w, q, group).unwrap();
            let mut back = vec![0.0; 512];
            dequantize(&codes, &scales, q, scale_shift(group), 0, &mut back);
            for (i, (x, y)) in w.iter().zip(&back).enumerate() {
                assert!(
                    (x - y).abs() <= scales[i / group].to_f32() * 0.5 + 1e-6,
                    "{q:?} {group}: {x} vs {y}"
                );
            }
        }
    }

    /// x's codes times its steps give x back within half a step, the
    /// largest value of a group exactly ±127 steps, and ties go to even.
    #[test]
    fn x_rounds_to_its_groups_steps() {
        let mut x = values(64, 11, 17, 5.0);
        x[40] = -3.5;
        for q in [Quant::Int8, Quant::Int4] {
            let r = RoundedX::new(&x, q);
            for (g, v) in x.chunks(32).enumerate() {
                let amax = v.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert_eq!(r.steps[g], amax / 127.0);
                for (i, &v) in v.iter().enumerate() {
                    let c = r.codes[RoundedX::slot(q, g, i)];
                    assert!((f32::from(c) * r.steps[g] - v).abs() <= r.steps[g] * 0.5 + 1e-6);
                    if v.abs() == amax {
                        assert_eq!(i32::from(c).abs(), 127, "{q:?} group {g} value {i}");
                    }
                }
                let sum: i32 = (0..32)
                    .map(|i| i32::from(r.codes[RoundedX::slot(q, g, i)]))
                    .sum();
                assert_eq!(r.sums[g], sum);
            }
        }
        // Group max 254 puts the step at exactly 2: 3 is 1.5 steps, a tie
        // that rounds to the even code 2, and 5 (2.5 steps) to 2 as well.
        let mut t = vec![0.0f32; 32];
        (t[0], t[1], t[2]) = (254.0, 3.0, -5.0);
        let r = RoundedX::new(&t, Quant::Int8);
        assert_eq!(&r.codes[..3], &[127, 2, -2]);
        t[7] = f32::NAN;
        let r = RoundedX::new(&t, Quant::Int8);
        assert!(r.steps[0].is_nan() && r.codes.iter().all(|&c| c == 0));
    }

    /// The integer dot products equal the exact sum of the dequantized
    /// weights times the dequantized x (both kernels, odd group counts that
    /// leave partial scale batches and an odd last group, every scale group
    /// that divides the row), and stay within x's rounding error of the f32
    /// product.
    #[test]
    fn integer_dots_equal_the_dequantized_products() {
        for groups in [1, 3, 4, 6, 8, 9, 12, 14, 17, 20, 24] {
            let k = groups * 32;
            let w = values(k, 37, 41, 13.0);
            let mut x = values(k, 11, 19, 5.0);
            // A group of small values next to one of large ones.
            x.iter_mut().take(32).for_each(|v| *v *= 1e-3);
            let scale_groups = SCALE_GROUPS.into_iter().filter(|g| k.is_multiple_of(*g));
            for (q, group) in scale_groups.flat_map(|g| [(Quant::Int8, g), (Quant::Int4, g)]) {
                let shift = scale_shift(group);
                let (codes, scales) = quantize(&w, q, group).unwrap();
                let mut wd = vec![0.0; k];
                dequantize(&codes, &scales, q, shift, 0, &mut wd);
                // Each value is its code times its scale group's scale.
                let step = scales[(k - 1) / group].to_f32();
                assert!((wd[k - 1] / step).fract() == 0.0, "{q:?} {group}");
                let r = RoundedX::new(&x, q);
                let mut exact = 0.0f64;
                for (i, &wv) in wd.iter().enumerate() {
                    let (g, j) = (i / 32, i % 32);
                    let xv = f64::from(r.codes[RoundedX::slot(q, g, j)]) * f64::from(r.steps[g]);
                    exact += f64::from(wv) * xv;
                }
                let scale: f64 = wd
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum();
                for (how, got) in [
                    ("simd", dot(&r, &codes, &scales, shift)),
                    ("portable", dot_portable(&r, &codes, &scales, shift)),
                ] {
                    assert!(
                        (f64::from(got) - exact).abs() <= 1e-6 * scale,
                        "{q:?} {how} groups={groups} scale group {group}: {got} vs {exact}"
                    );
                }
                let f32_dot: f64 = wd.iter().zip(&x).map(|(a, b)| f64::from(a * b)).sum();
                let bound: f64 = wd
                    .iter()
                    .enumerate()
                    .map(|(i, a)| f64::from(a.abs() * r.steps[i / 32]) * 0.5)
                    .sum();
                assert!(
                    (exact - f32_dot).abs() <= bound,
                    "{q:?}: {exact} vs {f32_dot} (x rounding bound {bound})"
                );
            }
        }
    }
}
