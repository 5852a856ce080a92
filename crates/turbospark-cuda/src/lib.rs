//! The CUDA backend: a second implementation of
//! [`turbospark_backend::Backend`] for NVIDIA GPUs (Hopper, sm_90, first; any
//! sm_80+ GPU works), checked against the CPU reference.
//!
//! Activations are f32 in device memory, weights stay in their checkpoint
//! formats (f32, bf16, f16, MXFP4) or the load-time int8/int4, the KV store
//! is f32 or bf16 ([`attention`]). Kernels are CUDA
//! C++ in `kernels/`, compiled at run time by NVRTC and cached on disk
//! ([`compile`]); matrix products with many rows go to cuBLAS ([`linear`]).
//! The driver, NVRTC and cuBLAS are loaded at run time, so this crate builds
//! everywhere and [`Cuda::new`] returns an error where there is no GPU.
//!
//! All work runs in order on one stream; only
//! [`turbospark_backend::Backend::to_host`] (and uploads) wait for it.
//! Buffers come from the stream-ordered pool (`cuMemAllocAsync`), which
//! keeps freed memory for reuse; recorded graphs (`begin_graph`) capture
//! that stream, and take their buffers from an arena of their own
//! ([`arena`]), so that they hold kernels only. This module owns the device
//! handle, the tensor type and the helpers every operation launches and
//! allocates through; the trait's dispatch is `backend`'s, the batch type
//! [`batch`]'s. It must not know about model families.

mod arena;
pub mod attention;
mod backend;
pub mod batch;
pub mod compile;
pub mod device_info;
pub mod flash_attention;
pub mod gemm;
pub mod gemv;
pub mod kernels;
pub mod linear;
mod memory;
pub mod moe;
pub mod ops;
mod recording;
pub mod rope_kv;
pub mod sample;
mod trace;
pub mod weight;

pub use arena::DeviceBuf;
pub use batch::CudaBatch;
use memory::{Purpose, unwind_on_error};
use recording::Capture;
pub use recording::{GraphNodes, Recording};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, ValidAsZeroBits,
    result, sys,
};

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
    #[error("there is no GPU {ordinal}: this machine has {count} (numbered from 0)")]
    NoSuchDevice { ordinal: usize, count: i32 },
    #[error("{name} has compute capability {major}.{minor}; sm_80 or newer is required")]
    TooOld {
        name: String,
        major: i32,
        minor: i32,
    },
}

/// The operand precision of the compute-bound (prefill) paths, and of the
/// decode GEMVs of grouped weights (MXFP4, int8, int4). Other decode work
/// (dense GEMVs, split-KV attention) is f32 arithmetic on the stored
/// weights (and keys and values) in both. The precision also picks the
/// KV store's default dtype (`Backend::kv_dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Tensor-core bf16 operands with f32 accumulation: activations are
    /// rounded to bf16 for the prefill GEMMs and the flash-attention
    /// kernel, MoE prefill is grouped by expert; one-row GEMVs of grouped
    /// weights round x per 32 values to int16 (MXFP4) or int8 (int8/int4)
    /// codes and multiply codes in integers (kernels/gemv_grouped.cu). Results
    /// within ~1e-2 of the rms of f32 arithmetic. A bf16 model's KV store
    /// defaults to bf16. The default.
    #[default]
    Bf16,
    /// f32-level results everywhere (x split into bf16 hi + lo for the
    /// GEMMs, f32 attention, per-token MoE jobs), at about half the
    /// prefill speed, and f32 KV stores by default: for comparisons with
    /// references.
    F32,
}

