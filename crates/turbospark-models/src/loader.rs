//! Moves checkpoint tensors onto a backend, checking each shape against the
//! architecture and reporting progress in bytes. Families ask for weights by
//! name and expected shape; this module owns the checks and the progress
//! accounting, nothing about any family's naming.

use std::cell::Cell;

use turbospark_backend::Backend;
use turbospark_format::{Checkpoint, HostTensor};

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

    /// The tensor `name` stored as `[batch, a, b]`, uploaded as
    /// `[batch, b, a]` (the stacked-expert float layout stores `x · W`
    /// matrices, input-major; backends want output rows).
    pub fn tensor_transposed(&self, name: &str, stored: [usize; 3]) -> Result<B::Weight> {
        let t = self.ckpt.get_shaped(name, &stored)?;
        let [batch, a, b] = stored;
        let size = t.dtype.size();
        let mut bytes = vec![0u8; t.bytes.len()];
        for e in 0..batch {
            let base = e * a * b * size;
            for i in 0..a {
                for j in 0..b {
                    let src = base + (i * b + j) * size;
                    let dst = base + (j * a + i) * size;
                    bytes[dst..dst + size].copy_from_slice(&t.bytes[src..src + size]);
                }
            }
        }
        let shape = [batch, b, a];
        let w = self.be.upload(&HostTensor {
            name: t.name,
            dtype: t.dtype,
            shape: &shape,
            bytes: &bytes,
        })?;
        self.account(t.bytes.len() as u64, &w);
        Ok(w)
    }

    /// An MXFP4 weight from `{base}_blocks` and `{base}_scales` with
    /// `rows × cols` per leading index.
    pub fn mxfp4(&self, base: &str, lead: usize, rows: usize, cols: usize) -> Result<B::Weight> {
        let blocks = self
            .ckpt
            .get_shaped(&format!("{base}_blocks"), &[lead, rows, cols / 32, 16])?;
        let scales = self
            .ckpt
            .get_shaped(&format!("{base}_scales"), &[lead, rows, cols / 32])?;
        let w = self.be.upload_mxfp4(&blocks, &scales)?;
        self.account((blocks.bytes.len() + scales.bytes.len()) as u64, &w);
        Ok(w)
    }

    fn account(&self, read: u64, w: &B::Weight) {
        self.device
            .set(self.device.get() + self.be.weight_bytes(w) as u64);
        self.done.set(self.done.get() + read);
        (self.progress)(self.done.get(), self.total);
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
