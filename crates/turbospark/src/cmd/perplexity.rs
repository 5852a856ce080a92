//! `turbospark perplexity`: teacher-forced perplexity of a text file in
//! fixed windows of `--context` tokens.

use anyhow::{Context, Result};
use turbospark_backend::Backend;
use turbospark_engine::{Engine, Scoring};

use super::{context_or, with_engine};
use crate::args::PerplexityArgs;

pub fn main(a: PerplexityArgs) -> Result<()> {
    with_engine!(&a.model, |engine| on(&a, &engine))
}

fn on<B: Backend + 'static>(a: &PerplexityArgs, engine: &Engine<B>) -> Result<()> {
    let text = std::fs::read_to_string(&a.text_file)
        .with_context(|| format!("{}: cannot read", a.text_file.display()))?;
    let tokens = engine.tokenizer()?.encode(&text, false)?;
    let context = context_or(&a.model, engine, 512)?;
    let scoring = if a.decode {
        Scoring::Decode
    } else {
        Scoring::Prompt
    };
    let p = engine.perplexity(&tokens, context, scoring)?;
    if a.json {
        println!("{}", serde_json::to_string(&p)?);
    } else {
        println!(
            "perplexity {:.4} over {} scored tokens ({} tokens, {} windows of {}, {} path)",
            p.perplexity,
            p.scored_tokens,
            p.total_tokens,
            p.windows,
            p.context,
            match p.scoring {
                Scoring::Prompt => "prompt",
                Scoring::Decode => "decode",
            }
        );
    }
    Ok(())
}
