//! CPU weight storage. bf16 and f16 stay in their 16-bit form in memory
//! (half the bytes of f32, which is what batch-1 decode is bound by) and are
//! widened to f32 inside the kernels; f32 stays f32; MXFP4 stays packed and
//! is decoded block by block; int8/int4 codes stay codes. Weights a
//! checkpoint holds as they are used stay in its mapping ([`Storage`]).
//! Arithmetic is f32, except the integer group sums of int8/int4/MXFP4
//! decode (`quant.rs`, `mxfp4.rs`).

use turbospark_backend::quant::scale_shift;
use turbospark_backend::{BackendError, QUANT_GROUP, Quant, Result};
use turbospark_format::{DType, HostTensor};

use crate::mxfp4::RoundedX16;
use crate::quant::RoundedX;
use crate::storage::Storage;

pub enum WeightData {
    F32(Storage<f32>),
    /// Raw bf16 bits: the f32 value is `bits << 16`.
    BF16(Storage<u16>),
    /// Raw IEEE half bits.
    F16(Storage<u16>),
    /// MXFP4: per row, `cols/2` bytes of E2M1 codes (low nibble first) and
    /// `cols/32` E8M0 scales, one per block of 32 values.
    Mxfp4 {
        blocks: Storage<u8>,
        scales: Storage<u8>,
        /// Decode's dot products multiply x rounded to int16 codes
        /// (`mxfp4::RoundedX16`), as the GPU's MXFP4 GEMVs do; `false`
        /// multiplies f32 x ([`CpuWeight::with_f32_x`]).
        int_x: bool,
    },
    /// int8/int4 codes with one f16 scale per `group` values (`quant.rs`).
    Quantized {
        quant: Quant,
        codes: Vec<u8>,
        scales: Vec<half::f16>,
        /// Values a scale: 32 (`--quant-group`'s default) to 256.
        group: usize,
        /// Decode's dot products multiply x rounded to int8 codes
        /// (`quant::RoundedX`), as llama.cpp's Q8_0/Q4_0 and the GPU's
        /// decode GEMVs do; `false` multiplies f32 x by the widened
        /// weights, weight-only arithmetic ([`CpuWeight::with_f32_x`]).
        int_x: bool,
    },
}

pub struct CpuWeight {
    pub data: WeightData,
    pub shape: Vec<usize>,
}

impl CpuWeight {
    pub fn from_host(t: &HostTensor<'_>) -> Result<Self> {
        let data = match t.dtype {
            // Vectors (norms, biases, sinks) are widened once here: exact, a
            // few KB, and the kernels then borrow them instead of converting
            // on every call.
            _ if t.shape.len() == 1 && t.dtype != DType::U8 => WeightData::F32(t.to_f32().into()),
            DType::F32 => WeightData::F32(Storage::of(t)),
            DType::BF16 => WeightData::BF16(Storage::of(t)),
            DType::F16 => WeightData::F16(Storage::of(t)),
            DType::U8 => {
                return Err(BackendError::Unsupported(format!(
                    "tensor `{}`: u8 data is not a plain weight",
                    t.name
                )));
            }
        };
        Ok(CpuWeight {
            data,
            shape: t.shape.to_vec(),
        })
    }

    pub fn from_mxfp4(blocks: &HostTensor<'_>, scales: &HostTensor<'_>) -> Result<Self> {
        let shape = turbospark_backend::mxfp4_shape(blocks, scales)?;
        Ok(CpuWeight {
            data: WeightData::Mxfp4 {
                blocks: Storage::of(blocks),
                scales: Storage::of(scales),
                int_x: true,
            },
            shape,
        })
    }

    pub fn quantized(t: &HostTensor<'_>, quant: Quant, group: usize) -> Result<Self> {
        let q = turbospark_backend::quant::quantize_weight(t, quant, group)?;
        Ok(CpuWeight {
            data: WeightData::Quantized {
                quant,
                codes: q.codes,
                scales: q.scales,
                group: q.group,
                int_x: true,
            },
            shape: t.shape.to_vec(),
        })
    }

    /// The same int8/int4/MXFP4 codes multiplying f32 x in decode too
    /// (nothing rounded but the weights): the reference that the GPU's
    /// GEMVs are checked against in every precision. Other formats are
    /// unchanged.
    pub fn with_f32_x(mut self) -> Self {
        if let WeightData::Quantized { int_x, .. } | WeightData::Mxfp4 { int_x, .. } =
            &mut self.data
        {
            *int_x = false;
        }
        self
    }

