//! Model families: one file per forward-pass definition, each written once
//! over the [`Backend`] trait from the shared blocks in `crate::layers`.

pub mod gemma;
pub mod gpt_oss;
pub mod llama;
pub mod mixtral;
pub mod qwen3_moe;

use turbospark_backend::Backend;
use turbospark_format::ModelSpec;

use crate::error::Result;
use crate::kv_cache::KvCache;

/// A causal language model loaded on a backend.
pub trait CausalLm<B: Backend>: Send + Sync {
    fn spec(&self) -> &ModelSpec;

    /// Runs `tokens` at the next positions of `cache` (at most
    /// `cache.max_chunk()` of them), appending their keys and values.
    /// Returns logits `[tokens.len(), vocab]` when `all_logits`, else the
    /// last position's `[1, vocab]`.
    fn forward(
        &self,
        be: &B,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        all_logits: bool,
    ) -> Result<B::Tensor> {
        let positions = cache.reserve(tokens.len())?;
        let batch = be.batch(tokens, &positions);
        self.forward_batch(be, &batch, tokens.len(), cache, all_logits)
    }

    /// [`CausalLm::forward`] on a batch of `rows` tokens that the caller
    /// made for the positions `cache.reserve(rows)` returned (a decode
    /// step keeps one batch and overwrites it, see `Session`). Queues no
    /// host read-back and sizes nothing by the batch's positions, so a
    /// backend can record it as a graph.
    fn forward_batch(
        &self,
        be: &B,
        batch: &B::Batch,
        rows: usize,
        cache: &mut KvCache<B>,
        all_logits: bool,
    ) -> Result<B::Tensor>;

    /// Bytes of weights held on the backend.
    fn weight_bytes(&self, be: &B) -> u64;

    /// Weight bytes one decoded token reads: everything but an untied
    /// embedding table (only gathered), with MoE experts counted for the
    /// fraction `top_k / experts` that a token activates.
    fn decode_bytes(&self) -> u64;
}
