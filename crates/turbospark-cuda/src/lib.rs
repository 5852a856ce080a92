//! The CUDA backend: a second implementation of
//! [`turbospark_backend::Backend`] for NVIDIA GPUs (Hopper, sm_90, first; any
//! sm_80+ GPU works), checked against the CPU reference.
//!
//! Activations are f32 in device memory, weights stay in their checkpoint
//! formats (f32, bf16, f16, MXFP4) or the load-time int8/int4, the KV store
//! is f32. Kernels are CUDA
//! C++ in `kernels/`, compiled at run time by NVRTC and cached on disk
//! ([`compile`]); matrix products with many rows go to cuBLAS ([`linear`]).
//! The driver, NVRTC and cuBLAS are loaded at run time, so this crate builds
//! everywhere and [`Cuda::new`] returns an error where there is no GPU.
//!
//! All work runs in order on one stream; only [`Backend::to_host`] (and
//! uploads) wait for it. This module owns the device handle, the tensor
//! type and the trait's dispatch; it must not know about model families.

pub mod attention;
pub mod compile;
pub mod kernels;
pub mod linear;
pub mod moe;
pub mod ops;
pub mod weight;

use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, ValidAsZeroBits, sys,
};
use turbospark_backend::{
    AttnParams, Backend, Experts, KvSpec, MoeParams, Quant, Result, RopeTable,
};
use turbospark_format::{Activation, HostTensor};

pub use attention::CudaKv;
pub use weight::{CudaWeight, Dense, WeightData};

/// Why the CUDA backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver: lib{0} could not be loaded")]
    MissingLibrary(&'static str),
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    #[error("cuBLAS: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    #[error("compiling kernels/{file}: {log}")]
    Compile { file: String, log: String },
    #[error("{name} has compute capability {major}.{minor}; sm_80 or newer is required")]
    TooOld {
        name: String,
        major: i32,
        minor: i32,
    },
}

/// A row-major `[rows, cols]` f32 matrix in device memory.
pub struct CudaTensor {
    /// At least one element, so that an empty tensor is still an allocation.
    pub data: CudaSlice<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// One GPU: its context, the stream all work runs on, cuBLAS and the
/// kernels.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// cuBLAS handles must not be used from two threads at once.
    blas: Mutex<CudaBlas>,
    k: kernels::Kernels,
    sm_count: u32,
    arch: String,
    name: String,
}

impl Cuda {
    /// The first GPU.
    pub fn new() -> std::result::Result<Cuda, CudaError> {
        Cuda::with_device(0)
    }

    /// GPU number `ordinal`. Fails (never panics) when the driver, NVRTC or
    /// cuBLAS cannot be loaded, there is no such GPU, it is older than
    /// sm_80, or the kernels do not compile.
    pub fn with_device(ordinal: usize) -> std::result::Result<Cuda, CudaError> {
        // SAFETY: each only tries to open a shared library.
        unsafe {
            if !sys::is_culib_present() {
                return Err(CudaError::MissingLibrary("cuda"));
            }
            if !cudarc::cublas::sys::is_culib_present() {
                return Err(CudaError::MissingLibrary("cublas"));
            }
        }
        if !compile::nvrtc_present() {
            return Err(CudaError::MissingLibrary("nvrtc"));
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let name = ctx.name()?;
        if major < 8 {
            return Err(CudaError::TooOld { name, major, minor });
        }
        let arch = format!("sm_{major}{minor}");
        let sm_count =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let k = kernels::Kernels::load(&ctx, &arch)?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone())?;
        Ok(Cuda {
            ctx,
            stream,
            blas: Mutex::new(blas),
            k,
            sm_count: sm_count.max(1) as u32,
            arch,
            name,
        })
    }

    /// The GPU's name, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The architecture the kernels were compiled for, e.g. "sm_90".
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// A tensor holding `data` (row-major `[rows, cols]`), e.g. test inputs.
    pub fn upload_tensor(&self, data: &[f32], rows: usize, cols: usize) -> CudaTensor {
        assert_eq!(
            data.len(),
            rows * cols,
            "upload_tensor: {} values for [{rows}, {cols}]",
            data.len()
        );
        CudaTensor {
            data: self.upload_slice(data),
            rows,
            cols,
        }
    }