    pub fn from_f32(values: &[f32], shape: &[usize]) -> Self {
        CpuWeight {
            data: WeightData::F32(values.to_vec().into()),
            shape: shape.to_vec(),
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Width of one row (the last dimension).
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }

    pub fn rows(&self) -> usize {
        self.numel() / self.cols().max(1)
    }

    pub fn bytes(&self) -> usize {
        match &self.data {
            WeightData::F32(v) => v.len() * 4,
            WeightData::BF16(v) | WeightData::F16(v) => v.len() * 2,
            WeightData::Mxfp4 { blocks, scales, .. } => blocks.len() + scales.len(),
            WeightData::Quantized { codes, scales, .. } => codes.len() + scales.len() * 2,
        }
    }

    /// Widens elements `[start, start + out.len())` into `out` (for MXFP4,
    /// `start` and the length must be multiples of 32).
    pub fn read_f32(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match &self.data {
            WeightData::F32(v) => out.copy_from_slice(&v[start..end]),
            WeightData::BF16(v) => crate::simd::bf16_to_f32(&v[start..end], out),
            WeightData::F16(v) => crate::simd::f16_to_f32(&v[start..end], out),
            WeightData::Mxfp4 { blocks, scales, .. } => {
                assert!(
                    start.is_multiple_of(32) && out.len().is_multiple_of(32),
                    "MXFP4 reads whole blocks"
                );
                let (g0, g1) = (start / 32, end / 32);
                crate::simd::decode_mxfp4(&blocks[g0 * 16..g1 * 16], &scales[g0..g1], out);
            }
            WeightData::Quantized {
                quant,
                codes,
                scales,
                group,
                ..
            } => {
                assert!(
                    start.is_multiple_of(QUANT_GROUP),
                    "quantized reads whole groups"
                );
                let shift = scale_shift(*group);
                crate::quant::dequantize(codes, scales, *quant, shift, start / QUANT_GROUP, out);
            }
        }
    }

    /// The values as f32, borrowed when stored as f32 (every vector is).
    pub fn f32_view(&self) -> std::borrow::Cow<'_, [f32]> {
        match &self.data {
            WeightData::F32(v) => std::borrow::Cow::Borrowed(v),
            _ => std::borrow::Cow::Owned(self.to_f32()),
        }
    }

    /// All values as f32 (small vectors: norms, biases).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.numel()];
        self.read_f32(0, &mut out);
        out
    }

    /// x as this weight's dot products read it: the f32 row, and for
    /// int8/int4/MXFP4 weights that multiply integer x also the row rounded
    /// to codes (`quant::RoundedX`, `mxfp4::RoundedX16`), made once here
    /// rather than once per weight row.
    pub fn input<'a>(&self, x: &'a [f32]) -> RowInput<'a> {
        let rounded = match &self.data {
            WeightData::Quantized {
                quant, int_x: true, ..
            } => Rounded::Int8(RoundedX::new(x, *quant)),
            WeightData::Mxfp4 { int_x: true, .. } => Rounded::Int16(RoundedX16::new(x)),
            _ => Rounded::No,
        };
        RowInput { x, rounded }
    }

    /// Dot product of row `r` with `x` (made by [`CpuWeight::input`]).
    /// The rounding `x` holds decides the arithmetic: integer codes where
    /// it has the weight's kind, f32 x otherwise (a weight made
    /// [`with_f32_x`](Self::with_f32_x), or an input made for another
    /// weight).
    #[inline]
    pub fn dot_row(&self, r: usize, x: &RowInput<'_>) -> f32 {
        let k = x.x.len();
        let range = r * k..(r + 1) * k;
        match &self.data {
            WeightData::F32(v) => crate::simd::dot_f32(x.x, &v[range]),
            WeightData::BF16(v) => crate::simd::dot_bf16(x.x, &v[range]),
            WeightData::F16(v) => crate::simd::dot_f16(x.x, &v[range]),
            WeightData::Mxfp4 { blocks, scales, .. } => {
                let groups = k / 32;
                let (blocks, scales) = (
                    &blocks[r * groups * 16..(r + 1) * groups * 16],
                    &scales[r * groups..(r + 1) * groups],
                );
                match &x.rounded {
                    Rounded::Int16(rx) => crate::mxfp4::dot(rx, blocks, scales),
                    _ => crate::simd::dot_mxfp4(x.x, blocks, scales),
                }
            }
            WeightData::Quantized {
                quant,
                codes,
                scales,
                group,
                ..
            } => {
                let per_row = match quant {
                    Quant::Int8 => k,
                    Quant::Int4 => k / 2,
                };
                let (row_scales, shift) = (k / group, scale_shift(*group));
                let (codes, scales) = (
                    &codes[r * per_row..(r + 1) * per_row],
                    &scales[r * row_scales..(r + 1) * row_scales],
                );
                match &x.rounded {
                    // The codes' layout follows the format it was rounded for.
                    Rounded::Int8(rx) if rx.quant() == *quant => {
                        crate::quant::dot(rx, codes, scales, shift)
                    }
                    _ => ROW.with(|row| {
                        let mut row = row.borrow_mut();
                        row.resize(k, 0.0);
                        crate::quant::dequantize(codes, scales, *quant, shift, 0, &mut row);
                        crate::simd::dot_f32(x.x, &row)
                    }),
                }
            }
        }
    }

    /// [`dot_row`](Self::dot_row) of row `r` with N rows of x. MXFP4 rows
    /// whose x rows are all rounded for them go through one kernel call,
    /// which looks up and widens each block once for the N rows; other
    /// formats take one x row at a time.
    #[inline]
    pub fn dot_row_inputs<const N: usize>(&self, r: usize, xs: [&RowInput<'_>; N]) -> [f32; N] {
        if let WeightData::Mxfp4 { blocks, scales, .. } = &self.data {
            let rounded = xs.map(|x| match &x.rounded {
                Rounded::Int16(rx) => Some(rx),
                _ => None,
            });
            if rounded.iter().all(Option::is_some) {
                let groups = xs[0].x.len() / 32;
                return crate::mxfp4::dot_inputs(
                    rounded.map(|rx| rx.expect("checked")),
                    &blocks[r * groups * 16..(r + 1) * groups * 16],
                    &scales[r * groups..(r + 1) * groups],
                );
            }
        }
        xs.map(|x| self.dot_row(r, x))
    }
}

