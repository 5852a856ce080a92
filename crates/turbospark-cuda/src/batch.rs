//! The batch of one forward call on the GPU: its token ids and positions
//! (device copies the kernels read, host copies for shape checks and launch
//! geometry), the uploads that overwrite them in place for a recorded step,
//! and the page-locked copies of its tokens that greedy decoding reads
//! back behind the next step (`Session::decode_greedy`). The kernel that
//! chooses tokens into a batch is `crate::sample`'s; this module launches
//! nothing.

use std::collections::VecDeque;

use cudarc::driver::{CudaEvent, CudaSlice, DriverError, PinnedHostSlice, sys};

use crate::{Cuda, DeviceBuf};

/// The token ids and positions of one forward call (`argmax_into_batch`
/// moves `host_positions` on with the device's; the tokens it chooses are
/// on the device only).
pub struct CudaBatch {
    pub tokens: CudaSlice<u32>,
    pub positions: CudaSlice<u32>,
    pub host_tokens: Vec<u32>,
    pub host_positions: Vec<u32>,
    /// `argmax_feed`'s keys and tickets, a row each (0 between launches).
    pub(crate) argmax: (DeviceBuf<u64>, DeviceBuf<u32>),
    /// Copies of `tokens` queued for the host (`queue_tokens`), oldest
    /// first, each with the event recorded behind it, and page-locked
    /// buffers and events for the next ones.
    reads: VecDeque<TokenRead>,
    spare: Vec<TokenRead>,
}

/// A page-locked copy of a batch's tokens and the event that says it has
/// landed. The event is ours: with the context's event tracking off
/// (`Cuda::new`), cudarc records none for the page-locked buffer, so its
/// own `as_slice` would not wait for the copy.
struct TokenRead(PinnedHostSlice<u32>, CudaEvent);

impl CudaBatch {
    pub(crate) fn new(be: &Cuda, tokens: &[u32], positions: &[u32]) -> Self {
        assert_eq!(
            tokens.len(),
            positions.len(),
            "batch: one position per token"
        );
        CudaBatch {
            tokens: be.upload_slice(tokens),
            positions: be.upload_slice(positions),
            host_tokens: tokens.to_vec(),
            host_positions: positions.to_vec(),
            argmax: (be.zeros(tokens.len()), be.zeros(tokens.len())),
            reads: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    pub fn rows(&self) -> usize {
        self.host_tokens.len()
    }

    /// `Backend::set_batch`: the rows overwritten in the same storage, the
    /// reads not taken dropped.
    pub(crate) fn set(&mut self, be: &Cuda, tokens: &[u32], positions: &[u32]) {
        assert!(
            tokens.len() == self.rows() && positions.len() == self.rows(),
            "set_batch: {} rows, given {} tokens and {} positions",
            self.rows(),
            tokens.len(),
            positions.len()
        );
        let dropped = self.reads.drain(..).collect::<Vec<_>>();
        self.spare.extend(dropped);
        if tokens.is_empty() {
            return;
        }
        let copy = |src: &[u32], dst: &mut CudaSlice<u32>| {
            be.stream
                .memcpy_htod(src, &mut dst.slice_mut(..src.len()))
                .unwrap_or_else(|e| panic!("CUDA: uploading a batch: {e}"))
        };
        copy(tokens, &mut self.tokens);
        copy(positions, &mut self.positions);
        self.host_tokens.copy_from_slice(tokens);
        self.host_positions.copy_from_slice(positions);
    }

    /// `Backend::queue_tokens`: a copy of the tokens into page-locked
    /// memory behind the work queued so far, and an event behind it.
    pub(crate) fn queue_tokens(&mut self, be: &Cuda) {
        let fail = |e: DriverError| -> ! { panic!("CUDA: queueing a copy of the tokens: {e}") };
        let mut read = match self.spare.pop() {
            Some(r) => r,
            None => TokenRead(
                // SAFETY: the copy below fills it before `take_tokens` reads
                // it. Plain page-locked memory (not write-combined, which is
                // slow to read): the host reads it.
                unsafe { be.ctx.alloc_pinned_with_flags::<u32>(self.rows().max(1), 0) }
                    .unwrap_or_else(|e| fail(e)),
                be.ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .unwrap_or_else(|e| fail(e)),
            ),
        };
        be.stream
            .memcpy_dtoh(&self.tokens, &mut read.0)
            .unwrap_or_else(|e| fail(e));
        read.1.record(&be.stream).unwrap_or_else(|e| fail(e));
        self.reads.push_back(read);
    }

    /// `Backend::take_tokens`: the oldest queued copy, once its event has
    /// passed.
    pub(crate) fn take_tokens(&mut self) -> Vec<u32> {
        let read = self
            .reads
            .pop_front()
            .expect("take_tokens: no copy of the tokens was queued");
        let fail = |e: DriverError| -> ! { panic!("CUDA: reading the tokens back: {e}") };
        read.1.synchronize().unwrap_or_else(|e| fail(e));
        let tokens = read.0.as_slice().unwrap_or_else(|e| fail(e))[..self.rows()].to_vec();
        self.spare.push(read);
        tokens
    }
}
