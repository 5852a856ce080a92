//! Weight-only int8/int4 quantization as every backend stores it: symmetric,
//! codes in groups of [`QUANT_GROUP`] values and one f16 scale per scale
//! group of a row, 32 values by default (llama.cpp's Q8_0/Q4_0 bytes: 34
//! and 18 a group) or 64-256 (`--quant-group`, GPTQ's and AWQ's
//! `group_size`: 8.125 and 4.125 bits a weight at 128, so decode reads
//! 4.4% and 8.3% fewer bytes). Codes and scales lie in two arrays, so the
//! scale group changes only which scale a code group reads: group g's is
//! scale `g >> shift` ([`scale_shift`]). Done once on the host at load, so
//! the CPU and CUDA backends hold the same codes and scales and differ only
//! in arithmetic order.

use half::f16;
use rayon::prelude::*;
use turbospark_format::{DType, HostTensor};

use crate::BackendError;

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

    /// Bytes of one group's codes.
    fn group_bytes(self) -> usize {
        match self {
            Quant::Int8 => QUANT_GROUP,
            Quant::Int4 => QUANT_GROUP / 2,
        }
    }
}

/// Values per group of codes: the unit of the codes' layout and of x's
/// rounding in the integer dot products, and the smallest scale group.
pub const QUANT_GROUP: usize = 32;

/// The scale groups `--quant-group` takes: powers of two from
/// [`QUANT_GROUP`] to 256 values.
pub const SCALE_GROUPS: [usize; 4] = [
    QUANT_GROUP,
    2 * QUANT_GROUP,
    4 * QUANT_GROUP,
    8 * QUANT_GROUP,
];

/// The scale group a matrix with rows of `cols` values gets when `asked`
/// is asked for (one of [`SCALE_GROUPS`]): the largest of them up to
/// `asked` that divides its rows, so that no scale spans two rows (gpt-oss's
/// rows of 2,880 values take 64 where 128 is asked). None where the rows
/// are not a multiple of [`QUANT_GROUP`] or `asked` is not a scale group.
pub fn scale_group_for(cols: usize, asked: usize) -> Option<usize> {
    if !SCALE_GROUPS.contains(&asked) {
        return None;
    }
    SCALE_GROUPS
        .into_iter()
        .rev()
        .find(|&g| g <= asked && cols.is_multiple_of(g))
}

/// log2 of a scale group's code groups: code group g reads scale
/// `g >> scale_shift(group)`.
pub fn scale_shift(group: usize) -> u32 {
    (group / QUANT_GROUP).trailing_zeros()
}

/// A matrix quantized at load: its codes, its f16 scales (one a `group`
/// values of a row) and that scale group.
#[derive(Debug)]
pub struct QuantizedRows {
    pub codes: Vec<u8>,
    pub scales: Vec<f16>,
    pub group: usize,
}

/// Quantizes values whose count is a multiple of the scale group `group`
/// (one of [`SCALE_GROUPS`]): (codes, scales). A scale group's scale is
/// max|w| / qmax rounded UP to an f16,
/// so that no value's code passes qmax, and the codes are the values
/// divided by that f16 scale, rounded to nearest (half away from zero) and
/// clamped; int8 codes are one byte each (as i8); int4 codes are
/// `value + 8`, two a byte, low nibble first. Fails (naming the largest
/// value) when a scale would pass f16's largest, 65,504: values beyond
/// ~8.3e6 (int8) or ~4.6e5 (int4), or infinite ones.
pub fn quantize(values: &[f32], q: Quant, group: usize) -> Result<(Vec<u8>, Vec<f16>), String> {
    assert!(
        SCALE_GROUPS.contains(&group) && values.len().is_multiple_of(group),
        "quantize: {} values in scale groups of {group}",
        values.len()
    );
    quantize_pieces(values.len(), q, group, |start, out| {
        out.copy_from_slice(&values[start..start + out.len()])
    })
}

/// A checkpoint's weight quantized at load (`--quant`, `--quant-group
/// asked`), as [`quantize`] does, without widening the whole tensor to f32
/// first, in the scale group [`scale_group_for`] gives its rows: a 2-D
/// float tensor whose rows are a multiple of [`QUANT_GROUP`] wide, or an
/// error naming the tensor.
pub fn quantize_weight(
    t: &HostTensor<'_>,
    q: Quant,
    asked: usize,
) -> Result<QuantizedRows, BackendError> {
    if !SCALE_GROUPS.contains(&asked) {
        return Err(BackendError::Unsupported(format!(
            "tensor `{}`: --quant-group {asked} is not one of {SCALE_GROUPS:?}",
            t.name
        )));
    }
    let group = t
        .shape
        .get(1)
        .and_then(|&cols| scale_group_for(cols, asked));
    let Some(group) = group.filter(|_| t.shape.len() == 2 && t.dtype != DType::U8) else {
        return Err(BackendError::Unsupported(format!(
            "tensor `{}` {:?}: --quant needs 2-D float weights with rows a multiple of {QUANT_GROUP} wide",
            t.name, t.shape
        )));
    };
    let (codes, scales) =
        quantize_pieces(t.numel(), q, group, |start, out| t.to_f32_into(start, out))
            .map_err(|e| BackendError::Unsupported(format!("tensor `{}`: {e}", t.name)))?;
    Ok(QuantizedRows {
        codes,
        scales,
        group,
    })
}

