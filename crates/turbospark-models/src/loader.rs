//! Moves checkpoint tensors onto a backend, checking each shape against the
//! architecture and reporting progress in bytes. Families ask for weights by
//! name and expected shape; this module owns the checks and the progress
//! accounting, nothing about any family's naming.
//!
//! Tensors come from a [`TensorSource`]: a memory-mapped checkpoint, or a
//! source that generates each tensor when asked (random weights for
//! benchmarks). Each fetched tensor is dropped once uploaded, so host memory
//! beyond the mapping stays around one tensor.

use std::cell::Cell;

use turbospark_backend::{Backend, QUANT_GROUP, Quant};
use turbospark_format::HostTensor;
use turbospark_format::checkpoint::{SourceTensor, TensorSource};

use crate::error::Result;

/// Progress callback: (bytes loaded so far, total bytes).
pub type Progress<'a> = &'a dyn Fn(u64, u64);

/// Choices made at load time.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Weight-only quantization of the projection matrices.
    pub quant: Option<Quant>,
    /// Values one scale of `quant` covers (`--quant-group`; a matrix whose
    /// rows it does not divide takes the largest group that does).
    pub quant_group: usize,
    /// Hand every tensor to the backend without its mapping (llama.cpp's
    /// `--no-mmap`): the CPU then copies the weights it would read in
    /// place, so the checkpoint may change or vanish while the model runs.
    pub no_mmap: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            quant: None,
            quant_group: QUANT_GROUP,
            no_mmap: false,
        }
    }
}

