//! The batch of one forward call on the GPU: its token ids and positions
//! (device copies the kernels read, host copies for shape checks and launch
//! geometry), the uploads that overwrite them in place for a recorded step,
//! and the host-visible ring the tokens chosen on the device land in, which
//! greedy decoding reads back behind the next step (`Session::decode_greedy`).
//! The kernel that chooses tokens into a batch is `crate::sample`'s; this
//! module launches nothing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaSlice, DriverError, PinnedHostSlice, sys};

use crate::{Cuda, DeviceBuf};

/// Slots a row has in the ring of chosen tokens: a read queued by
/// `queue_tokens` may be taken while up to this many more choices (less
/// one) are queued behind it (`Session::decode_greedy` queues one).
pub(crate) const TOKEN_RING: usize = 8;

/// The token ids and positions of one forward call (`argmax_into_batch`
/// moves `host_positions` on with the device's; the tokens it chooses are
/// on the device, and in `ring` for the host).
pub struct CudaBatch {
    pub tokens: CudaSlice<u32>,
    pub positions: CudaSlice<u32>,
    pub host_tokens: Vec<u32>,
    pub host_positions: Vec<u32>,
    /// `argmax_feed`'s keys and tickets, a row each (0 between launches).
    pub(crate) argmax: (DeviceBuf<u64>, DeviceBuf<u32>),
    /// Token choices queued into this batch so far (`argmax_into_batch`,
    /// directly or in the replays of a recording: `Recording::steps`).
    pub(crate) steps: Arc<AtomicU64>,
    /// The positions the last `set_batch` (or `new`) gave, and `steps` then.
    set_positions: Vec<u32>,
    set_steps: u64,
    /// Where the device writes the tokens it chooses for the host
    /// ([`TokenRing`]). A one-row batch (a decode step's) gets it when it
    /// is made, from `pool`, and gives it back there when dropped: its
    /// first choice may be recorded, and a build that made the ring at the
    /// first choice failed inside the recording (allocating host memory
    /// during stream capture); and an eager decode makes a batch a token,
    /// which must not cost a page-locked allocation and free (the free
    /// waits for the device). Other batches, a prompt's, get it at their
    /// first choice, if any, and free it: their row counts vary, so a pool
    /// of them would only grow.
    ring: Option<TokenRing>,
    pool: RingPool,
    /// Reads queued by `queue_tokens`, oldest first: the event behind the
    /// work queued then, and `steps` then. Spare events for the next ones.
    reads: VecDeque<(CudaEvent, u64)>,
    spare: Vec<CudaEvent>,
}

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
            steps: Arc::new(AtomicU64::new(0)),
            set_positions: positions.to_vec(),
            set_steps: 0,
            ring: (tokens.len() == 1).then(|| be.rings.take(be)),
            pool: be.rings.clone(),
            reads: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    pub fn rows(&self) -> usize {
        self.host_tokens.len()
    }

    /// The device address of this batch's [`TokenRing`] (`argmax_into_batch`'s
    /// kernel writes it), made now if it is not yet.
    pub(crate) fn ring_dev(&mut self, be: &Cuda) -> u64 {
        let rows = self.rows();
        self.ring
            .get_or_insert_with(|| TokenRing::new(be, rows))
            .dev
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
        let dropped = self.reads.drain(..).map(|(e, _)| e).collect::<Vec<_>>();
        self.spare.extend(dropped);
        self.set_steps = self.steps.load(Ordering::Relaxed);
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
        self.set_positions.copy_from_slice(positions);
    }

    /// `Backend::queue_tokens`: an event behind the work queued so far,
    /// with the count of choices that work makes. No copy: the choices
    /// write the ring themselves.
    pub(crate) fn queue_tokens(&mut self, be: &Cuda) {
        let fail = |e: DriverError| -> ! { panic!("CUDA: queueing a read of the tokens: {e}") };
        let event = match self.spare.pop() {
            Some(e) => e,
            None => be
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .unwrap_or_else(|e| fail(e)),
        };
        event.record(&be.stream).unwrap_or_else(|e| fail(e));
        self.reads
            .push_back((event, self.steps.load(Ordering::Relaxed)));
    }

    /// `Backend::take_tokens`: the tokens as the oldest queued read found
    /// them, once its event has passed: those `set_batch` gave where no
    /// choice came between, else the last choice's, from the ring.
    pub(crate) fn take_tokens(&mut self) -> Vec<u32> {
        let (event, steps) = self
            .reads
            .pop_front()
            .expect("take_tokens: no read of the tokens was queued");
        let fail = |e: DriverError| -> ! { panic!("CUDA: reading the tokens back: {e}") };
        event.synchronize().unwrap_or_else(|e| fail(e));
        self.spare.push(event);
        let n = steps - self.set_steps;
        if n == 0 {
            return self.host_tokens.clone();
        }
        let rows = self.rows();
        let ring = self
            .ring
            .as_ref()
            .expect("take_tokens: a choice counted into a batch with no ring")
            .host
            .as_ptr()
            .unwrap_or_else(|e| fail(e));
        (0..rows)
            .map(|r| {
                let pos = self.set_positions[r].wrapping_add(n as u32);
                let slot = (pos as usize % TOKEN_RING) * rows + r;
                // SAFETY: `slot` < TOKEN_RING · rows, the ring's length. The
                // device may be writing later slots meanwhile (mapped
                // memory): a volatile read of one aligned u64, which the
                // device writes in one store.
                let entry = unsafe { ring.add(slot).read_volatile() };
                assert!(
                    entry >> 32 == u64::from(pos),
                    "take_tokens: the token chosen for position {pos} was overwritten before \
                     it was read: at most {} choices may be queued behind a read",
                    TOKEN_RING - 1
                );
                entry as u32
            })
            .collect()
    }
}