    /// Waits until all queued work has finished (for timing).
    pub fn synchronize(&self) {
        self.stream
            .synchronize()
            .unwrap_or_else(|e| panic!("CUDA: {e}"));
    }

    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        // No event tracking on a single stream: the guard has nothing to do.
        s.device_ptr(&self.stream).0
    }

    /// A zeroed device buffer of `n` elements (at least one).
    pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> CudaSlice<T> {
        self.stream
            .alloc_zeros(n.max(1))
            .unwrap_or_else(|e| panic!("CUDA: allocating {n} elements: {e}"))
    }

    /// An uninitialised device buffer of `n` elements (at least one), for
    /// scratch that a kernel overwrites entirely before anything reads it.
    pub(crate) fn scratch<T: DeviceRepr>(&self, n: usize) -> CudaSlice<T> {
        // SAFETY: every caller's kernels write all `n` elements before any
        // read (see the call sites); the memory is never exposed otherwise.
        unsafe { self.stream.alloc(n.max(1)) }
            .unwrap_or_else(|e| panic!("CUDA: allocating {n} elements: {e}"))
    }

    /// A device copy of `v` (one zero element when `v` is empty).
    pub(crate) fn upload_slice<T: DeviceRepr + ValidAsZeroBits>(&self, v: &[T]) -> CudaSlice<T> {
        if v.is_empty() {
            return self.zeros(1);
        }
        self.stream
            .clone_htod(v)
            .unwrap_or_else(|e| panic!("CUDA: uploading {} elements: {e}", v.len()))
    }

    pub(crate) fn launch(
        &self,
        f: &cudarc::driver::CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &[kernels::Arg],
    ) {
        kernels::launch(&self.stream, f, grid, block, args);
    }
}

impl Backend for Cuda {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type Kv = CudaKv;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn upload(&self, t: &HostTensor<'_>) -> Result<CudaWeight> {
        CudaWeight::from_host(self, t)
    }

    fn upload_mxfp4(&self, blocks: &HostTensor<'_>, scales: &HostTensor<'_>) -> Result<CudaWeight> {
        CudaWeight::from_mxfp4(self, blocks, scales)
    }

    fn upload_quantized(&self, t: &HostTensor<'_>, q: Quant) -> Result<CudaWeight> {
        CudaWeight::quantized(self, t, q)
    }

    fn upload_f32(&self, values: &[f32], shape: &[usize]) -> Result<CudaWeight> {
        CudaWeight::from_f32(self, values, shape)
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        w.bytes()
    }

    fn tensor(&self, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor {
            data: self.zeros(rows * cols),
            rows,
            cols,
        }
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn to_host(&self, t: &CudaTensor) -> Vec<f32> {
        let n = t.rows * t.cols;
        if n == 0 {
            return Vec::new();
        }
        self.stream
            .clone_dtoh(&t.data.slice(..n))
            .unwrap_or_else(|e| panic!("CUDA: copying a tensor to the host: {e}"))
    }

    fn row(&self, src: &CudaTensor, row: usize) -> CudaTensor {
        assert!(row < src.rows, "row {row} of a {}-row tensor", src.rows);
        let c = src.cols;
        let mut out = self.tensor(1, c);
        if c > 0 {
            self.stream
                .memcpy_dtod(
                    &src.data.slice(row * c..(row + 1) * c),
                    &mut out.data.slice_mut(..c),
                )
                .unwrap_or_else(|e| panic!("CUDA: copying a row: {e}"));
        }
        out
    }

    fn embed(&self, table: &CudaWeight, tokens: &[u32], out: &mut CudaTensor) {
        ops::embed(self, table, tokens, out);
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32, out: &mut CudaTensor) {
        ops::rms_norm(self, x, w, eps, out);
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) {
        linear::linear(self, x, w, bias, out);
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) {
        ops::add(self, x, y);
    }

    fn glu(&self, gate: &CudaTensor, up: &CudaTensor, act: Activation, out: &mut CudaTensor) {
        ops::glu(self, gate, up, act, out);
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) {
        ops::scale(self, x, s);
    }

    fn softcap(&self, x: &mut CudaTensor, cap: f32) {
        ops::softcap(self, x, cap);
    }

    fn rope(&self, x: &mut CudaTensor, head_dim: usize, positions: &[u32], rope: &RopeTable) {
        ops::rope(self, x, head_dim, positions, rope);
    }

    fn kv_alloc(&self, spec: KvSpec) -> CudaKv {
        CudaKv::new(self, spec)
    }

    fn kv_write(&self, kv: &mut CudaKv, k: &CudaTensor, v: &CudaTensor, positions: &[u32]) {
        attention::kv_write(self, kv, k, v, positions);
    }

    fn attention(
        &self,
        q: &CudaTensor,
        kv: &CudaKv,
        positions: &[u32],
        params: &AttnParams,
        sinks: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) {
        attention::attention(self, q, kv, positions, params, sinks, out);
    }

    fn moe(
        &self,
        x: &CudaTensor,
        router_logits: &CudaTensor,
        experts: &Experts<'_, CudaWeight>,
        params: &MoeParams,
        out: &mut CudaTensor,
    ) {
        moe::moe(self, x, router_logits, experts, params, out);
    }
}
