//! `turbospark run`: one prompt, one streamed continuation (or one JSON
//! object with `--json`). With `--chat` on a Harmony model (gpt-oss) the
//! reply is shown by parts: reasoning, answer, tool calls.

use std::io::{IsTerminal, Write};

use anyhow::{Result, bail};
use turbospark_backend::Backend;
use turbospark_engine::Engine;
use turbospark_engine::GenParams;
use turbospark_text::Message;

use super::harmony_view::HarmonyView;
use super::{context_len, sampler_config, with_engine};
use crate::args::RunArgs;

pub fn main(a: RunArgs) -> Result<()> {
    with_engine!(&a.model, |engine| on(&a, &engine))
}

fn on<B: Backend + 'static>(a: &RunArgs, engine: &Engine<B>) -> Result<()> {
    let prompt: Vec<u32> = match (&a.prompt, &a.prompt_tokens) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) if a.chat => {
            let mut messages = Vec::new();
            if let Some(system) = &a.system {
                messages.push(Message::new("system", system));
            }
            messages.push(Message::new("user", text));
            engine.encode_chat(&messages, &a.reasoning.template_vars())?
        }
        (Some(text), None) => engine.encode_plain(text)?,
        (None, None) => bail!("give a prompt with --prompt TEXT or --prompt-tokens 1,2,3"),
    };
    // A Harmony reply is parsed from its markers, so they must reach us.
    let harmony = a.chat && engine.is_harmony();
    let params = GenParams {
        max_tokens: a.sampling.max_tokens,
        sampler: sampler_config(&a.sampling, &engine.gen_config),
        stop: a.sampling.stop.clone(),
        keep_special: harmony,
        ignore_eos: a.sampling.ignore_eos,
    };
    let mut session = engine.session(context_len(&a.model, engine)?)?;
    let json = a.json;
    let stdout = std::io::stdout();
    let mut view = HarmonyView::new(!a.reasoning.hide_reasoning, stdout.is_terminal());
    // With --json nothing streams; a Harmony reply is still parsed.
    let mut shown: Box<dyn Write> = if json {
        Box::new(std::io::sink())
    } else {
        Box::new(stdout)
    };
    let out = engine.generate(&mut session, &prompt, &params, None, |piece| {
        if harmony {
            view.push(piece, &mut shown);
        } else {
            // A closed pipe (`| head`) is not an error worth reporting.
            let _ = shown.write_all(piece.as_bytes());
            let _ = shown.flush();
        }
    })?;
    if harmony {
        view.finish(&mut shown);
    }
    if json {
        let serde_json::Value::Object(fields) = serde_json::to_value(&out)? else {
            bail!("generation result did not serialise to an object");
        };
        let mut object = serde_json::Map::new();
        for (key, value) in fields {
            if harmony && key == "text" {
                // The answer; the reasoning and tool calls beside it.
                object.insert(key, view.answer.clone().into());
                object.insert("reasoning".into(), view.reasoning.clone().into());
                object.insert("tool_calls".into(), serde_json::to_value(&view.tool_calls)?);
            } else {
                object.insert(key, value);
            }
        }
        println!("{}", serde_json::Value::Object(object));
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
