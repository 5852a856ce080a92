//! The generation loop: prefill the prompt, then sample and feed one token
//! at a time until EOS, a stop string, the token limit, the context limit or
//! a cancel request. Text is streamed through a callback in pieces that are
//! whole UTF-8 and never include (the start of) a stop string.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;
use turbospark_backend::Backend;
use turbospark_models::Session;
use turbospark_models::sampler::{Sampler, SamplerConfig};
use turbospark_text::{StopStrings, StreamDecoder};

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

impl<B: Backend + 'static> Engine<B> {
    /// Generates a continuation of `prompt` in `session` (which may already
    /// hold earlier turns). `on_text` receives printable text as it arrives.
    pub fn generate(
        &self,
        session: &mut Session<'_, B>,
        prompt: &[u32],
        params: &GenParams,
        cancel: Option<&AtomicBool>,
        mut on_text: impl FnMut(&str),
    ) -> Result<Generated> {
        let eos = if params.ignore_eos {
            Vec::new()
        } else {
            self.eos_ids()
        };
        let mut sampler = Sampler::new(params.sampler.clone());
        let mut history: Vec<u32> = prompt.to_vec();
        let mut decoder = StreamDecoder::new(!params.keep_special);
        let mut stops = StopStrings::new(params.stop.clone());
        let mut text = String::new();
        let mut tokens = Vec::new();

        // Greedy decoding without penalties is an argmax: chosen where the
        // logits are (the GPU sends back one id, not the vocabulary); other
        // settings sample from summaries of them where the backend makes
        // those (Session::feed_sample).
        let argmax = params.sampler.is_plain_greedy();
        let mut choose = |session: &mut Session<'_, B>, fed: &[u32], history: &[u32]| {
            Ok::<_, EngineError>(if argmax {
                session.feed_argmax(fed)?
            } else {
                session.feed_sample(fed, &mut sampler, history)?
            })
        };
        let t0 = Instant::now();
        let mut next = choose(session, prompt, &history)?;
        let prefill_secs = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut finish = FinishReason::Length;
        let mut emit = |piece: &str, text: &mut String, stops: &mut StopStrings| -> bool {
            let (out, stopped) = stops.push(piece);
            if !out.is_empty() {
                on_text(&out);
                text.push_str(&out);
            }
            stopped
        };
        while tokens.len() < params.max_tokens {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                finish = FinishReason::Cancelled;
                break;
            }
            if eos.contains(&next) {
                finish = FinishReason::Eos;
                break;
            }
            tokens.push(next);
            history.push(next);
            if let Some(tok) = &self.tokenizer {
                let piece = decoder.push(tok, next)?;
                if emit(&piece, &mut text, &mut stops) {
                    finish = FinishReason::Stop;
                    break;
                }
            }
            if tokens.len() == params.max_tokens {
                break;
            }
            if session.position() >= session.max_context() {
                finish = FinishReason::Context;
                break;
            }
            next = choose(session, &[next], &history)?;
        }
        if finish != FinishReason::Stop {
            if let Some(tok) = &self.tokenizer {
                let rest = decoder.finish(tok)?;
                emit(&rest, &mut text, &mut stops);
            }
            let tail = stops.flush();
            if !tail.is_empty() {
                on_text(&tail);
                text.push_str(&tail);
            }
        }
        let decode_secs = t1.elapsed().as_secs_f64();
        // Decode speed counts the tokens that needed a forward pass after
        // the prefill: every generated token but the first.
        let decoded = tokens.len().saturating_sub(1);
        Ok(Generated {
            prompt_tokens: prompt.len(),
            prefill_tok_s: prompt.len() as f64 / prefill_secs.max(1e-9),
            decode_tok_s: if decoded == 0 {
                0.0
            } else {
                decoded as f64 / decode_secs.max(1e-9)
            },
            tokens,
            text,
            finish_reason: finish,
        })
    }
}
