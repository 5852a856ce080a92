//! The KV-cache manager for one sequence.
//!
//! It decides each layer's storage shape from the layer's attention span
//! (full layers hold the whole context; sliding layers hold a ring of
//! `window + max_chunk` rows, so their memory does not grow with context),
//! keeps every layer in the dtype it is given (`KvDtype`: the session's
//! choice) and tracks how many positions are filled. The storage itself belongs to
//! the backend (`Backend::Kv`); paged and compressed caches will plug in here.
//! It must not do attention arithmetic.

use turbospark_backend::{Backend, KvDtype, KvSpec};
use turbospark_format::{AttnSpan, ModelSpec};

use crate::error::{ModelError, Result};

pub struct KvCache<B: Backend> {
    layers: Vec<B::Kv>,
    len: usize,
    max_context: usize,
    max_chunk: usize,
    dtype: KvDtype,
}

impl<B: Backend> KvCache<B> {
    /// A cache for up to `max_context` positions, fed at most `max_chunk`
    /// tokens per forward call, keeping keys and values in `dtype`.
    pub fn new(
        be: &B,
        spec: &ModelSpec,
        max_context: usize,
        max_chunk: usize,
        dtype: KvDtype,
    ) -> Result<Self> {
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
                    dtype,
                })
            })
            .collect::<std::result::Result<_, _>>()?;
        Ok(KvCache {
            layers,
            len: 0,
            max_context,
            max_chunk,
            dtype,
        })
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

    /// Forgets the sequence by starting from fresh storage. The old
    /// storage is freed first, so the two are never held at once; if the
    /// new one cannot be allocated, the cache is left empty with no
    /// layers and the error says why.
    pub fn clear(&mut self, be: &B, spec: &ModelSpec) -> Result<()> {
        self.layers.clear();
        self.len = 0;
        *self = Self::new(be, spec, self.max_context, self.max_chunk, self.dtype)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbospark_cpu::Cpu;
    use turbospark_format::parse_config;

    /// A gpt-oss-like spec: even layers slide with window 128.
    fn spec() -> ModelSpec {
        parse_config(
            r#"{"architectures": ["GptOssForCausalLM"], "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_hidden_layers": 4, "vocab_size": 256, "intermediate_size": 64,
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128}"#,
        )
        .unwrap()
    }

    #[test]
    fn sliding_layers_hold_window_plus_chunk_whatever_the_context() {
        for context in [1024, 131_072] {
            let cache = KvCache::new(&Cpu, &spec(), context, 512, KvDtype::F32).unwrap();
            let caps: Vec<usize> = cache.layers.iter().map(|kv| kv.spec.capacity).collect();
            assert_eq!(caps, vec![128 + 512, context, 128 + 512, context]);
        }
        // A context shorter than the ring needs no more than the context.
        let cache = KvCache::new(&Cpu, &spec(), 200, 512, KvDtype::F32).unwrap();
        assert!(cache.layers.iter().all(|kv| kv.spec.capacity == 200));
    }

    #[test]
    fn reserve_refuses_past_the_context_and_truncate_rewinds() {
        let mut cache = KvCache::new(&Cpu, &spec(), 16, 8, KvDtype::F32).unwrap();
        assert_eq!(cache.reserve(3).unwrap(), vec![0, 1, 2]);
        cache.advance(3);
        assert_eq!(cache.reserve(2).unwrap(), vec![3, 4]);
        cache.advance(13);
        assert!(matches!(
            cache.reserve(1),
            Err(ModelError::ContextFull {
                needed: 17,
                capacity: 16
            })
        ));
        cache.truncate(5);
        assert_eq!(cache.reserve(1).unwrap(), vec![5]);
    }
}