pub struct Loader<'a, B: Backend> {
    pub be: &'a B,
    /// Where tensors come from (named `ckpt` for the families' presence checks).
    pub ckpt: &'a dyn TensorSource,
    opts: LoadOptions,
    progress: Progress<'a>,
    done: Cell<u64>,
    total: u64,
    device: Cell<u64>,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub fn new(
        be: &'a B,
        ckpt: &'a dyn TensorSource,
        opts: LoadOptions,
        progress: Progress<'a>,
    ) -> Self {
        Loader {
            be,
            ckpt,
            opts,
            progress,
            done: Cell::new(0),
            total: ckpt.total_bytes(),
            device: Cell::new(0),
        }
    }

    /// The tensor `name` with exactly `shape`, uploaded as stored.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        let t = self.ckpt.fetch_shaped(name, shape)?;
        let w = self.be.upload(&self.host(&t))?;
        self.account(t.bytes.len() as u64, &w);
        Ok(w)
    }

    /// The tensor `name` stored as `[batch, a, b]`, uploaded as
    /// `[batch, b, a]` (the stacked-expert float layout stores `x · W`
    /// matrices, input-major; backends want output rows).
    pub fn tensor_transposed(&self, name: &str, stored: [usize; 3]) -> Result<B::Weight> {
        let t = self.ckpt.fetch_shaped(name, &stored)?;
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
            name: &t.name,
            dtype: t.dtype,
            shape: &shape,
            bytes: &bytes,
            map: None,
        })?;
        self.account(t.bytes.len() as u64, &w);
        Ok(w)
    }

    /// Tensors of equal dtype stacked along a new leading axis, in order,
    /// each of shape `part` (per-expert checkpoints → one stacked weight).
    /// `groups[i]` lists the tensors concatenated into item i's rows.
    pub fn stacked(&self, groups: &[Vec<(String, [usize; 2])>]) -> Result<B::Weight> {
        let mut bytes = Vec::new();
        let mut dtype = None;
        let mut rows = 0;
        let mut cols = 0;
        for (i, group) in groups.iter().enumerate() {
            let mut item_rows = 0;
            for (name, shape) in group {
                let t = self.ckpt.fetch_shaped(name, shape)?;
                if *dtype.get_or_insert(t.dtype) != t.dtype {
                    return Err(turbospark_format::FormatError::Dtype {
                        name: name.clone(),
                        dtype: format!("{} (differs from the other experts)", t.dtype.name()),
                    }
                    .into());
                }
                bytes.extend_from_slice(&t.bytes);
                item_rows += shape[0];
                cols = shape[1];
            }
            if i == 0 {
                rows = item_rows;
            }
        }
        let shape = [groups.len(), rows, cols];
        let name = groups
            .first()
            .and_then(|g| g.first())
            .map_or("", |(n, _)| n.as_str());
        let w = self.be.upload(&HostTensor {
            name,
            dtype: dtype.unwrap_or(turbospark_format::DType::F32),
            shape: &shape,
            bytes: &bytes,
            map: None,
        })?;
        self.account(bytes.len() as u64, &w);
        Ok(w)
    }

    /// An MXFP4 weight from `{base}_blocks` and `{base}_scales` with
    /// `rows × cols` per leading index.
    pub fn mxfp4(&self, base: &str, lead: usize, rows: usize, cols: usize) -> Result<B::Weight> {
        let blocks = self
            .ckpt
            .fetch_shaped(&format!("{base}_blocks"), &[lead, rows, cols / 32, 16])?;
        let scales = self
            .ckpt
            .fetch_shaped(&format!("{base}_scales"), &[lead, rows, cols / 32])?;
        let w = self
            .be
            .upload_mxfp4(&self.host(&blocks), &self.host(&scales))?;
        self.account((blocks.bytes.len() + scales.bytes.len()) as u64, &w);
        Ok(w)
    }

    /// The tensor as the backend gets it: with its mapping, unless
    /// [`LoadOptions::no_mmap`].
    fn host<'t>(&self, t: &'t SourceTensor<'_>) -> HostTensor<'t> {
        let mut view = t.view();
        if self.opts.no_mmap {
            view.map = None;
        }
        view
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

    /// An RMSNorm weight of `dim` values with `offset` added (Gemma stores
    /// `w` and multiplies by `1 + w`; adding 1 in f32 at load is exactly what
    /// its forward computes). Stored as f32 when an offset is added.
    pub fn norm(&self, name: &str, dim: usize, offset: f32) -> Result<B::Weight> {
        if offset == 0.0 {
            return self.tensor(name, &[dim]);
        }
        let t = self.ckpt.fetch_shaped(name, &[dim])?;
        let values: Vec<f32> = t.view().to_f32().iter().map(|w| w + offset).collect();
        let w = self.be.upload_f32(&values, &[dim])?;
        self.account(t.bytes.len() as u64, &w);
        Ok(w)
    }

    /// [`norm`](Self::norm) when `present`.
    pub fn norm_if(
        &self,
        present: bool,
        name: &str,
        dim: usize,
        offset: f32,
    ) -> Result<Option<B::Weight>> {
        present.then(|| self.norm(name, dim, offset)).transpose()
    }

    /// A projection matrix `[out, in]`: like [`tensor`](Self::tensor), but
    /// quantized when the load options ask for it.
    pub fn matrix(&self, name: &str, shape: [usize; 2]) -> Result<B::Weight> {
        let Some(q) = self.opts.quant else {
            return self.tensor(name, &shape);
        };
        let t = self.ckpt.fetch_shaped(name, &shape)?;
        let w = self
            .be
            .upload_quantized(&t.view(), q, self.opts.quant_group)?;
        self.account(t.bytes.len() as u64, &w);
        Ok(w)
    }

    /// The unembedding of a checkpoint whose head is tied to its embedding
    /// `name`: `None` (the embedding serves as the head) unless `--quant`
    /// asks for quantized projections; then a quantized copy of it, as
    /// llama.cpp's quantized files hold one (the lookup keeps the exact
    /// rows; every decoded token reads the head, in int8 about half of
    /// bf16's bytes, in int4 about a quarter). The copy's read is not
    /// counted again in the progress.
    pub fn tied_head(&self, name: &str, shape: [usize; 2]) -> Result<Option<B::Weight>> {
        let Some(q) = self.opts.quant else {
            return Ok(None);
        };
        let t = self.ckpt.fetch_shaped(name, &shape)?;
        let w = self
            .be
            .upload_quantized(&t.view(), q, self.opts.quant_group)?;
        self.account(0, &w);
        Ok(Some(w))
    }

    /// [`matrix`](Self::matrix) when `present`.
    pub fn matrix_if(
        &self,
        present: bool,
        name: &str,
        shape: [usize; 2],
    ) -> Result<Option<B::Weight>> {
        present.then(|| self.matrix(name, shape)).transpose()
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