/// A row-major `[rows, cols]` f32 matrix in device memory.
pub struct CudaTensor {
    /// At least one element, so that an empty tensor is still an allocation.
    pub data: DeviceBuf<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// One GPU: its context, the stream all work runs on, cuBLAS and the
/// kernels.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// True between `begin_graph` and `end_graph`: operations size their
    /// launches for any future batch, not the current one.
    recording: AtomicBool,
    /// The buffers (`crate::arena`) and chosen-token counts
    /// (`Recording::steps`) of the graph being recorded: `Some` between
    /// `begin_graph` and `end_graph`.
    capture: Mutex<Option<Capture>>,
    /// The one-row batches' rings of chosen tokens not in use.
    rings: batch::RingPool,
    precision: Precision,
    /// cuBLAS handles must not be used from two threads at once.
    blas: Mutex<CudaBlas>,
    k: kernels::Kernels,
    sm_count: u32,
    arch: String,
    name: String,
    /// Launch kernels allowing programmatic dependent launch (sm_90+,
    /// unless `TURBOSPARK_CUDA_PDL=0`; see `kernels::launch`).
    pdl: bool,
    /// Take the streamed GEMV kernels where they apply (unless
    /// `TURBOSPARK_CUDA_STREAM=0`; see `gemv::stream_shared`).
    stream_gemv: bool,
    /// The streamed GEMVs can run: sm_90+ (bulk asynchronous copies and
    /// mbarrier transactions) with their shared memory to opt into.
    bulk_copies: bool,
    /// Dynamic shared memory a streamed int8 GEMV block may take: its
    /// ring's cap, `gemv::QX_STREAM_MAX_SHARED`, or less where the GPU
    /// gives a block less.
    qx_stream_shared: u32,
    /// Route a decode row of an MoE block in one launch (`moe_norm_route`,
    /// sm_90: bulk copies) where each block's share of its
    /// router fits in `route_shared` bytes (unless
    /// `TURBOSPARK_CUDA_FUSED_ROUTE=0`; see `moe::rms_norm_moe`).
    fused_route: bool,
    /// Dynamic shared memory `moe_norm_route` may take: what the GPU gives
    /// a block, less 2 KB for its static memory.
    route_shared: u32,
    /// `moe_norm_route`'s ticket (its blocks done): 0 between launches.
    route_ticket: CudaSlice<u32>,
    /// Whether int4 weights were uploaded (`--quant int4` quantizes every
    /// linear, the output projections included): `attn_combine` then
    /// releases the output projection before its wait. Measured on the
    /// H200, the combine's release first against after, one call,
    /// alternated, full models: Llama-8B int4 528.5 -> 539.4 tok/s, int8
    /// 357.5 -> 360.3 (level: 16 layers 678.6 -> 677.7), gpt-oss-20b
    /// 529.9 -> 527.3, bf16 227.2 -> 216.9 (why bf16's `gemv_bf16_x1` o
    /// loses was not measured). So only for int4.
    int4_linears: AtomicBool,
    /// Attend a decode step's short sliding window in one block a KV head
    /// with no combine (unless `TURBOSPARK_CUDA_WINDOW_ATTENTION=0`; see
    /// `attention::rope_kv_attention`).
    window_attention: bool,
    /// Whether a decode step's attention over a bf16 store takes the
    /// tensor-core forms of the GQA kernel where one holds its shapes
    /// (kernels/attention_mma.cuh's `GqaMma`).
    /// `TURBOSPARK_CUDA_MMA_ATTENTION=0` keeps the warp-a-head forms.
    mma_attention: bool,
    /// The timeline being noted (`TURBOSPARK_CUDA_TRACE`; `crate::trace`),
    /// written when the backend is dropped.
    trace: Option<trace::Trace>,
}

