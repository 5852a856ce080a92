//! `turbospark logits`: the logits of every position of a token sequence,
//! run as one prompt, written as a float32 `[n_tokens, vocab]` .npy file.

use anyhow::Result;
use turbospark_backend::Backend;
use turbospark_engine::Engine;
use turbospark_format::npy;

use super::with_engine;
use crate::args::LogitsArgs;

pub fn main(a: LogitsArgs) -> Result<()> {
    with_engine!(&a.model, |engine| on(&a, &engine))
}

fn on<B: Backend + 'static>(a: &LogitsArgs, engine: &Engine<B>) -> Result<()> {
    let ctx = a
        .model
        .context
        .unwrap_or(a.tokens.len())
        .max(a.tokens.len());
    let mut session = engine.session(ctx)?;
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
