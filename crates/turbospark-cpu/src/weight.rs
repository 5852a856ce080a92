//! CPU weight storage. bf16 and f16 stay in their 16-bit form in memory
//! (half the bytes of f32, which is what batch-1 decode is bound by) and are
//! widened to f32 inside the kernels; f32 stays f32. Arithmetic is always f32.

use turbospark_backend::{BackendError, Result};
use turbospark_format::{DType, HostTensor};

pub enum WeightData {
    F32(Vec<f32>),
    /// Raw bf16 bits: the f32 value is `bits << 16`.
    BF16(Vec<u16>),
    /// Raw IEEE half bits.
    F16(Vec<u16>),
}

pub struct CpuWeight {
    pub data: WeightData,
    pub shape: Vec<usize>,
}

impl CpuWeight {
    pub fn from_host(t: &HostTensor<'_>) -> Result<Self> {
        let halves = || -> Vec<u16> {
            t.bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        };
        let data = match t.dtype {
            DType::F32 => WeightData::F32(t.to_f32()),
            DType::BF16 => WeightData::BF16(halves()),
            DType::F16 => WeightData::F16(halves()),
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

    pub fn from_f32(values: &[f32], shape: &[usize]) -> Self {
        CpuWeight {
            data: WeightData::F32(values.to_vec()),
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
        }
    }

    /// Widens elements `[start, start + out.len())` into `out`.
    pub fn read_f32(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match &self.data {
            WeightData::F32(v) => out.copy_from_slice(&v[start..end]),
            WeightData::BF16(v) => crate::simd::bf16_to_f32(&v[start..end], out),
            WeightData::F16(v) => crate::simd::f16_to_f32(&v[start..end], out),
        }
    }

    /// All values as f32 (small vectors: norms, biases).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.numel()];
        self.read_f32(0, &mut out);
        out
    }

    /// Dot product of row `r` with `x`.
    #[inline]
    pub fn dot_row(&self, r: usize, x: &[f32]) -> f32 {
        let k = x.len();
        let range = r * k..(r + 1) * k;
        match &self.data {
            WeightData::F32(v) => crate::simd::dot_f32(x, &v[range]),
            WeightData::BF16(v) => crate::simd::dot_bf16(x, &v[range]),
            WeightData::F16(v) => crate::simd::dot_f16(x, &v[range]),
        }
    }
}
