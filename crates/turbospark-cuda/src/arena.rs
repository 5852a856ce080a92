//! A recorded step's scratch memory, and the buffer type that may borrow
//! it.
//!
//! Outside a recording, a forward call's buffers come from the
//! stream-ordered pool (`cuMemAllocAsync`). Inside a stream capture, each
//! such allocation becomes a memory-allocation node of the graph and its
//! free a memory-free node, each between two kernels: the kernel after it
//! depends on that node, not programmatically on the kernel before, so it
//! cannot start early under PDL, and the node costs a launch of its own.
//! So while a graph is recorded, buffers come from an [`Arena`] that the
//! [`crate::Recording`] owns, allocated with `cuMemAlloc` outside the
//! graph: the step's graph holds kernel nodes only (`Recording::nodes`).
//!
//! The arena is a bump allocator that never reuses memory within a
//! recording. Under PDL a kernel may start while the one before it still
//! runs; with every buffer fresh, no kernel can write memory that an
//! earlier kernel of the step still reads. Its size is the sum of the
//! step's buffers, held as long as the recording.
//!
//! This module owns the arena and [`DeviceBuf`]; it must not launch
//! kernels.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError, result, sys};

/// Alignment of every arena buffer: what `cuMemAlloc` guarantees, enough
/// for 16-byte vector loads and bulk (TMA) copies.
const ALIGN: u64 = 256;

/// The arena grows by chunks of at least this size, so that a step's
/// hundreds of buffers (a few MB at most at batch 1, mostly attention's
/// split partials) take a handful of `cuMemAlloc` calls.
const CHUNK: u64 = 8 << 20;

/// A device buffer: pool memory it owns and frees on drop, or a slice of
/// a recording's [`Arena`], which it leaves alone on drop (the arena
/// frees it with the recording). Dereferences to the `CudaSlice` the
/// kernels' argument helpers take.
pub struct DeviceBuf<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    in_arena: bool,
}

impl<T> DeviceBuf<T> {
    /// A buffer that owns `slice`.
    pub(crate) fn owned(slice: CudaSlice<T>) -> Self {
        DeviceBuf {
            slice: ManuallyDrop::new(slice),
            in_arena: false,
        }
    }
}

impl<T> Deref for DeviceBuf<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for DeviceBuf<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Drop for DeviceBuf<T> {
    fn drop(&mut self) {
        // SAFETY: `slice` is not used after this.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        if self.in_arena {
            // The memory is the arena's: give up the handle without a free
            // (which inside a capture would add a free node).
            slice.leak();
        } else {
            drop(slice);
        }
    }
}

/// The memory of one recording's buffers: chunks from `cuMemAlloc`,
/// handed out in order and freed together when the arena drops.
pub(crate) struct Arena {
    stream: Arc<CudaStream>,
    chunks: Vec<sys::CUdeviceptr>,
    /// The next free byte of the last chunk, and its end.
    next: u64,
    end: u64,
    /// Bytes handed out (alignment included).
    taken: u64,
}

impl Arena {
    pub(crate) fn new(stream: Arc<CudaStream>) -> Self {
        Arena {
            stream,
            chunks: Vec::new(),
            next: 0,
            end: 0,
            taken: 0,
        }
    }

    /// Bytes handed out so far, alignment included.
    pub(crate) fn bytes(&self) -> u64 {
        self.taken
    }

    /// A fresh buffer of `n` elements (at least one) on the arena's
    /// stream, or `None` where a new chunk could not be allocated (the
    /// caller then takes pool memory, which the graph records as an
    /// allocation node: slower, still correct).
    pub(crate) fn take<T>(&mut self, n: usize) -> Option<DeviceBuf<T>> {
        let bytes = (n.max(1) * std::mem::size_of::<T>()) as u64;
        let bytes = bytes.div_ceil(ALIGN) * ALIGN;
        if self.end - self.next < bytes {
            self.grow(bytes).ok()?;
        }
        let ptr = self.next;
        self.next += bytes;
        self.taken += bytes;
        // SAFETY: `ptr` starts `bytes` ≥ n·size_of::<T>() bytes of a live
        // chunk that no other buffer of this arena covers; the chunk
        // outlives the buffer (it lives as long as the recording, whose
        // graph is the only user of its buffers after recording ends).
        let slice = unsafe { self.stream.upgrade_device_ptr(ptr, n.max(1)) };
        Some(DeviceBuf {
            slice: ManuallyDrop::new(slice),
            in_arena: true,
        })
    }

    /// A new chunk of at least `bytes`. `cuMemAlloc` is a "potentially
    /// unsafe" call during a capture (it may synchronise), so the thread's
    /// capture mode is relaxed around it, as the CUDA programming guide's
    /// `cudaThreadExchangeStreamCaptureMode` example does; nothing is
    /// queued on a capturing stream, so nothing waits.
    fn grow(&mut self, bytes: u64) -> Result<(), DriverError> {
        let size = bytes.max(CHUNK);
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: the mode is swapped back below whatever the allocation
        // returns; the context is current on this thread (it is the
        // stream's, bound by the backend's calls).
        let ptr = unsafe {
            sys::cuThreadExchangeStreamCaptureMode(&mut mode).result()?;
            let ptr = result::malloc_sync(size as usize);
            sys::cuThreadExchangeStreamCaptureMode(&mut mode).result()?;
            ptr?
        };
        self.chunks.push(ptr);
        self.next = ptr;
        self.end = ptr + size;
        Ok(())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // A replay of the recording may still be queued: its kernels use
        // these chunks until it finishes.
        let _ = self.stream.synchronize();
        for &ptr in &self.chunks {
            // SAFETY: each chunk came from `malloc_sync` and no buffer uses
            // it once the recording (and so its graph) is gone.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }
}
