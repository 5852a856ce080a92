//! Device allocations that can fail for want of memory: the weights a
//! model loads and the KV caches a session allocates, whose size the user
//! chooses (the model, `--quant`, `--context`). They return
//! [`BackendError::OutOfMemory`], which says how much was asked, what the
//! GPU has free, and what to change; the process goes on (an allocation
//! that fails leaves the context usable). The buffers of a forward call
//! (activations, scratch: [`Cuda::zeros`], [`Cuda::scratch`]) cannot
//! return an error through the backend's operations, so theirs unwinds
//! as the panic's payload ([`unwind_on_error`]), which the CLI reports as
//! an error, not as a bug.
//!
//! The stream-ordered pool keeps what is freed (`Cuda::new` sets its
//! release threshold to the maximum, so scratch stays a pool hit). A
//! recorded graph's buffers come from its arena (`crate::arena`), or, where
//! that could not grow, from the driver at the graph's launch, not from
//! that pool. So an allocation or a graph launch that runs out of memory
//! gives the pool's unused memory back ([`Cuda::with_room`]) and is tried
//! once more before it fails. This module must not launch kernels.

use cudarc::driver::{CudaSlice, DeviceRepr, DriverError, ValidAsZeroBits, result, sys};
use turbospark_backend::BackendError;

use crate::Cuda;

const OUT_OF_MEMORY: sys::cudaError_enum = sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY;

/// What an allocation is for, named in the error if it fails.
pub(crate) struct Purpose<'a> {
    /// E.g. "tensor `model.norm.weight`", "a layer's KV cache (4096
    /// positions of 1024 Bf16 keys and values)"; built only on failure.
    pub what: &'a dyn Fn() -> String,
    /// What the user can change (`turbospark_backend::WEIGHTS_HINT`, `KV_HINT`, ...).
    pub hint: &'static str,
}

impl<'a> Purpose<'a> {
    /// A buffer of a forward call (activations, scratch, uploads of a
    /// batch).
    pub(crate) fn forward(what: &'a dyn Fn() -> String) -> Self {
        Purpose {
            what,
            hint: "a forward call's buffers did not fit beside the weights and the KV cache \
                   (lower --context or load fewer bytes with --quant)",
        }
    }
}

impl Cuda {
    /// A device copy of `v` (one zero element when `v` is empty), or the
    /// error that names `purpose`.
    pub(crate) fn try_upload<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        v: &[T],
        purpose: &Purpose,
    ) -> Result<CudaSlice<T>, BackendError> {
        if v.is_empty() {
            return self.try_zeros(1, purpose);
        }
        let bytes = std::mem::size_of_val(v) as u64;
        self.try_alloc(bytes, purpose, || self.stream.clone_htod(v))
    }

    /// A zeroed device buffer of `n` elements (at least one), or the error
    /// that names `purpose`.
    pub(crate) fn try_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
        purpose: &Purpose,
    ) -> Result<CudaSlice<T>, BackendError> {
        let bytes = (n.max(1) * std::mem::size_of::<T>()) as u64;
        self.try_alloc(bytes, purpose, || self.stream.alloc_zeros(n.max(1)))
    }

    /// `alloc` (of `bytes`) with [`Cuda::with_room`]'s second try, or the
    /// error that names `purpose`.
    pub(crate) fn try_alloc<T>(
        &self,
        bytes: u64,
        purpose: &Purpose,
        alloc: impl FnMut() -> Result<T, DriverError>,
    ) -> Result<T, BackendError> {
        self.with_room(alloc)
            .map_err(|e| self.alloc_error(e, bytes, purpose))
    }

    /// `f`, and where it runs out of memory outside a recording, `f` once
    /// more after the pool's unused memory went back to the driver (a
    /// recording cannot wait for the queued frees, so there it fails at
    /// once).
    pub(crate) fn with_room<T>(
        &self,
        mut f: impl FnMut() -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        match f() {
            Err(e) if e.0 == OUT_OF_MEMORY && !self.recording() => {
                self.stream.synchronize()?;
                // SAFETY: the device handle comes from the live context; the
                // default pool lives as long as it.
                unsafe {
                    let pool = result::device::get_default_mem_pool(self.ctx.cu_device())?;
                    result::mem_pool::trim_to(pool, 0)?;
                }
                f()
            }
            r => r,
        }
    }

    /// `e` as a backend error: out of memory (with the GPU's free and total
    /// memory, read after the failure) or any other driver error.
    fn alloc_error(&self, e: DriverError, need: u64, purpose: &Purpose) -> BackendError {
        if e.0 != OUT_OF_MEMORY {
            return BackendError::Device(format!("CUDA: allocating {}: {e}", (purpose.what)()));
        }
        BackendError::OutOfMemory {
            device: "GPU",
            what: (purpose.what)(),
            need,
            free: self
                .ctx
                .mem_get_info()
                .ok()
                .map(|(f, t)| (f as u64, t as u64)),
            hint: purpose.hint,
        }
    }
}

/// A forward call's allocation: where it failed, its [`BackendError`]
/// unwinds as the panic's payload (`std::panic::panic_any`). The backend's
/// operations cannot return it, and the caller (the CLI's `main`) can tell
/// it from a bug.
pub(crate) fn unwind_on_error<T>(r: Result<T, BackendError>) -> T {
    r.unwrap_or_else(|e| std::panic::panic_any(e))
}