/// Groups a piece of [`quantize_pieces`] holds: 32,768 values, 128 KB as
/// f32, small enough to stay in a core's cache between widening and
/// rounding, many enough pieces (a Llama-8B MLP matrix has ~1,800) to
/// keep every core busy.
const PIECE_GROUPS: usize = 1024;

/// [`quantize`] of `n` values that `read(start, out)` widens on request,
/// in pieces of [`PIECE_GROUPS`] groups over the rayon pool. One core
/// widening a whole matrix to f32 and then rounding it made `--quant` most
/// of a load (8 Llama-8B layers int8 on two cores: 28.5 s, now 10.8 s; the
/// f32 copy also took 2 GB of peak memory). Each group's codes and scale
/// depend on that group alone, so the result is the same in any order; of
/// several failing groups the first one's error is returned.
fn quantize_pieces(
    n: usize,
    q: Quant,
    group: usize,
    read: impl Fn(usize, &mut [f32]) + Sync,
) -> Result<(Vec<u8>, Vec<f16>), String> {
    let groups = n / QUANT_GROUP;
    let group_bytes = q.group_bytes();
    // A piece holds whole scale groups: PIECE_GROUPS is a multiple of 8.
    let piece_scales = PIECE_GROUPS * QUANT_GROUP / group;
    let mut codes = vec![0u8; groups * group_bytes];
    let mut scales = vec![f16::ZERO; n / group];
    let errors: Vec<String> = codes
        .par_chunks_mut(PIECE_GROUPS * group_bytes)
        .zip(scales.par_chunks_mut(piece_scales))
        .enumerate()
        .filter_map(|(piece, (codes, scales))| {
            let mut values = vec![0.0f32; scales.len() * group];
            read(piece * PIECE_GROUPS * QUANT_GROUP, &mut values);
            quantize_groups(&values, q, group, codes, scales).err()
        })
        .collect();
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok((codes, scales)),
    }
}

