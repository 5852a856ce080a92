//! Weight-only int8/int4 quantization as every backend stores it: symmetric,
//! one f32 scale per [`QUANT_GROUP`] consecutive values of a row (llama.cpp's
//! Q8_0/Q4_0 layout with f32 scales). Done once on the host at load, so the
//! CPU and CUDA backends hold the same codes and differ only in arithmetic
//! order.

/// Weight-only quantization applied at load (`--quant`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// Values −127..=127, scale = max|w| / 127.
    Int8,
    /// Values −8..=7 packed two a byte (low nibble first), scale = max|w| / 7.
    Int4,
}

/// Values per quantization scale.
pub const QUANT_GROUP: usize = 32;

/// Quantizes rows whose width is a multiple of [`QUANT_GROUP`]:
/// (codes, scales). Codes round to nearest (half away from zero) and clamp;
/// int8 codes are one byte each (as i8); int4 codes are `value + 8`, two a
/// byte, low nibble first.
pub fn quantize(values: &[f32], q: Quant) -> (Vec<u8>, Vec<f32>) {
    let qmax = match q {
        Quant::Int8 => 127.0,
        Quant::Int4 => 7.0,
    };
    let mut scales = Vec::with_capacity(values.len() / QUANT_GROUP);
    let mut codes = Vec::with_capacity(match q {
        Quant::Int8 => values.len(),
        Quant::Int4 => values.len() / 2,
    });
    for g in values.chunks_exact(QUANT_GROUP) {
        let max = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = max / qmax;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
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
    (codes, scales)
}
