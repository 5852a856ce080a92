//! One sequence being generated: the model, its KV cache, and the prefill
//! and decode steps. Prefill feeds the prompt in chunks of at most
//! `max_chunk` tokens (all tokens of a chunk in one batched pass); decode
//! feeds one token at a time. It owns no sampling policy and no text.

use turbospark_backend::Backend;

use crate::error::{ModelError, Result};
use crate::families::CausalLm;
use crate::kv_cache::KvCache;

pub struct Session<'m, B: Backend> {
    be: &'m B,
    model: &'m dyn CausalLm<B>,
    cache: KvCache<B>,
    /// Every token fed so far, in order (for prompt-prefix reuse).
    fed: Vec<u32>,
}

impl<'m, B: Backend> Session<'m, B> {
    pub fn new(
        be: &'m B,
        model: &'m dyn CausalLm<B>,
        max_context: usize,
        max_chunk: usize,
    ) -> Self {
        let cache = KvCache::new(be, model.spec(), max_context, max_chunk);
        Session {
            be,
            model,
            cache,
            fed: Vec::new(),
        }
    }

    pub fn position(&self) -> usize {
        self.cache.len()
    }

    pub fn max_context(&self) -> usize {
        self.cache.max_context()
    }

    pub fn reset(&mut self) {
        self.cache.clear(self.be, self.model.spec());
        self.fed.clear();
    }

    /// The tokens fed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.fed
    }

    /// Keeps the longest prefix of the fed tokens that `prompt` starts with
    /// and returns the part of `prompt` still to feed. Reuses the cache
    /// across chat turns; at least one token is always left to feed so that
    /// there are logits to sample from.
    pub fn reuse_prefix<'p>(&mut self, prompt: &'p [u32]) -> &'p [u32] {
        let common = self
            .fed
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        self.cache.truncate(common);
        self.fed.truncate(common);
        &prompt[common..]
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.model.spec().vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    /// Appends `tokens`; returns the logits of the last one, or of every one
    /// (`[tokens.len(), vocab]`, row-major) when `all_logits`.
    pub fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        self.check_tokens(tokens)?;
        // Fail before any work if the whole prompt cannot fit.
        if self.cache.len() + tokens.len() > self.cache.max_context() {
            return Err(ModelError::ContextFull {
                needed: self.cache.len() + tokens.len(),
                capacity: self.cache.max_context(),
            });
        }
        let mut out = Vec::new();
        for chunk in tokens.chunks(self.cache.max_chunk()) {
            let logits = self
                .model
                .forward(self.be, chunk, &mut self.cache, all_logits)?;
            self.fed.extend_from_slice(chunk);
            if all_logits {
                out.extend(self.be.to_host(&logits));
            } else {
                out = self.be.to_host(&logits);
            }
        }
        Ok(out)
    }
}