impl Drop for Cuda {
    fn drop(&mut self) {
        if let Some(t) = &self.trace {
            t.write(&self.stream);
        }
    }
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
        let count = CudaContext::device_count()?;
        if ordinal >= count as usize {
            return Err(CudaError::NoSuchDevice { ordinal, count });
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
        // One stream and no cross-stream hazards: cudarc's per-buffer event
        // tracking would only add two events to every allocation.
        // SAFETY: every buffer is used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured
        // into a graph.
        let stream = ctx.new_stream()?;
        let trace = trace::Trace::new(&stream)?;
        let address = trace.as_ref().map(|t| (t.device_address(&stream), &stream));
        let k = kernels::Kernels::load(&ctx, &arch, address)?;
        // The streamed GEMVs: sm_90's bulk copies, and a block's share of
        // shared memory beyond the default 48 KB.
        let optin = ctx.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        let bulk_copies = major >= 9 && optin >= gemv::STREAM_MAX_SHARED as i32;
        // The dynamic shared memory a kernel with up to 2 KB of static
        // shared memory may opt into: the attribute counts dynamic memory
        // only, and setting it past what the static memory leaves fails.
        let optin_dynamic = (optin.max(0) as u32).saturating_sub(2048);
        // The int8 ring's cap, or less where the GPU gives less.
        let qx_stream_shared = gemv::QX_STREAM_MAX_SHARED.min(optin_dynamic);
        if bulk_copies {
            let caps = [
                (&k.gemv_bf16_stream, gemv::STREAM_MAX_SHARED),
                (&k.gemv_f16_stream, gemv::STREAM_MAX_SHARED),
                (&k.gemv_q8_stream, qx_stream_shared),
            ];
            for (f, cap) in caps {
                f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    cap as i32,
                )?;
            }
        }
        k.moe_norm_route.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            optin_dynamic as i32,
        )?;
        // Flash attention over a bf16 store: two stages of K and V tiles
        // (up to 68 KB).
        for (f, hd) in [
            (&k.flash_attn_hd64_bf16kv, 64),
            (&k.flash_attn_hd128_bf16kv, 128),
            (&k.flash_attn_hd256_bf16kv, 256),
        ] {
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                flash_attention::bf16_store_shared(hd).min(optin_dynamic) as i32,
            )?;
        }
        // Keep freed pool memory instead of returning it to the driver at
        // every synchronisation, so per-call scratch stays a pool hit.
        // SAFETY: the device handle comes from the live context.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device())?;
            let mut keep = u64::MAX;
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )?;
        }
        let blas = CudaBlas::new(stream.clone())?;
        let route_ticket = stream.alloc_zeros::<u32>(1)?;
        Ok(Cuda {
            ctx,
            stream,
            recording: AtomicBool::new(false),
            capture: Mutex::new(None),
            rings: batch::RingPool::default(),
            precision: Precision::default(),
            blas: Mutex::new(blas),
            k,
            sm_count: sm_count.max(1) as u32,
            arch,
            name,
            pdl: major >= 9 && std::env::var("TURBOSPARK_CUDA_PDL").map_or(true, |v| v != "0"),
            stream_gemv: bulk_copies
                && std::env::var("TURBOSPARK_CUDA_STREAM").map_or(true, |v| v != "0"),
            bulk_copies,
            qx_stream_shared,
            fused_route: bulk_copies
                && std::env::var("TURBOSPARK_CUDA_FUSED_ROUTE").map_or(true, |v| v != "0"),
            route_shared: optin_dynamic,
            route_ticket,
            int4_linears: AtomicBool::new(false),
            trace,
            window_attention: std::env::var("TURBOSPARK_CUDA_WINDOW_ATTENTION")
                .map_or(true, |v| v != "0"),
            mma_attention: std::env::var("TURBOSPARK_CUDA_MMA_ATTENTION")
                .map_or(true, |v| v != "0"),
        })
    }

    /// Whether int4 weights were uploaded (see the field).
    pub(crate) fn int4_linears(&self) -> bool {
        self.int4_linears.load(Ordering::Relaxed)
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
            data: DeviceBuf::owned(self.upload_slice(data)),
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

    /// Sets the operand precision of the prefill paths (before any work).
    pub fn set_precision(&mut self, p: Precision) {
        self.precision = p;
    }

    /// Whether one-row bf16/f16/int8 GEMVs may take the streamed kernels (on by
    /// default on sm_90+ unless `TURBOSPARK_CUDA_STREAM=0`; tests compare
    /// both ways). Set before recording a graph.
    pub fn set_stream_gemv(&mut self, on: bool) {
        self.stream_gemv = on && self.bulk_copies;
    }

    /// Whether a bf16 store's decode attention takes the tensor-core forms
    /// where they hold the shapes (on by default unless
    /// `TURBOSPARK_CUDA_MMA_ATTENTION=0`; tests check both against the
    /// CPU). Set before recording a graph.
    pub fn set_mma_attention(&mut self, on: bool) {
        self.mma_attention = on;
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether a graph is being recorded (see `Backend::begin_graph`).
    pub(crate) fn recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// Counts a token choice queued into a batch with step count `steps`:
    /// now, or at each replay of the graph being recorded.
    pub(crate) fn count_step(&self, steps: &Arc<AtomicU64>) {
        match self
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            Some(c) => c.steps.push(steps.clone()),
            None => {
                steps.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        // No event tracking on a single stream: the guard has nothing to do.
        s.device_ptr(&self.stream).0
    }

    /// A zeroed device buffer of `n` elements (at least one), for a
    /// forward call (out of memory unwinds: [`memory::unwind_on_error`]).
    pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> DeviceBuf<T> {
        let what = || format!("a buffer of {n} elements");
        let purpose = Purpose::forward(&what);
        let buf = match self.arena_buf(n) {
            Some(mut buf) => self
                .try_alloc(0, &purpose, || self.stream.memset_zeros(&mut *buf))
                .map(|()| buf),
            None => self.try_zeros(n, &purpose).map(DeviceBuf::owned),
        };
        unwind_on_error(buf)
    }

    /// An uninitialised device buffer of `n` elements (at least one), for
    /// scratch that a kernel overwrites entirely before anything reads it.
    pub(crate) fn scratch<T: DeviceRepr>(&self, n: usize) -> DeviceBuf<T> {
        if let Some(buf) = self.arena_buf(n) {
            return buf;
        }
        let bytes = (n.max(1) * std::mem::size_of::<T>()) as u64;
        let what = || format!("a buffer of {n} elements");
        // SAFETY: every caller's kernels write all `n` elements before any
        // read (see the call sites, and `Backend::empty`'s contract for the
        // operations given an empty tensor); the memory is never exposed
        // otherwise.
        let alloc = || unsafe { self.stream.alloc(n.max(1)) };
        let slice = self.try_alloc(bytes, &Purpose::forward(&what), alloc);
        DeviceBuf::owned(unwind_on_error(slice))
    }

    /// While a graph is recorded, a buffer of `n` elements from its arena
    /// (uninitialised; `None` otherwise, or where the arena could not grow).
    fn arena_buf<T>(&self, n: usize) -> Option<DeviceBuf<T>> {
        if !self.recording() {
            return None;
        }
        let mut capture = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        capture.as_mut()?.arena.take(n)
    }

    /// A device copy of `v` (one zero element when `v` is empty), for a
    /// forward call.
    pub(crate) fn upload_slice<T: DeviceRepr + ValidAsZeroBits>(&self, v: &[T]) -> CudaSlice<T> {
        let what = || format!("a copy of {} elements", v.len());
        unwind_on_error(self.try_upload(v, &Purpose::forward(&what)))
    }

    pub(crate) fn launch(
        &self,
        f: &cudarc::driver::CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &[kernels::Arg],
    ) {
        self.launch_shared(f, grid, block, 0, args);
    }

    /// [`Cuda::launch`] with `shared` bytes of dynamic shared memory.
    pub(crate) fn launch_shared(
        &self,
        f: &cudarc::driver::CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        args: &[kernels::Arg],
    ) {
        self.note(f, grid, block, shared);
        kernels::launch(&self.stream, f, grid, (block, shared), self.pdl, args);
    }

    /// Notes a launch in the timeline, when one is being noted.
    fn note(
        &self,
        f: &cudarc::driver::CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
    ) {
        if let Some(t) = &self.trace {
            t.note(self.k.name_of(f), grid, (block, shared), self.recording());
        }
    }
}
