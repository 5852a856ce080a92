//! Weight-only int8 and int4 on the CPU: widening and dot products over the
//! format `turbospark_backend::quant` defines (one f16 scale per 32 values of
//! a row, widened exactly to f32 where used). Dot products accumulate each
//! group in f32 and scale once.

use half::f16;
#[cfg(test)]
use turbospark_backend::quant::quantize;
use turbospark_backend::{QUANT_GROUP, Quant};

/// Widens groups starting at group `g0` into `out` (a multiple of 32 long).
pub fn dequantize(codes: &[u8], scales: &[f16], q: Quant, g0: usize, out: &mut [f32]) {
    for (g, o) in out.chunks_exact_mut(QUANT_GROUP).enumerate() {
        let s = scales[g0 + g].to_f32();
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

/// Σ x·w over one quantized row (`x.len() == 32 · scales.len()`).
pub fn dot(x: &[f32], codes: &[u8], scales: &[f16], q: Quant) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        // SAFETY: features checked; lengths follow from the row layout.
        return unsafe { x86::dot(x, codes, scales, q) };
    }
    let mut buf = [0.0f32; QUANT_GROUP];
    let mut total = 0.0;
    for g in 0..scales.len() {
        dequantize(codes, scales, q, g, &mut buf);
        total += x[g * 32..g * 32 + 32]
            .iter()
            .zip(&buf)
            .map(|(a, b)| a * b)
            .sum::<f32>();
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;
    use turbospark_backend::Quant;

    /// Per group: 32 codes → four 8-lane i32 vectors → f32, FMA with x,
    /// then one multiply by the group's scale (widened by F16C: `half`'s
    /// portable conversion cost a fifth of int4 decode on the CPU).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(x: &[f32], codes: &[u8], scales: &[f16], q: Quant) -> f32 {
        let mut total = _mm256_setzero_ps();
        let low4 = _mm_set1_epi8(0x0F);
        let eight = _mm_set1_epi8(8);
        unsafe {
            for (g, &s) in scales.iter().enumerate() {
                let (a, b) = match q {
                    Quant::Int8 => {
                        let p = codes.as_ptr().add(g * 32) as *const __m128i;
                        (_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)))
                    }
                    Quant::Int4 => {
                        let bytes = _mm_loadu_si128(codes.as_ptr().add(g * 16) as *const __m128i);
                        let lo = _mm_sub_epi8(_mm_and_si128(bytes, low4), eight);
                        let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4), eight);
                        // Element 2j is byte j's low nibble, 2j+1 its high nibble.
                        (_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi))
                    }
                };
                let xp = x.as_ptr().add(g * 32);
                let mut acc = _mm256_setzero_ps();
                for (j, c) in [a, _mm_srli_si128(a, 8), b, _mm_srli_si128(b, 8)]
                    .into_iter()
                    .enumerate()
                {
                    let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(8 * j)), w, acc);
                }
                let s = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(s.to_bits())));
                total = _mm256_fmadd_ps(acc, _mm256_broadcastss_ps(s), total);
            }
            let lo = _mm256_castps256_ps128(total);
            let hi = _mm256_extractf128_ps(total, 1);
            let v = _mm_add_ps(lo, hi);
            let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_error_is_within_half_a_step_and_dots_agree() {
        let w: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 41) as f32 - 20.0) / 13.0)
            .collect();
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 11 % 17) as f32 - 8.0) / 5.0)
            .collect();
        for q in [Quant::Int8, Quant::Int4] {
            let (codes, scales) = quantize(&w, q).unwrap();
            let mut back = vec![0.0; 96];
            dequantize(&codes, &scales, q, 0, &mut back);
            for (g, (a, b)) in w.chunks(32).zip(back.chunks(32)).enumerate() {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= scales[g].to_f32() * 0.5 + 1e-6,
                        "{q:?}: {x} vs {y}"
                    );
                }
            }
            let exact: f32 = x.iter().zip(&back).map(|(a, b)| a * b).sum();
            let got = dot(&x, &codes, &scales, q);
            assert!(
                (got - exact).abs() < 1e-4 * (1.0 + exact.abs()),
                "{q:?}: {got} vs {exact}"
            );
        }
    }
}
