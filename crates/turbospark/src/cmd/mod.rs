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

use anyhow::Result;
use turbospark_backend::{Backend, KvDtype, Quant};
use turbospark_engine::Engine;
use turbospark_models::LoadOptions;
use turbospark_models::sampler::SamplerConfig;
use turbospark_text::GenerationConfig;

use crate::args::{Device, KvDtypeArg, ModelArgs, QuantArg, SamplingArgs};
use crate::progress::LoadBar;

/// The backend a run uses.
pub enum Picked {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(Box<turbospark_cuda::Cuda>),
}

/// `--device`: `cpu`, `cuda[:N]` (an error naming the cause when there is
/// no such usable GPU or the build lacks CUDA), or `auto` (GPU 0 when one
/// works).
pub fn pick_device(args: &ModelArgs) -> Result<Picked> {
    match args.device {
        Device::Cpu => Ok(Picked::Cpu),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => turbospark_cuda::Cuda::with_device(n)
            .map(|c| cuda(c, args))
            .map_err(|e| anyhow::anyhow!("--device cuda:{n}: {e}")),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(n) => anyhow::bail!(
            "--device cuda:{n}: this build has no CUDA backend (rebuild with --features cuda)"
        ),
        #[cfg(feature = "cuda")]
        Device::Auto => Ok(turbospark_cuda::Cuda::new().map_or(Picked::Cpu, |c| cuda(c, args))),
        #[cfg(not(feature = "cuda"))]
        Device::Auto => Ok(Picked::Cpu),
    }
}

/// The GPU backend with `--precision` applied.
#[cfg(feature = "cuda")]
fn cuda(mut c: turbospark_cuda::Cuda, args: &ModelArgs) -> Picked {
    c.set_precision(match args.precision {
        crate::args::PrecisionArg::Bf16 => turbospark_cuda::Precision::Bf16,
        crate::args::PrecisionArg::F32 => turbospark_cuda::Precision::F32,
    });
    Picked::Cuda(Box::new(c))
}

/// Evaluates `$body` with `$be` bound to the backend `--device` picks (a
/// concrete type per arm, so generic subcommands may ask more of it than
/// [`Backend`]; this is the one place that names each backend).
macro_rules! with_backend {
    ($args:expr, |$be:ident| $body:expr) => {{
        match crate::cmd::pick_device($args)? {
            crate::cmd::Picked::Cpu => {
                let $be = turbospark_cpu::Cpu;
                $body
            }
            #[cfg(feature = "cuda")]
            crate::cmd::Picked::Cuda(cuda) => {
                let $be = *cuda;
                $body
            }
        }
    }};
}
pub(crate) use with_backend;

/// Loads the model in `args` on the picked device and evaluates `$body`
/// with `$engine: Engine<_>` of that backend (subcommands are generic over
/// the backend).
macro_rules! with_engine {
    ($args:expr, |$engine:ident| $body:expr) => {
        crate::cmd::with_backend!($args, |be| {
            let $engine = crate::cmd::load_engine(be, $args)?;
            $body
        })
    };
}
pub(crate) use with_engine;

/// `--threads`: sizes rayon's global pool. Call before anything runs on it.
pub fn init_threads(args: &ModelArgs) {
    if let Some(n) = args.threads {
        // More threads than cores make every parallel kernel wait on the
        // scheduler (2 cores, --threads 1000: 1 tok/s against 500): allowed,
        // as llama.cpp allows it, but said.
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        if n > cores {
            eprintln!(
                "warning: --threads {n} is more than the {cores} cores here, which usually slows every step"
            );
        }
        // Fails only if a pool already exists, which cannot happen this early.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global();
    }
}

/// `--kv-cache-dtype`: `None` for auto (the backend's default for the
/// model).
pub fn kv_dtype(args: &ModelArgs) -> Option<KvDtype> {
    match args.kv_cache_dtype {
        KvDtypeArg::Auto => None,
        KvDtypeArg::F32 => Some(KvDtype::F32),
        KvDtypeArg::Bf16 => Some(KvDtype::Bf16),
    }
}

/// `--quant` and `--no-mmap` as load options.
pub fn load_options(args: &ModelArgs) -> LoadOptions {
    LoadOptions {
        quant: args.quant.map(|q| match q {
            QuantArg::Int8 => Quant::Int8,
            QuantArg::Int4 => Quant::Int4,
        }),
        quant_group: args.quant_group,
        no_mmap: args.no_mmap,
    }
}

/// Loads the model for any subcommand that runs one, with a progress bar.
pub fn load_engine<B: Backend + 'static>(be: B, args: &ModelArgs) -> Result<Engine<B>> {
    init_threads(args);
    let dir = args.dir();
    let name = dir.display().to_string();
    let bar = LoadBar::new(&name);
    let opts = load_options(args);
    let mut engine = Engine::load_with(be, &dir, opts, &|done, total| bar.update(done, total))?;
    bar.finish();
    engine.kv_override = kv_dtype(args);
    Ok(engine)
}

/// The context to allocate: `--context`, else the model's own limit capped
/// at 8192 (the KV cache is allocated up front).
pub fn context_len<B: Backend + 'static>(args: &ModelArgs, engine: &Engine<B>) -> Result<usize> {
    context_or(args, engine, 8192)
}

/// `--context`, or the model's positions capped at `default`. A context
/// past the positions the model was made for (`ModelSpec::context_limit`:
/// max_position_embeddings, or its RoPE scaling's reach) is refused: its
/// logits there are not the model's.
pub fn context_or<B: Backend + 'static>(
    args: &ModelArgs,
    engine: &Engine<B>,
    default: usize,
) -> Result<usize> {
    let max = engine.model.spec().context_limit();
    match args.context {
        Some(c) if c > max => anyhow::bail!(
            "--context {c} is longer than the model's {max} positions \
             (max_position_embeddings and RoPE scaling)"
        ),
        Some(c) => Ok(c),
        None => Ok(max.min(default)),
    }
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
