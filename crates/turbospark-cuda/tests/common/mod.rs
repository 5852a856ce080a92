//! Helpers shared by the GPU test binaries: the device (or a skip), a
//! reproducible RNG, the same weights and tensors on both backends, and
//! the relative-error check. Each binary uses a subset.
#![allow(dead_code)]

mod cxx;
mod emulated_gpu;
pub mod kv;
mod tolerances;
// Not every binary checks against every bound.
#[allow(unused_imports)]
pub use tolerances::*;

use std::sync::{Mutex, MutexGuard};

use turbospark_backend::{Backend, Quant};
use turbospark_cpu::{Cpu, CpuTensor, CpuWeight};
use turbospark_cuda::{Cuda, CudaError, CudaTensor, CudaWeight};
use turbospark_format::{DType, HostTensor};

/// The first GPU, held by one test at a time (see [`Gpu`]). Where there is
/// no CUDA driver library, the emulated GPU ([`emulated_gpu`]: the kernels'
/// source on the CPU, behind an emulated driver) stands in; where it cannot
/// either (no C++ compiler, `TURBOSPARK_EMULATED_GPU=0`) or there is a
/// driver but no device, `None`: the test is skipped, saying so. A device
/// that is there but fails to start is a failure, not a skip.
pub fn gpu() -> Option<Gpu> {
    static TURN: Mutex<()> = Mutex::new(());
    // A test that failed while holding the GPU leaves nothing to undo.
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let cuda = match Cuda::new() {
        Err(CudaError::MissingLibrary("cuda")) if emulated_gpu::load() => Cuda::new(),
        r => r,
    };
    match cuda {
        Ok(cuda) => Some(Gpu { cuda, _turn: turn }),
        Err(e) if absent(&e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
        Err(e) => panic!("the CUDA device did not start: {e}"),
    }
}

/// Whether [`gpu`] gave the emulated GPU: the kernels' source on the CPU,
/// with the host's rounding rather than the GPU's (its fused multiply-adds,
/// its expf), for the one check whose bound is set by the GPU's own.
pub fn emulated() -> bool {
    emulated_gpu::in_use()
}

/// A test's GPU. The test harness runs tests on parallel threads, but
/// the GPU tests of a binary take turns: tests that fill the GPU's memory
/// (memory.rs) failed beside each other, and a recorded replay failed
/// with a launch error 2 times in 16 beside other tests (BENCHMARKS.md,
/// twenty-seventh session). The backend drops before the turn passes.
pub struct Gpu {
    cuda: Cuda,
    _turn: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Gpu {
    type Target = Cuda;
    fn deref(&self) -> &Cuda {
        &self.cuda
    }
}

impl std::ops::DerefMut for Gpu {
    fn deref_mut(&mut self) -> &mut Cuda {
        &mut self.cuda
    }
}

fn absent(e: &CudaError) -> bool {
    use cudarc::driver::sys::CUresult;
    match e {
        CudaError::MissingLibrary(_) => true,
        CudaError::Driver(d) => d.0 == CUresult::CUDA_ERROR_NO_DEVICE,
        CudaError::NoSuchDevice { count: 0, .. } => true,
        _ => false,
    }
}

/// xorshift64*: reproducible inputs without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [−scale, scale).
    pub fn f32(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(scale)).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Checkpoint bytes of `values` in `dtype`.
pub fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::U8 => unreachable!("not a float dtype"),
    }
}

/// The same weight on both backends.
pub fn weight(g: &Cuda, values: &[f32], shape: &[usize], dtype: DType) -> (CpuWeight, CudaWeight) {
    let bytes = encode(values, dtype);
    let t = HostTensor {
        name: "w",
        dtype,
        shape,
        bytes: &bytes,
        map: None,
    };
    (Cpu.upload(&t).unwrap(), g.upload(&t).unwrap())
}

pub fn mxfp4(g: &Cuda, rng: &mut Rng, lead: &[usize], cols: usize) -> (CpuWeight, CudaWeight) {
    // Scales 2^−6 ..= 2^1: values of a realistic magnitude.
    mxfp4_scaled(g, rng, lead, cols, 121..=128)
}

/// An MXFP4 weight with random codes and E8M0 scale bytes in `scales`.
pub fn mxfp4_scaled(
    g: &Cuda,
    rng: &mut Rng,
    lead: &[usize],
    cols: usize,
    scales: std::ops::RangeInclusive<u8>,
) -> (CpuWeight, CudaWeight) {
    let groups = cols / 32;
    let mut bshape = lead.to_vec();
    bshape.extend([groups, 16]);
    let mut sshape = lead.to_vec();
    sshape.push(groups);
    let n: usize = sshape.iter().product();
    let blocks: Vec<u8> = (0..n * 16).map(|_| rng.next() as u8).collect();
    let span = (scales.end() - scales.start()) as u64 + 1;
    let scales: Vec<u8> = (0..n)
        .map(|_| scales.start() + rng.below(span) as u8)
        .collect();
    let b = HostTensor {
        name: "blocks",
        dtype: DType::U8,
        shape: &bshape,
        bytes: &blocks,
        map: None,
    };
    let s = HostTensor {
        name: "scales",
        dtype: DType::U8,
        shape: &sshape,
        bytes: &scales,
        map: None,
    };
    (
        // The reference multiplies f32 x (see `quantized`).
        Cpu.upload_mxfp4(&b, &s).unwrap().with_f32_x(),
        g.upload_mxfp4(&b, &s).unwrap(),
    )
}

/// `values` quantized at load by both backends, one scale a `group`
/// values (where the rows allow: `quant::scale_group_for`).
pub fn quantized(
    g: &Cuda,
    values: &[f32],
    shape: [usize; 2],
    q: Quant,
    group: usize,
) -> (CpuWeight, CudaWeight) {
    let bytes = encode(values, DType::BF16);
    let t = HostTensor {
        name: "w",
        dtype: DType::BF16,
        shape: &shape,
        bytes: &bytes,
        map: None,
    };
    (
        // The reference multiplies f32 x: the bounds (tolerances.rs) are
        // those of the GPU's x rounding alone.
        Cpu.upload_quantized(&t, q, group).unwrap().with_f32_x(),
        g.upload_quantized(&t, q, group).unwrap(),
    )
}

pub fn tensors(g: &Cuda, data: &[f32], rows: usize, cols: usize) -> (CpuTensor, CudaTensor) {
    let cpu = CpuTensor {
        data: data.to_vec(),
        rows,
        cols,
    };
    (cpu, g.upload_tensor(data, rows, cols))
}

/// max |got − want| / rms(want); NaN where either has a NaN the other lacks.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    if got.iter().zip(want).any(|(a, b)| a.is_nan() != b.is_nan()) {
        return f32::NAN;
    }
    let rms =
        (want.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let max = got
        .iter()
        .zip(want)
        .filter(|(a, _)| !a.is_nan())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    if max == 0.0 {
        0.0
    } else {
        max / rms.max(1e-30) as f32
    }
}

pub fn check(what: &str, g: &Cuda, got: &CudaTensor, want: &CpuTensor, tol: f32) {
    assert_eq!(g.shape(got), (want.rows, want.cols), "{what}: shape");
    let err = rel_err(&g.to_host(got), &want.data);
    assert!(err <= tol, "{what}: max|Δ|/rms = {err} > {tol}");
}
