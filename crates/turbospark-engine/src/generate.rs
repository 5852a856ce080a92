//! The generation loop: prefill the prompt, then sample and feed one token
//! at a time until EOS, a stop string, the token limit, the context limit or
//! a cancel request. Text is streamed through a callback in pieces that are
//! whole UTF-8 and never include (the start of) a stop string. Greedy
//! requests decode a step ahead of the host (`Session::decode_greedy`):
//! the rules that end a generation run while the next step already does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;
use turbospark_backend::Backend;
use turbospark_models::sampler::{Sampler, SamplerConfig};
use turbospark_models::{GreedyEnd, Session};
use turbospark_text::{StopStrings, StreamDecoder, Tokenizer};

use crate::engine::Engine;
use crate::error::{EngineError, Result};

#[derive(Clone, Debug, Default)]
pub struct GenParams {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    /// Stream special tokens as text too (`<|channel|>`...), for callers
    /// that parse a structured format such as Harmony. Off by default.
    pub keep_special: bool,
    /// Generate through end-of-sequence tokens (benchmarks, reference runs).
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Eos,
    Stop,
    Length,
    Context,
    Cancelled,
}

#[derive(Clone, Debug, Serialize)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub text: String,
    pub prompt_tokens: usize,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub finish_reason: FinishReason,
}

/// What generation has taken so far, and the rules that end it: each
/// chosen token goes through [`Taker::take`].
struct Taker<'a, F: FnMut(&str)> {
    eos: Vec<u32>,
    max_tokens: usize,
    cancel: Option<&'a AtomicBool>,
    tokenizer: Option<&'a Tokenizer>,
    decoder: StreamDecoder,
    stops: StopStrings,
    on_text: F,
    text: String,
    /// The prompt and the tokens taken (what penalties see).
    history: Vec<u32>,
    prompt_len: usize,
    finish: FinishReason,
    /// A failure inside `take` (decoding text), returned once it stops.
    failure: Option<EngineError>,
}

impl<F: FnMut(&str)> Taker<'_, F> {
    /// Takes the chosen token `next`: false when generation ends here
    /// (`finish` says why; an end-of-sequence token is not taken).
    fn take(&mut self, next: u32) -> bool {
        if self.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            self.finish = FinishReason::Cancelled;
            return false;
        }
        if self.eos.contains(&next) {
            self.finish = FinishReason::Eos;
            return false;
        }
        self.history.push(next);
        if let Some(tok) = self.tokenizer {
            match self.decoder.push(tok, next) {
                Ok(piece) => {
                    if self.emit(&piece) {
                        self.finish = FinishReason::Stop;
                        return false;
                    }
                }
                Err(e) => {
                    self.failure = Some(e.into());
                    return false;
                }
            }
        }
        self.tokens().len() < self.max_tokens
    }

    /// The tokens taken so far.
    fn tokens(&self) -> &[u32] {
        &self.history[self.prompt_len..]
    }

    /// Streams `piece` up to a stop string; true if one was reached.
    fn emit(&mut self, piece: &str) -> bool {
        let (out, stopped) = self.stops.push(piece);
        self.send(&out);
        stopped
    }

    /// Hands text past the stop-string check to the caller and keeps it.
    fn send(&mut self, out: &str) {
        if !out.is_empty() {
            (self.on_text)(out);
            self.text.push_str(out);
        }
    }

    /// The text held back (an unfinished character, a possible stop
    /// string's start), once generation has ended other than at a stop.
    fn finish_text(&mut self) -> Result<()> {
        if self.finish == FinishReason::Stop {
            return Ok(());
        }
        if let Some(tok) = self.tokenizer {
            let rest = self.decoder.finish(tok)?;
            self.emit(&rest);
        }
        let tail = self.stops.flush();
        self.send(&tail);
        Ok(())
    }
}

impl<B: Backend + 'static> Engine<B> {
    /// Generates a continuation of `prompt` in `session` (which may already
    /// hold earlier turns). `on_text` receives printable text as it arrives.
    pub fn generate(
        &self,
        session: &mut Session<'_, B>,
        prompt: &[u32],
        params: &GenParams,
        cancel: Option<&AtomicBool>,
        on_text: impl FnMut(&str),
    ) -> Result<Generated> {
        let mut taker = Taker {
            eos: if params.ignore_eos {
                Vec::new()
            } else {
                self.eos_ids()
            },
            max_tokens: params.max_tokens,
            cancel,
            tokenizer: self.tokenizer.as_ref(),
            decoder: StreamDecoder::new(!params.keep_special),
            stops: StopStrings::new(params.stop.clone()),
            on_text,
            text: String::new(),
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
            finish: FinishReason::Length,
            failure: None,
        };
        let mut sampler = Sampler::new(params.sampler.clone());
        // Greedy decoding without penalties is an argmax: chosen where the
        // logits are (the GPU sends back one id, not the vocabulary), one
        // step ahead of the host (Session::decode_greedy); other settings
        // sample from summaries of the logits where the backend makes those
        // (Session::feed_sample).
        let argmax = params.sampler.is_plain_greedy();
        let t0 = Instant::now();
        let first = if argmax {
            session.feed_argmax(prompt)?
        } else {
            session.feed_sample(prompt, &mut sampler, &taker.history)?
        };
        let prefill_secs = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        if params.max_tokens > 0 && taker.take(first) {
            // Every taken token but the last is fed.
            if session.position() >= session.max_context() {
                taker.finish = FinishReason::Context;
            } else if argmax {
                let steps = params.max_tokens - 1;
                if session.decode_greedy(first, steps, |t| taker.take(t))? == GreedyEnd::ContextFull
                {
                    taker.finish = FinishReason::Context;
                }
            } else {
                let mut next = first;
                loop {
                    next = session.feed_sample(&[next], &mut sampler, &taker.history)?;
                    if !taker.take(next) {
                        break;
                    }
                    if session.position() >= session.max_context() {
                        taker.finish = FinishReason::Context;
                        break;
                    }
                }
            }
        }
        if let Some(e) = taker.failure.take() {
            return Err(e);
        }
        taker.finish_text()?;
        let decode_secs = t1.elapsed().as_secs_f64();
        // Decode speed counts the tokens that needed a forward pass after
        // the prefill: every generated token but the first.
        let decoded = taker.tokens().len().saturating_sub(1);
        Ok(Generated {
            prompt_tokens: prompt.len(),
            prefill_tok_s: prompt.len() as f64 / prefill_secs.max(1e-9),
            decode_tok_s: if decoded == 0 {
                0.0
            } else {
                decoded as f64 / decode_secs.max(1e-9)
            },
            tokens: taker.history.split_off(taker.prompt_len),
            text: taker.text,
            finish_reason: taker.finish,
        })
    }
}