impl Drop for CudaBatch {
    fn drop(&mut self) {
        if self.rows() == 1
            && let Some(ring) = self.ring.take()
        {
            self.pool.give(ring);
        }
    }
}

/// The one-row [`TokenRing`]s no batch holds now, shared by a [`Cuda`] and
/// its batches; as many as one-row batches were ever alive at once.
///
/// A ring given back may still be written by choices queued for the
/// batch that held it. That is harmless: the next batch to hold it queues
/// its own choices on the same stream, after those, and reads a slot only
/// behind an event after its own choice of that slot's position, so what
/// it reads is its own write or a later one. The slots are not cleared on
/// reuse for the same reason (and the host must not write them while the
/// device may).
#[derive(Clone, Default)]
pub(crate) struct RingPool(Arc<Mutex<Vec<TokenRing>>>);

impl RingPool {
    fn take(&self, be: &Cuda) -> TokenRing {
        let spare = self.0.lock().unwrap_or_else(|e| e.into_inner()).pop();
        spare.unwrap_or_else(|| TokenRing::new(be, 1))
    }

    fn give(&self, ring: TokenRing) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(ring);
    }
}

/// Page-locked host memory mapped into the device, `TOKEN_RING` slots a
/// row: the choice that moves row r to position p writes `p << 32 | token`
/// to slot `(p mod TOKEN_RING) · rows + r` (kernels/sample.cu's
/// argmax_feed), so a host a few steps behind finds the token it asked
/// for and can tell it was not overwritten. Only the device writes it once
/// made; a memcpy between two replays instead cost ~9 µs a step
/// (BENCHMARKS.md).
struct TokenRing {
    host: PinnedHostSlice<u64>,
    dev: u64,
}

impl TokenRing {
    fn new(be: &Cuda, rows: usize) -> Self {
        let fail = |e: DriverError| -> ! { panic!("CUDA: a batch's ring of tokens: {e}") };
        // Plain page-locked memory (not write-combined, which is slow to
        // read: the host reads it), mapped for the device to write.
        // SAFETY: filled with zeros below before the device or host uses it.
        let mut host = unsafe {
            be.ctx.alloc_pinned_with_flags::<u64>(
                (TOKEN_RING * rows).max(1),
                sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )
        }
        .unwrap_or_else(|e| fail(e));
        let slots = host.as_mut_slice().unwrap_or_else(|e| fail(e));
        // No choice moves a row to position 0: zeros are empty slots.
        slots.fill(0);
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `slots` is a live allocation of this context made with
        // DEVICEMAP; the call writes one device address.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, slots.as_mut_ptr().cast(), 0) }
            .result()
            .unwrap_or_else(|e| fail(e));
        TokenRing { host, dev }
    }
}
