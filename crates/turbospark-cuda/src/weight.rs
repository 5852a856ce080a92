//! Device weight storage. Every weight stays in its checkpoint format in
//! device memory (the bytes are copied as they are): f32, bf16 and f16 as
//! dense arrays, MXFP4 as its packed blocks and E8M0 scales. Kernels widen
//! to f32 as they read. Weight-only int8/int4 (`--quant`) is quantized here,
//! on the host, with the CPU backend's exact rule, so both backends hold the
//! same codes. It owns upload, validation and that quantization; it must
//! not do other arithmetic.

use cudarc::driver::CudaSlice;
use turbospark_backend::{BackendError, Quant, Result};
use turbospark_format::{DType, HostTensor};

use crate::Cuda;
use crate::memory::Purpose;

/// Element type of a dense weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dense {
    F32,
    Bf16,
    F16,
}

impl Dense {
    /// The dtype code the kernels take (`DT_*` in kernels/common.cuh).
    pub fn code(self) -> i32 {
        match self {
            Dense::F32 => 0,
            Dense::Bf16 => 1,
            Dense::F16 => 2,
        }
    }

    pub fn size(self) -> usize {
        match self {
            Dense::F32 => 4,
            Dense::Bf16 | Dense::F16 => 2,
        }
    }
}

pub enum WeightData {
    /// Row-major little-endian elements, as in the checkpoint.
    Dense { dtype: Dense, bytes: CudaSlice<u8> },
    /// Per row, `cols/32` blocks of 16 bytes (two E2M1 codes a byte, low
    /// nibble first) and `cols/32` E8M0 scale bytes.
    Mxfp4 {
        blocks: CudaSlice<u8>,
        scales: CudaSlice<u8>,
    },
    /// Per row, groups of 32 codes (int8: a byte each; int4: `value + 8`
    /// packed two a byte, low nibble first) and one f16 scale (its bits)
    /// per `group` values: code group g's is scale `g >> scale_shift(group)`.
    Quantized {
        quant: Quant,
        codes: CudaSlice<u8>,
        scales: CudaSlice<u16>,
        group: usize,
    },
}

pub struct CudaWeight {
    pub data: WeightData,
    pub shape: Vec<usize>,
}

impl CudaWeight {
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

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        match &self.data {
            WeightData::Dense { dtype, .. } => self.numel() * dtype.size(),
            WeightData::Mxfp4 { .. } => self.numel() / 2 + self.numel() / 32,
            WeightData::Quantized { quant, group, .. } => {
                let codes = match quant {
                    Quant::Int8 => self.numel(),
                    Quant::Int4 => self.numel() / 2,
                };
                codes + self.numel() / group * 2
            }
        }
    }

    /// (device address, dtype code) of a dense weight; panics for the
    /// grouped formats, which only the matrix kernels read.
    pub(crate) fn dense_ptr(&self, be: &Cuda, what: &str) -> (u64, i32) {
        match &self.data {
            WeightData::Dense { dtype, bytes } => (be.ptr(bytes), dtype.code()),
            _ => panic!("{what}: only f32, bf16 and f16 weights are supported here"),
        }
    }

    pub(crate) fn from_host(be: &Cuda, t: &HostTensor<'_>) -> Result<Self> {
        let dtype = match t.dtype {
            DType::F32 => Dense::F32,
            DType::BF16 => Dense::Bf16,
            DType::F16 => Dense::F16,
            DType::U8 => {
                return Err(BackendError::Unsupported(format!(
                    "tensor `{}`: u8 data is not a plain weight",
                    t.name
                )));
            }
        };
        if t.bytes.len() != t.numel() * dtype.size() {
            return Err(BackendError::Unsupported(format!(
                "tensor `{}`: {} bytes for shape {:?} of {}",
                t.name,
                t.bytes.len(),
                t.shape,
                t.dtype.name()
            )));
        }
        let what = || format!("tensor `{}`", t.name);
        Ok(CudaWeight {
            data: WeightData::Dense {
                dtype,
                bytes: be.try_upload(t.bytes, &weights(&what))?,
            },
            shape: t.shape.to_vec(),
        })
    }

    pub(crate) fn from_mxfp4(
        be: &Cuda,
        blocks: &HostTensor<'_>,
        scales: &HostTensor<'_>,
    ) -> Result<Self> {
        let shape = turbospark_backend::mxfp4_shape(blocks, scales)?;
        let what = || format!("tensor `{}`", blocks.name);
        Ok(CudaWeight {
            data: WeightData::Mxfp4 {
                blocks: be.try_upload(blocks.bytes, &weights(&what))?,
                scales: be.try_upload(scales.bytes, &weights(&what))?,
            },
            shape,
        })
    }

    pub(crate) fn quantized(
        be: &Cuda,
        t: &HostTensor<'_>,
        quant: Quant,
        group: usize,
    ) -> Result<Self> {
        let q = turbospark_backend::quant::quantize_weight(t, quant, group)?;
        let scale_bits: Vec<u16> = q.scales.iter().map(|s| s.to_bits()).collect();
        let what = || format!("tensor `{}` ({quant:?})", t.name);
        Ok(CudaWeight {
            data: WeightData::Quantized {
                quant,
                codes: be.try_upload(&q.codes, &weights(&what))?,
                scales: be.try_upload(&scale_bits, &weights(&what))?,
                group: q.group,
            },
            shape: t.shape.to_vec(),
        })
    }

    pub(crate) fn from_f32(be: &Cuda, values: &[f32], shape: &[usize]) -> Result<Self> {
        if values.len() != shape.iter().product::<usize>() {
            return Err(BackendError::Unsupported(format!(
                "{} f32 values for shape {shape:?}",
                values.len()
            )));
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let what = || format!("an f32 weight of shape {shape:?}");
        Ok(CudaWeight {
            data: WeightData::Dense {
                dtype: Dense::F32,
                bytes: be.try_upload(&bytes, &weights(&what))?,
            },
            shape: shape.to_vec(),
        })
    }
}

/// A weight's upload: its failure names the tensor and says to load fewer
/// bytes.
fn weights<'a>(what: &'a dyn Fn() -> String) -> Purpose<'a> {
    Purpose {
        what,
        hint: turbospark_backend::WEIGHTS_HINT,
    }
}
