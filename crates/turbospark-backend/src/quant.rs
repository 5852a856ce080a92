//! Weight-only int8/int4 quantization as every backend stores it: symmetric,
//! one f16 scale per [`QUANT_GROUP`] consecutive values of a row (llama.cpp's
//! Q8_0/Q4_0 layout: 34 and 18 bytes a group). Done once on the host at
//! load, so the CPU and CUDA backends hold the same codes and scales and
//! differ only in arithmetic order.

use half::f16;

/// Weight-only quantization applied at load (`--quant`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// Values −127..=127, scale ≥ max|w| / 127.
    Int8,
    /// Values −8..=7 packed two a byte (low nibble first), scale ≥ max|w| / 7.
    Int4,
}

impl Quant {
    /// The largest code magnitude a group's largest value maps to.
    fn qmax(self) -> f32 {
        match self {
            Quant::Int8 => 127.0,
            Quant::Int4 => 7.0,
        }
    }
}

/// Values per quantization scale.
pub const QUANT_GROUP: usize = 32;

/// Quantizes rows whose width is a multiple of [`QUANT_GROUP`]:
/// (codes, scales). A group's scale is max|w| / qmax rounded UP to an f16,
/// so that no value's code passes qmax, and the codes are the values
/// divided by that f16 scale, rounded to nearest (half away from zero) and
/// clamped; int8 codes are one byte each (as i8); int4 codes are
/// `value + 8`, two a byte, low nibble first. Fails (naming the largest
/// value) when a scale would pass f16's largest, 65,504: values beyond
/// ~8.3e6 (int8) or ~4.6e5 (int4), or infinite ones.
pub fn quantize(values: &[f32], q: Quant) -> Result<(Vec<u8>, Vec<f16>), String> {
    let qmax = q.qmax();
    let mut scales = Vec::with_capacity(values.len() / QUANT_GROUP);
    let mut codes = Vec::with_capacity(match q {
        Quant::Int8 => values.len(),
        Quant::Int4 => values.len() / 2,
    });
    for g in values.chunks_exact(QUANT_GROUP) {
        let max = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = f16_at_least(max / qmax).ok_or_else(|| {
            format!("values up to {max:e} are too large for {q:?} quantization's f16 scales")
        })?;
        let s = scale.to_f32();
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        scales.push(scale);
        match q {
            Quant::Int8 => codes.extend(
                g.iter()
                    .map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8),
            ),
            Quant::Int4 => codes.extend(g.chunks_exact(2).map(|p| {
                let c = |v: f32| ((v * inv).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                c(p[0]) | (c(p[1]) << 4)
            })),
        }
    }
    Ok((codes, scales))
}

/// The least f16 ≥ `v` (v ≥ 0), if finite.
fn f16_at_least(v: f32) -> Option<f16> {
    let h = f16::from_f32(v);
    let h = if h.to_f32() < v {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    };
    h.is_finite().then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each scale is the least f16 at or above max|w| / qmax, so the largest
    /// value gets the extreme code (its code times the scale is within an
    /// f16 step of it) and no code is clamped.
    #[test]
    fn scales_are_the_least_f16_covering_the_group() {
        let w: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 41) as f32 - 20.0) / 13.0)
            .collect();
        for q in [Quant::Int8, Quant::Int4] {
            let (codes, scales) = quantize(&w, q).unwrap();
            for (g, s) in w.chunks(32).zip(&scales) {
                let need = g.iter().fold(0.0f32, |m, v| m.max(v.abs())) / q.qmax();
                assert!(s.to_f32() >= need, "{q:?}: {s} < {need}");
                assert!(
                    f16::from_bits(s.to_bits() - 1).to_f32() < need,
                    "{q:?}: {s} not least"
                );
            }
            let extreme = match q {
                Quant::Int8 => codes[..32]
                    .iter()
                    .any(|&c| c as i8 == 127 || c as i8 == -127),
                Quant::Int4 => codes[..16]
                    .iter()
                    .any(|&b| [1, 15].contains(&(b & 15)) || [1, 15].contains(&(b >> 4))),
            };
            assert!(extreme, "{q:?}: the largest value missed the extreme code");
        }
        // An exact f16 quotient is kept, not rounded up.
        let (_, s) = quantize(&[127.0; 32], Quant::Int8).unwrap();
        assert_eq!(s[0].to_f32(), 1.0);
    }

    #[test]
    fn values_beyond_f16_scales_are_an_error_naming_them() {
        let mut w = vec![0.5f32; 32];
        w[3] = 1e7;
        let e = quantize(&w, Quant::Int8).unwrap_err();
        assert!(e.contains("1e7") && e.contains("Int8"), "{e}");
        w[3] = f32::INFINITY;
        assert!(quantize(&w, Quant::Int4).is_err());
        // Zeros quantize to zero codes and a zero scale.
        let (codes, s) = quantize(&[0.0; 32], Quant::Int4).unwrap();
        assert!(codes.iter().all(|&b| b == 0x88) && s[0].to_f32() == 0.0);
    }
}