thread_local! {
    /// A widened row of an int8/int4 weight multiplying f32 x (the
    /// reference path).
    static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One row of x prepared for a weight's dot products ([`CpuWeight::input`]).
pub struct RowInput<'a> {
    x: &'a [f32],
    rounded: Rounded,
}

/// x rounded for an integer dot product, if the weight's format has one.
enum Rounded {
    No,
    Int8(RoundedX),
    Int16(RoundedX16),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights too large for an f16 group scale are refused at load with
    /// the tensor's name, not stored as infinities.
    #[test]
    fn quantizing_values_beyond_f16_scales_names_the_tensor() {
        let mut values = vec![0.25f32; 64];
        values[40] = -2e7;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = HostTensor {
            name: "model.layers.3.mlp.down_proj.weight",
            dtype: DType::F32,
            shape: &[2, 32],
            bytes: &bytes,
            map: None,
        };
        let e = CpuWeight::quantized(&t, Quant::Int8, 32)
            .err()
            .expect("an error")
            .to_string();
        assert!(
            e.contains("model.layers.3.mlp.down_proj.weight") && e.contains("f16"),
            "{e}"
        );
        values[40] = 2.0;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let w = CpuWeight::quantized(&HostTensor { bytes: &bytes, ..t }, Quant::Int4, 32).unwrap();
        assert_eq!(
            w.bytes(),
            32 + 2 * 2,
            "int4: 16 code bytes and one f16 a group"
        );
        let w = CpuWeight::quantized(&HostTensor { bytes: &bytes, ..t }, Quant::Int8, 128).unwrap();
        assert_eq!(
            w.bytes(),
            64 + 2 * 2,
            "rows of 32 values keep 32-value groups"
        );
    }

    /// A checkpoint's bf16 and MXFP4 weights stay in its mapping, with
    /// the values a copy would hold; norms (vectors, widened to f32) are
    /// owned.
    #[test]
    fn checkpoint_weights_are_read_in_place() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/gpt-oss-mxfp4");
        let ckpt = turbospark_format::Checkpoint::open(&dir).unwrap();
        let head = ckpt.get("lm_head.weight").unwrap();
        let w = CpuWeight::from_host(&head).unwrap();
        let copy = CpuWeight::from_host(&HostTensor { map: None, ..head }).unwrap();
        match (&w.data, &copy.data) {
            (WeightData::BF16(m), WeightData::BF16(c)) => {
                assert!(m.is_mapped() && !c.is_mapped());
                assert_eq!(&m[..], &c[..]);
            }
            _ => panic!("lm_head is bf16"),
        }
        let base = "model.layers.0.mlp.experts.down_proj";
        let (b, s) = (
            ckpt.get(&format!("{base}_blocks")).unwrap(),
            ckpt.get(&format!("{base}_scales")).unwrap(),
        );
        let w = CpuWeight::from_mxfp4(&b, &s).unwrap();
        let WeightData::Mxfp4 { blocks, scales, .. } = &w.data else {
            panic!("MXFP4")
        };
        assert!(blocks.is_mapped() && scales.is_mapped());
        assert_eq!((&blocks[..], &scales[..]), (b.bytes, s.bytes));
        let norm = CpuWeight::from_host(&ckpt.get("model.norm.weight").unwrap()).unwrap();
        assert!(matches!(&norm.data, WeightData::F32(v) if !v.is_mapped()));
    }
}
