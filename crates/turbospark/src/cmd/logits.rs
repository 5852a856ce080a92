//! `turbospark logits`: the logits of every position of a token sequence,
//! run as one prompt, written as a float32 `[n_tokens, vocab]` .npy file.

use anyhow::Result;
use turbospark_format::npy;

use super::load_engine;
use crate::args::LogitsArgs;

pub fn main(a: LogitsArgs) -> Result<()> {
    let engine = load_engine(&a.model)?;
    let ctx = a
        .model
        .context
        .unwrap_or(a.tokens.len())
        .max(a.tokens.len());
    let mut session = engine.session(ctx);
    let logits = session.feed(&a.tokens, true)?;
    let vocab = engine.model.spec().vocab_size;
    npy::write_f32(&a.out, &[a.tokens.len(), vocab], &logits)?;
    eprintln!(
        "wrote {} x {} logits to {}",
        a.tokens.len(),
        vocab,
        a.out.display()
    );
    Ok(())
}
