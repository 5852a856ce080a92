//! Moves checkpoint tensors onto a backend, checking each shape against the
//! architecture and reporting progress in bytes. Families ask for weights by
//! name and expected shape; this module owns the checks and the progress
//! accounting, nothing about any family's naming.

use std::cell::Cell;

use turbospark_backend::Backend;
use turbospark_format::Checkpoint;

use crate::error::Result;

/// Progress callback: (bytes loaded so far, total bytes).
pub type Progress<'a> = &'a dyn Fn(u64, u64);

pub struct Loader<'a, B: Backend> {
    pub be: &'a B,
    pub ckpt: &'a Checkpoint,
    progress: Progress<'a>,
    done: Cell<u64>,
    total: u64,
    device: Cell<u64>,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub fn new(be: &'a B, ckpt: &'a Checkpoint, progress: Progress<'a>) -> Self {
        Loader {
            be,
            ckpt,
            progress,
            done: Cell::new(0),
            total: ckpt.total_bytes(),
            device: Cell::new(0),
        }
    }

    /// The tensor `name` with exactly `shape`, uploaded as stored.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        let t = self.ckpt.get_shaped(name, shape)?;
        let w = self.be.upload(&t)?;
        self.device
            .set(self.device.get() + self.be.weight_bytes(&w) as u64);
        self.done.set(self.done.get() + t.bytes.len() as u64);
        (self.progress)(self.done.get(), self.total);
        Ok(w)
    }

    /// Bytes of everything uploaded so far, as stored on the backend.
    pub fn device_bytes(&self) -> u64 {
        self.device.get()
    }

    /// Like [`tensor`](Self::tensor), or `None` when `present` is false.
    pub fn tensor_if(
        &self,
        present: bool,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<B::Weight>> {
        present.then(|| self.tensor(name, shape)).transpose()
    }
}
