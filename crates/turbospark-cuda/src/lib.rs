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
//! uploads) wait for it. Buffers come from the stream-ordered pool
//! (`cuMemAllocAsync`), which keeps freed memory for reuse; recorded graphs
//! (`begin_graph`) capture that stream, and take their buffers from an
//! arena of their own ([`arena`]), so that they hold kernels only. This module
//! owns the device handle, the tensor type and the trait's dispatch (the
//! batch type is [`batch`]'s); it must not know about model families.

mod arena;
pub mod attention;
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

use arena::Arena;
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
use turbospark_backend::scores::Keep;
use turbospark_backend::{
    AttnParams, Backend, Experts, KvDtype, KvSpec, MoeParams, Quant, Result, RopeTable, ScoreStats,
};
use turbospark_format::{Activation, DType, HostTensor};

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
    /// Attend a decode step's short sliding window in one block a KV head
    /// with no combine (unless `TURBOSPARK_CUDA_WINDOW_ATTENTION=0`; see
    /// `attention::rope_kv_attention`).
    window_attention: bool,
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
            trace,
            window_attention: std::env::var("TURBOSPARK_CUDA_WINDOW_ATTENTION")
                .map_or(true, |v| v != "0"),
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

impl Backend for Cuda {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type Kv = CudaKv;
    type Batch = CudaBatch;
    type Graph = Recording;

