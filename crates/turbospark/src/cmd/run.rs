//! `turbospark run`: one prompt, one streamed continuation (or one JSON
//! object with `--json`).

use std::io::Write;

use anyhow::{Result, bail};
use turbospark_engine::GenParams;
use turbospark_text::Message;

use super::{context_len, load_engine, sampler_config};
use crate::args::RunArgs;

pub fn main(a: RunArgs) -> Result<()> {
    let engine = load_engine(&a.model)?;
    let prompt: Vec<u32> = match (&a.prompt, &a.prompt_tokens) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) if a.chat => {
            let mut messages = Vec::new();
            if let Some(system) = &a.system {
                messages.push(Message::new("system", system));
            }
            messages.push(Message::new("user", text));
            engine.encode_chat(&messages, &Default::default())?
        }
        (Some(text), None) => engine.encode_plain(text)?,
        (None, None) => bail!("give a prompt with --prompt TEXT or --prompt-tokens 1,2,3"),
    };
    let params = GenParams {
        max_tokens: a.sampling.max_tokens,
        sampler: sampler_config(&a.sampling, &engine.gen_config),
        stop: a.sampling.stop.clone(),
    };
    let mut session = engine.session(context_len(&a.model, &engine));
    let mut stdout = std::io::stdout();
    let json = a.json;
    let out = engine.generate(&mut session, &prompt, &params, None, |piece| {
        if !json {
            // A closed pipe (`| head`) is not an error worth reporting.
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    if json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {:.1} tok/s prefill; {} generated, {:.1} tok/s decode; {:?}]",
            out.prompt_tokens,
            out.prefill_tok_s,
            out.tokens.len(),
            out.decode_tok_s,
            out.finish_reason
        );
    }
    Ok(())
}
