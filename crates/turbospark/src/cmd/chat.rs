//! `turbospark chat`: an interactive conversation through the model's chat
//! template. History is kept (the KV cache of earlier turns is reused when
//! the rendered conversation extends what was already fed); `/reset` starts
//! over, `/exit` or end of input leaves, Ctrl-C stops the current answer.
//! A Harmony model's (gpt-oss) reasoning is shown dimmed or hidden, and only
//! its answer joins the history (as the template expects).

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use turbospark_backend::Backend;
use turbospark_engine::Engine;
use turbospark_engine::GenParams;
use turbospark_text::Message;

use super::harmony_view::HarmonyView;
use super::{context_len, sampler_config, with_engine};
use crate::args::ChatArgs;

pub fn main(a: ChatArgs) -> Result<()> {
    with_engine!(&a.model, |engine| on(&a, &engine))
}

fn on<B: Backend + 'static>(a: &ChatArgs, engine: &Engine<B>) -> Result<()> {
    engine.check_chat()?;
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let cancel = cancel.clone();
        ctrlc::set_handler(move || cancel.store(true, Ordering::Relaxed))?;
    }
    let params = GenParams {
        max_tokens: a.sampling.max_tokens,
        sampler: sampler_config(&a.sampling, &engine.gen_config),
        stop: a.sampling.stop.clone(),
        keep_special: engine.is_harmony(),
        ignore_eos: a.sampling.ignore_eos,
    };
    let template_vars = a.reasoning.template_vars();
    let mut session = engine.session(context_len(&a.model, engine)?)?;
    let fresh = || -> Vec<Message> { a.system.iter().map(|s| Message::new("system", s)).collect() };
    let mut history = fresh();
    eprintln!(
        "chatting with {} (/reset, /exit; Ctrl-C stops an answer)",
        a.model.dir().display()
    );
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    loop {
        print!("> ");
        stdout.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            println!();
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                history = fresh();
                session.reset()?;
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        history.push(Message::new("user", line));
        let prompt = engine.encode_chat(&history, &template_vars)?;
        let todo = session.reuse_prefix(&prompt).to_vec();
        cancel.store(false, Ordering::Relaxed);
        let mut view = params
            .keep_special
            .then(|| HarmonyView::new(!a.reasoning.hide_reasoning, stdout.is_terminal()));
        let on_text = |piece: &str| match &mut view {
            Some(view) => view.push(piece, &mut stdout),
            None => {
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            }
        };
        let result = engine.generate(&mut session, &todo, &params, Some(&cancel), on_text);
        if let Some(view) = &mut view {
            view.finish(&mut stdout);
        }
        println!();
        match result {
            Ok(out) => {
                let answer = view.map_or(out.text, |v| v.answer);
                history.push(Message::new("assistant", answer.trim()));
            }
            Err(e) => {
                // Keep the conversation usable: drop the turn that failed.
                eprintln!("turbospark: error: {e}");
                history.pop();
            }
        }
    }
}