    fn name(&self) -> &'static str {
        "cuda"
    }

    /// 2048: each chunk reads every weight once (and converts MXFP4 and
    /// int8/int4 weights to bf16 once), and an MoE layer synchronises with
    /// the host once per chunk, so larger chunks amortise those costs and
    /// give each expert's GEMM more rows; the activations of 2048 rows
    /// (e.g. 2 × 117 MB for Llama-3.1-8B's MLP) and rings of `window + 2048`
    /// rows are small beside a GPU's memory.
    fn prefill_chunk(&self) -> usize {
        2048
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

    /// No zeroing: in a recorded step a memset node would sit between two
    /// kernels (BENCHMARKS.md, twenty-third session: gpt-oss-20b decoded
    /// 460.3 tok/s with them, 502.8 without).
    fn empty(&self, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor {
            data: self.scratch(rows * cols),
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
        let mut out = self.empty(1, c);
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

    fn copy(&self, src: &CudaTensor, dst: &mut CudaTensor) {
        assert_eq!(
            (src.rows, src.cols),
            (dst.rows, dst.cols),
            "copy: shapes differ"
        );
        let n = src.rows * src.cols;
        if n > 0 {
            self.stream
                .memcpy_dtod(&src.data.slice(..n), &mut dst.data.slice_mut(..n))
                .unwrap_or_else(|e| panic!("CUDA: copying a tensor: {e}"));
        }
    }

    fn argmax(&self, t: &CudaTensor) -> Vec<u32> {
        sample::argmax(self, t)
    }

    fn score_stats(&self, logits: &CudaTensor, row: usize, t: f32) -> ScoreStats {
        sample::score_stats(self, logits, row, t)
    }

    fn scores_above(
        &self,
        logits: &CudaTensor,
        row: usize,
        t: f32,
        floor: f32,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        sample::scores_above(self, logits, row, t, floor, cap)
    }

    fn score_buckets(
        &self,
        logits: &CudaTensor,
        row: usize,
        t: f32,
        max: f32,
        keep: &Keep,
        rounded: bool,
    ) -> Vec<f64> {
        sample::score_buckets(self, logits, row, t, max, keep, rounded)
    }

    fn bucket_members(
        &self,
        logits: &CudaTensor,
        row: usize,
        t: f32,
        max: f32,
        keep: &Keep,
        bucket: usize,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        sample::bucket_members(self, logits, row, t, max, keep, bucket, cap)
    }

    fn draw(&self, logits: &CudaTensor, row: usize, t: f32, min_w: f64, u: f64) -> Option<u32> {
        sample::draw(self, logits, row, t, min_w, u)
    }

    fn summarizes_scores(&self) -> bool {
        true
    }

    fn batch(&self, tokens: &[u32], positions: &[u32]) -> CudaBatch {
        CudaBatch::new(self, tokens, positions)
    }

    fn set_batch(&self, b: &mut CudaBatch, tokens: &[u32], positions: &[u32]) {
        b.set(self, tokens, positions)
    }

    fn argmax_into_batch(&self, logits: &CudaTensor, b: &mut CudaBatch) {
        sample::argmax_into_batch(self, logits, b)
    }

    fn queue_tokens(&self, b: &mut CudaBatch) {
        b.queue_tokens(self)
    }

    fn take_tokens(&self, b: &mut CudaBatch) -> Vec<u32> {
        b.take_tokens()
    }

    fn begin_graph(&self) -> bool {
        // Thread-local mode: another thread's unrelated CUDA calls do not
        // invalidate this capture.
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        if self.stream.begin_capture(mode).is_err() {
            return false;
        }
        *self.capture.lock().unwrap_or_else(|e| e.into_inner()) = Some(Capture {
            arena: Arena::new(self.stream.clone()),
            steps: Vec::new(),
        });
        self.recording.store(true, Ordering::Relaxed);
        true
    }

    fn end_graph(&self) -> Option<Recording> {
        self.recording.store(false, Ordering::Relaxed);
        let capture = self
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let flags = sys::CUgraphInstantiate_flags(0);
        match (self.stream.end_capture(flags), capture) {
            (Ok(Some(graph)), Some(Capture { arena, steps })) => Some(Recording {
                graph,
                arena,
                steps,
            }),
            _ => None,
        }
    }

    fn replay(&self, g: &Recording) {
        // A step's buffers are its arena's, but one whose arena could not
        // grow took pool memory, which the driver allocates at launch.
        let what = || "the buffers of a recorded decode step".to_string();
        unwind_on_error(self.try_alloc(0, &Purpose::forward(&what), || g.graph.launch()));
        g.count_replay();
    }

    fn embed(&self, table: &CudaWeight, batch: &CudaBatch, out: &mut CudaTensor) {
        ops::embed(self, table, batch, out);
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

    fn linears(
        &self,
        x: &CudaTensor,
        parts: &[(&CudaWeight, Option<&CudaWeight>)],
        outs: &mut [&mut CudaTensor],
    ) {
        linear::linears(self, x, parts, outs);
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) {
        ops::add(self, x, y);
    }

    fn rms_norm_linears(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        parts: &[(&CudaWeight, Option<&CudaWeight>)],
        outs: &mut [&mut CudaTensor],
        normed: Option<&mut CudaTensor>,
    ) {
        linear::rms_norm_linears(self, x, w, eps, parts, outs, normed);
    }

    fn linear_add(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        acc: &mut CudaTensor,
    ) {
        linear::linear_add(self, x, w, bias, acc);
    }

    fn glu(&self, gate: &CudaTensor, up: &CudaTensor, act: Activation, out: &mut CudaTensor) {
        ops::glu(self, gate, up, act, out);
    }

    fn rms_norm_glu(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        gate: (&CudaWeight, Option<&CudaWeight>),
        up: (&CudaWeight, Option<&CudaWeight>),
        act: Activation,
        out: &mut CudaTensor,
    ) {
        linear::rms_norm_glu(self, x, w, eps, (gate, up), act, out);
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) {
        ops::scale(self, x, s);
    }

    fn softcap(&self, x: &mut CudaTensor, cap: f32) {
        ops::softcap(self, x, cap);
    }

    fn rope(&self, x: &mut CudaTensor, head_dim: usize, batch: &CudaBatch, rope: &RopeTable) {
        rope_kv::rope(self, x, head_dim, batch, rope);
    }

    /// vLLM's `auto`: a bf16 model keeps a bf16 store at
    /// `Precision::Bf16` (half the bytes a decode step's attention reads);
    /// f32 and f16 models, and `Precision::F32`, keep f32 (an f16 model's
    /// values would lose three bits in bf16).
    fn kv_dtype(&self, model: DType) -> KvDtype {
        match (self.precision, model) {
            (Precision::Bf16, DType::BF16) => KvDtype::Bf16,
            _ => KvDtype::F32,
        }
    }

    fn kv_alloc(&self, spec: KvSpec) -> Result<CudaKv> {
        CudaKv::new(self, spec)
    }

    fn kv_write(&self, kv: &mut CudaKv, k: &CudaTensor, v: &CudaTensor, batch: &CudaBatch) {
        rope_kv::kv_write(self, kv, k, v, batch);
    }

    fn rope_kv_write(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        kv: &mut CudaKv,
        head_dim: usize,
        batch: &CudaBatch,
        rope: &RopeTable,
    ) {
        rope_kv::rope_kv_write(self, q, k, v, kv, head_dim, batch, rope);
    }

    fn attention(
        &self,
        q: &CudaTensor,
        kv: &CudaKv,
        batch: &CudaBatch,
        params: &AttnParams,
        sinks: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) {
        attention::attention(self, q, kv, batch, params, sinks, out);
    }

    fn rope_kv_attention(
        &self,
        qkv: (&mut CudaTensor, &mut CudaTensor, &CudaTensor),
        kv: &mut CudaKv,
        batch: &CudaBatch,
        rope: &RopeTable,
        params: &AttnParams,
        sinks: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) {
        attention::rope_kv_attention(self, qkv, kv, batch, rope, params, sinks, out);
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

    fn rms_norm_moe(
        &self,
        x: &mut CudaTensor,
        norm: &CudaWeight,
        eps: f32,
        router: (&CudaWeight, Option<&CudaWeight>),
        experts: &Experts<'_, CudaWeight>,
        params: &MoeParams,
    ) {
        moe::rms_norm_moe(self, x, norm, eps, router, experts, params);
    }
}
