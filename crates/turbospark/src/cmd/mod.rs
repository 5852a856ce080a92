//! One module per subcommand, and the steps they share: choosing the
//! device, loading an engine with a progress bar, turning flags into a
//! sampler configuration.

pub mod bench;
pub mod chat;
mod harmony_view;
pub mod inspect;
pub mod logits;
pub mod perplexity;
pub mod run;
pub mod synth;
pub mod tokenize;

use anyhow::{Result, bail};
use turbospark_backend::Quant;
use turbospark_cpu::Cpu;
use turbospark_engine::Engine;
use turbospark_models::LoadOptions;
use turbospark_models::sampler::SamplerConfig;
use turbospark_text::GenerationConfig;

use crate::args::{Device, ModelArgs, QuantArg, SamplingArgs};
use crate::progress::LoadBar;

/// Loads the model for any subcommand that runs one.
pub fn load_engine(args: &ModelArgs) -> Result<Engine<Cpu>> {
    match args.device {
        Device::Cpu | Device::Auto => {}
        Device::Cuda => bail!("--device cuda: this build has no CUDA backend (use --device cpu)"),
    }
    if let Some(n) = args.threads {
        // Fails only if a pool already exists, which cannot happen this early.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global();
    }
    let name = args.model.display().to_string();
    let bar = LoadBar::new(&name);
    let opts = LoadOptions {
        quant: args.quant.map(|q| match q {
            QuantArg::Int8 => Quant::Int8,
            QuantArg::Int4 => Quant::Int4,
        }),
    };
    let engine = Engine::load_with(Cpu, &args.model, opts, &|done, total| {
        bar.update(done, total)
    })?;
    bar.finish();
    Ok(engine)
}

/// The context to allocate: `--context`, else the model's own limit capped
/// at 8192 (the KV cache is allocated up front).
pub fn context_len(args: &ModelArgs, engine: &Engine<Cpu>) -> usize {
    args.context
        .unwrap_or_else(|| engine.model.spec().max_positions.min(8192))
}

/// Flags over generation_config.json's defaults. Like transformers, the
/// defaults sample only when the model's generation_config says `do_sample`.
pub fn sampler_config(s: &SamplingArgs, g: &GenerationConfig) -> SamplerConfig {
    let sampled = g.do_sample.unwrap_or(false);
    SamplerConfig {
        temperature: s.temperature.unwrap_or(if sampled {
            g.temperature.unwrap_or(1.0)
        } else {
            0.0
        }),
        top_k: s
            .top_k
            .or(g.top_k.filter(|_| sampled).map(|k| k as usize))
            .unwrap_or(0),
        top_p: s.top_p.or(g.top_p.filter(|_| sampled)).unwrap_or(1.0),
        min_p: s.min_p.or(g.min_p.filter(|_| sampled)).unwrap_or(0.0),
        repetition_penalty: s.repetition_penalty.or(g.repetition_penalty).unwrap_or(1.0),
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        seed: s.seed,
    }
}
