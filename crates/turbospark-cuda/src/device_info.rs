//! What the GPU itself offers, beside the backend's operations: the
//! device-to-device copy bandwidth (the ceiling batch-1 decode is judged
//! against: it reads every active weight once per token) and the device
//! memory in use. `turbospark bench` reports both.

use std::sync::Arc;

use cudarc::driver::{CudaContext, DriverError, result, sys};

use crate::{Cuda, CudaError};

/// Bytes copied per run at most (two buffers this size are allocated).
const MAX_COPY_BYTES: usize = 2 << 30;
/// Below this a copy no longer measures DRAM (L2 is 50 MB on an H100/H200).
const MIN_COPY_BYTES: usize = 256 << 20;
/// Untimed copies first (clocks ramp up), then the best of the timed ones.
const WARM_UP: usize = 3;
const RUNS: usize = 20;

impl Cuda {
    /// Device-to-device copy bandwidth in bytes per second, read and write
    /// bytes both counted (a copy of N bytes moves 2N): the best of
    /// [`RUNS`] `cuMemcpyDtoDAsync` copies of up to 2 GiB, timed with CUDA
    /// events on the backend's stream. The buffers come from `cuMemAlloc`
    /// (not the stream-ordered pool) and are freed before returning, so
    /// they leave nothing reserved. Uses at most a quarter of free memory
    /// per buffer; fails when that is under 256 MiB.
    pub fn measure_copy_bandwidth(&self) -> Result<f64, CudaError> {
        self.stream.synchronize()?;
        let (free, _) = self.ctx.mem_get_info()?;
        // Whole MiB, so the copy splits evenly into 16-byte transactions.
        let n = (free / 4).min(MAX_COPY_BYTES) & !((1 << 20) - 1);
        if n < MIN_COPY_BYTES {
            return Err(DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY).into());
        }
        let src = DeviceBuffer::new(&self.ctx, n)?;
        let dst = DeviceBuffer::new(&self.ctx, n)?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = (self.ctx.new_event(timing)?, self.ctx.new_event(timing)?);
        let mut best_ms = f32::INFINITY;
        for run in 0..WARM_UP + RUNS {
            start.record(&self.stream)?;
            // SAFETY: both buffers are live allocations of `n` bytes in this
            // context; the copy finishes before they are freed (elapsed_ms
            // waits for `end`).
            unsafe { result::memcpy_dtod_async(dst.ptr, src.ptr, n, self.stream.cu_stream()) }?;
            end.record(&self.stream)?;
            let ms = start.elapsed_ms(&end)?;
            if run >= WARM_UP {
                best_ms = best_ms.min(ms);
            }
        }
        Ok(2.0 * n as f64 / (f64::from(best_ms) / 1e3))
    }

    /// Device memory in use, all of it: total − free from `cuMemGetInfo`
    /// (this process's allocations, what the stream-ordered pool keeps
    /// reserved after frees, the context itself, and any other process on
    /// the GPU).
    pub fn memory_used(&self) -> Result<u64, CudaError> {
        let (free, total) = self.ctx.mem_get_info()?;
        Ok(total.saturating_sub(free) as u64)
    }
}

/// Raw device memory from `cuMemAlloc`, freed on drop.
struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        // SAFETY: the memory is only ever copied as bytes, never read as a
        // typed value, so its uninitialised contents are harmless.
        let ptr = unsafe { result::malloc_sync(bytes) }?;
        Ok(DeviceBuffer {
            ptr,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync above and freed only here;
            // no queued work uses it (the caller waited for its copies).
            // A failure leaks the buffer, which is all that can be done.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}