/// [`quantize`] of whole scale groups of `group` values into `codes` and
/// `scales` (as many as `scales` holds).
fn quantize_groups(
    values: &[f32],
    q: Quant,
    group: usize,
    codes: &mut [u8],
    scales: &mut [f16],
) -> Result<(), String> {
    let qmax = q.qmax();
    let group_bytes = q.group_bytes() * group / QUANT_GROUP;
    for ((g, scale), out) in values
        .chunks_exact(group)
        .zip(scales.iter_mut())
        .zip(codes.chunks_exact_mut(group_bytes))
    {
        let max = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        *scale = f16_at_least(max / qmax).ok_or_else(|| {
            format!("values up to {max:e} are too large for {q:?} quantization's f16 scales")
        })?;
        let s = scale.to_f32();
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        match q {
            Quant::Int8 => {
                for (c, v) in out.iter_mut().zip(g) {
                    *c = (v * inv).round().clamp(-127.0, 127.0) as i8 as u8;
                }
            }
            Quant::Int4 => {
                let code = |v: f32| ((v * inv).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                for (c, p) in out.iter_mut().zip(g.chunks_exact(2)) {
                    *c = code(p[0]) | (code(p[1]) << 4);
                }
            }
        }
    }
    Ok(())
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
            let (codes, scales) = quantize(&w, q, QUANT_GROUP).unwrap();
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
        let (_, s) = quantize(&[127.0; 32], Quant::Int8, QUANT_GROUP).unwrap();
        assert_eq!(s[0].to_f32(), 1.0);
    }

    #[test]
    fn values_beyond_f16_scales_are_an_error_naming_them() {
        let mut w = vec![0.5f32; 32];
        w[3] = 1e7;
        let e = quantize(&w, Quant::Int8, QUANT_GROUP).unwrap_err();
        assert!(e.contains("1e7") && e.contains("Int8"), "{e}");
        w[3] = f32::INFINITY;
        assert!(quantize(&w, Quant::Int4, QUANT_GROUP).is_err());
        // Zeros quantize to zero codes and a zero scale.
        let (codes, s) = quantize(&[0.0; 32], Quant::Int4, QUANT_GROUP).unwrap();
        assert!(codes.iter().all(|&b| b == 0x88) && s[0].to_f32() == 0.0);
    }

    /// A bf16 weight of several pieces (the last one partial) quantizes to
    /// what its groups quantize to one at a time: each piece widens and
    /// writes its own range.
    #[test]
    fn a_weight_quantizes_piece_by_piece_as_group_by_group() {
        let (rows, cols) = (3, PIECE_GROUPS * QUANT_GROUP / 2 + 256);
        let bf: Vec<half::bf16> = (0..rows * cols)
            .map(|i| {
                half::bf16::from_f32(((i * 7919 % 2003) as f32 - 1001.0) / (1 + i % 97) as f32)
            })
            .collect();
        let bytes: Vec<u8> = bf.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = [rows, cols];
        let t = HostTensor {
            name: "w",
            dtype: DType::BF16,
            shape: &shape,
            bytes: &bytes,
            map: None,
        };
        for q in [Quant::Int8, Quant::Int4] {
            for group in SCALE_GROUPS {
                let w = quantize_weight(&t, q, group).unwrap();
                assert_eq!(w.group, group, "{q:?}: rows of {cols} take {group}");
                let (mut want_codes, mut want_scales) = (Vec::new(), Vec::new());
                for g in bf.chunks(group) {
                    let f: Vec<f32> = g.iter().map(|v| v.to_f32()).collect();
                    let (c, s) = quantize(&f, q, group).unwrap();
                    want_codes.extend(c);
                    want_scales.extend(s);
                }
                assert_eq!(w.scales.len(), rows * cols / group, "{q:?} {group}");
                assert!(w.scales == want_scales, "{q:?} {group}: scales differ");
                assert!(w.codes == want_codes, "{q:?} {group}: codes differ");
            }
        }
    }

    /// Bad weights are refused naming the tensor: the wrong shape or dtype,
    /// and values too large, the first failing group's when several pieces
    /// have one.
    #[test]
    fn a_weight_that_cannot_be_quantized_is_an_error_naming_it() {
        let n = 3 * PIECE_GROUPS * QUANT_GROUP;
        let mut w = vec![0.5f32; n];
        w[PIECE_GROUPS * QUANT_GROUP + 5] = 3e7;
        w[2 * PIECE_GROUPS * QUANT_GROUP + 5] = 9e7;
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = [n / 64, 64];
        let t = HostTensor {
            name: "blk.2.ffn_down",
            dtype: DType::F32,
            shape: &shape,
            bytes: &bytes,
            map: None,
        };
        let e = quantize_weight(&t, Quant::Int8, 32)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("blk.2.ffn_down") && e.contains("3e7") && !e.contains("9e7"),
            "{e}"
        );
        for (dtype, shape) in [
            (DType::F32, vec![n]),
            (DType::F32, vec![n / 48, 48]),
            (DType::U8, vec![n / 64, 64]),
        ] {
            let t = HostTensor {
                name: "blk.2.ffn_down",
                dtype,
                shape: &shape,
                bytes: &bytes,
                map: None,
            };
            let e = quantize_weight(&t, Quant::Int4, 32)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("blk.2.ffn_down") && e.contains("--quant needs 2-D float weights"),
                "{e}"
            );
        }
    }

    /// A scale group of 128 values: one scale covers four code groups, is
    /// the least f16 at or above their max|w| / qmax, and the codes are the
    /// values divided by it (so a small group beside a large one keeps
    /// coarse codes: the price of the larger group).
    #[test]
    fn a_scale_covers_its_whole_scale_group() {
        let mut w: Vec<f32> = (0..256)
            .map(|i| ((i * 29 % 31) as f32 - 15.0) / 64.0)
            .collect();
        w[200] = 3.0;
        for q in [Quant::Int8, Quant::Int4] {
            let (codes, scales) = quantize(&w, q, 128).unwrap();
            assert_eq!(scales.len(), 2);
            let (_, fine) = quantize(&w, q, QUANT_GROUP).unwrap();
            for (s, g) in scales.iter().zip(w.chunks(128)) {
                let need = g.iter().fold(0.0f32, |m, v| m.max(v.abs())) / q.qmax();
                assert!(s.to_f32() >= need && f16::from_bits(s.to_bits() - 1).to_f32() < need);
            }
            // The second scale group's scale is its largest code group's.
            assert_eq!(scales[1], fine[6], "{q:?}");
            // Value 0's code is its value over the first scale.
            let c0 = match q {
                Quant::Int8 => codes[0] as i8 as i32,
                Quant::Int4 => (codes[0] & 15) as i32 - 8,
            };
            assert_eq!(c0, (w[0] / scales[0].to_f32()).round() as i32, "{q:?}");
        }
    }

    /// Each matrix takes the largest scale group up to the one asked that
    /// divides its rows; other asks are refused.
    #[test]
    fn scale_groups_fit_the_rows() {
        assert_eq!(scale_group_for(4096, 128), Some(128));
        assert_eq!(scale_group_for(2880, 128), Some(64));
        assert_eq!(scale_group_for(2880, 256), Some(64));
        assert_eq!(scale_group_for(320, 256), Some(64));
        assert_eq!(scale_group_for(96, 128), Some(32));
        assert_eq!(scale_group_for(4096, 32), Some(32));
        assert_eq!(scale_group_for(48, 32), None);
        assert_eq!(scale_group_for(4096, 100), None);
        assert_eq!(scale_group_for(4096, 512), None);
        assert_eq!(SCALE_GROUPS.map(scale_shift), [0, 1, 2, 3]);
        let bytes = vec![0u8; 4 * 4096];
        let t = HostTensor {
            name: "q_proj",
            dtype: DType::F32,
            shape: &[1, 4096],
            bytes: &bytes,
            map: None,
        };
        let e = quantize_weight(&t, Quant::Int8, 100)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("q_proj") && e.contains("--quant-group") && e.contains("100"),
            "{e}"
        );
    }
}
