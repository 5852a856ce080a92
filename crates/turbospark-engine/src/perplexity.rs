//! Teacher-forced perplexity: the text's tokens are cut into consecutive,
//! non-overlapping windows of `context` tokens; each window is run as one
//! fresh sequence and every token after the window's first is scored by the
//! log-softmax of the previous position's logits (f64 accumulation). This is
//! the standard fixed-window evaluation; `tools/train-demo` computes the same
//! quantity with transformers.
//!
//! [`Scoring`] picks which of the model's two paths computes the logits: one
//! prompt pass a window (prefill's GEMMs), or one decode step a token, which
//! is what generation runs. The two differ where decode multiplies
//! activations rounded to integers (int8/int4/MXFP4 weights, on the CPU and
//! the GPU alike), so scoring through the decode path measures the quality
//! of what a user's generated tokens actually come from.

use serde::Serialize;
use turbospark_backend::Backend;

use crate::engine::Engine;
use crate::error::{EngineError, Result};

/// Which path computes the scored logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scoring {
    /// One prompt pass a window, every position's logits at once.
    Prompt,
    /// One decode step a token, each step's logits read back: the kernels
    /// and the activation rounding that generation uses. Slower.
    Decode,
}

#[derive(Clone, Debug, Serialize)]
pub struct Perplexity {
    pub perplexity: f64,
    /// Mean negative log-likelihood per scored token (nats).
    pub nll: f64,
    /// Tokens scored (every token but the first of each window).
    pub scored_tokens: usize,
    pub total_tokens: usize,
    pub windows: usize,
    pub context: usize,
    pub scoring: Scoring,
}

impl<B: Backend + 'static> Engine<B> {
    pub fn perplexity(
        &self,
        tokens: &[u32],
        context: usize,
        scoring: Scoring,
    ) -> Result<Perplexity> {
        if context < 2 {
            return Err(EngineError::Usage("--context must be at least 2".into()));
        }
        let vocab = self.model.spec().vocab_size;
        let mut nll = 0.0f64;
        let mut scored = 0usize;
        let mut windows = 0usize;
        for window in tokens.chunks(context).filter(|w| w.len() >= 2) {
            let mut session = self.session(window.len())?;
            let mut score = |row: &[f32], next: u32| {
                nll += negative_log_likelihood(row, next);
                scored += 1;
            };
            match scoring {
                Scoring::Prompt => {
                    let logits = session.feed(window, true)?;
                    for (row, &next) in logits.chunks_exact(vocab).zip(&window[1..]) {
                        score(row, next);
                    }
                }
                Scoring::Decode => {
                    for pair in window.windows(2) {
                        score(&session.feed(&pair[..1], false)?, pair[1]);
                    }
                }
            }
            windows += 1;
        }
        if scored == 0 {
            return Err(EngineError::Usage(
                "the text has fewer than 2 tokens: nothing to score".into(),
            ));
        }
        let mean = nll / scored as f64;
        Ok(Perplexity {
            perplexity: mean.exp(),
            nll: mean,
            scored_tokens: scored,
            total_tokens: tokens.len(),
            windows,
            context,
            scoring,
        })
    }
}

/// −log softmax(row)[next], in f64 from the row's maximum.
fn negative_log_likelihood(row: &[f32], next: u32) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + sum.ln() - row[next as usize] as f64
}
