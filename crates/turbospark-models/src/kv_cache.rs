//! The KV-cache manager for one sequence.
//!
//! It decides each layer's storage shape from the layer's attention span
//! (full layers hold the whole context; sliding layers hold a ring of
//! `window + max_chunk` rows, so their memory does not grow with context)
//! and tracks how many positions are filled. The storage itself belongs to
//! the backend (`Backend::Kv`); paged and compressed caches will plug in here.
//! It must not do attention arithmetic.

use turbospark_backend::{Backend, KvSpec};
use turbospark_format::{AttnSpan, ModelSpec};

use crate::error::{ModelError, Result};

pub struct KvCache<B: Backend> {
    layers: Vec<B::Kv>,
    len: usize,
    max_context: usize,
    max_chunk: usize,
}

impl<B: Backend> KvCache<B> {
    /// A cache for up to `max_context` positions, fed at most `max_chunk`
    /// tokens per forward call.
    pub fn new(be: &B, spec: &ModelSpec, max_context: usize, max_chunk: usize) -> Self {
        let max_chunk = max_chunk.min(max_context).max(1);
        let layers = spec
            .layer_spans
            .iter()
            .map(|span| {
                let capacity = match *span {
                    AttnSpan::Full => max_context,
                    AttnSpan::Sliding { window } => (window + max_chunk).min(max_context),
                };
                be.kv_alloc(KvSpec {
                    capacity,
                    kv_dim: spec.kv_dim(),
                })
            })
            .collect();
        KvCache {
            layers,
            len: 0,
            max_context,
            max_chunk,
        }
    }

    /// Positions filled so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Most tokens one forward call may append.
    pub fn max_chunk(&self) -> usize {
        self.max_chunk
    }

    pub fn layer_mut(&mut self, i: usize) -> &mut B::Kv {
        &mut self.layers[i]
    }

    /// Positions for `n` new tokens, after checking they fit.
    pub fn reserve(&self, n: usize) -> Result<Vec<u32>> {
        if self.len + n > self.max_context {
            return Err(ModelError::ContextFull {
                needed: self.len + n,
                capacity: self.max_context,
            });
        }
        assert!(
            n <= self.max_chunk,
            "forward chunk larger than the cache was sized for"
        );
        Ok((self.len..self.len + n).map(|p| p as u32).collect())
    }

    /// Marks `n` more positions filled (after a forward call wrote them).
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Rewinds to `len` positions. Rows past it stay in storage but are
    /// never read: a query at position q reads only keys at positions ≤ q,
    /// and every position ≤ q is rewritten before a query reaches it.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Forgets the sequence by starting from fresh storage.
    pub fn clear(&mut self, be: &B, spec: &ModelSpec) {
        *self = Self::new(be, spec, self.max_context, self.max_chunk);
    }
}
