//! `turbospark bench`: prefill and decode speed, on a model directory or on
//! random weights of a real model's shapes made in memory (`--synthetic`).
//! Prefill runs `--prompt-len` pseudo-random tokens as one prompt; decode
//! then generates `--gen-len` tokens one at a time, the way `run` does:
//! greedily (on a GPU: replayed decode graphs, the argmax chosen on the
//! device), or sampled with `--temperature` and the top-k / top-p / min-p
//! filters (on a GPU: from summaries of the logits where they settle the
//! draw). `--warmup` untimed runs of a prompt of the same length come first
//! (default one).
//!
//! Decode at batch 1 is bound by memory bandwidth, so the report sets the
//! bytes one decoded token reads (active weights plus the KV rows attention
//! reads, averaged over the run) times tok/s against a copy bandwidth
//! measured at start, before the weights are loaded: `ceiling_fraction`.

mod device;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use serde_json::json;
use turbospark_backend::{Backend, KvDtype};
use turbospark_engine::Engine;
use turbospark_format::{AttnSpan, ModelSpec};
use turbospark_models::Session;
use turbospark_models::sampler::{Sampler, SamplerConfig};
use turbospark_text::GenerationConfig;

pub use device::DeviceStats;
use device::proc_status_bytes;

use super::synth::SyntheticModel;
use super::{init_threads, kv_dtype, load_engine, load_options, with_backend};
use crate::args::{BenchArgs, ModelArgs, QuantArg};
use crate::progress::LoadBar;

/// Synthetic weights are the same for every run (speed does not depend on
/// their values).
const SYNTHETIC_SEED: u64 = 0;

pub fn main(a: BenchArgs) -> Result<()> {
    with_backend!(&a.model, |be| bench(be, &a))
}

fn bench<B: Backend + DeviceStats + 'static>(be: B, a: &BenchArgs) -> Result<()> {
    init_threads(&a.model);
    let synthetic = match a.synthetic {
        Some(preset) => Some(SyntheticModel::new(preset, a.layers, SYNTHETIC_SEED)?),
        None => None,
    };
    match &synthetic {
        Some(m) => fits_context(a, &m.spec)?,
        None => fits_context(a, &turbospark_models::read_spec(&a.model.dir())?)?,
    }
    // Before loading: the copy buffers must not compete with the weights
    // for memory, and are freed before they arrive.
    let copy_bandwidth = be.copy_bandwidth()?;
    let (engine, model_name) = match &synthetic {
        Some(m) => (load_synthetic(be, m, &a.model)?, m.label()),
        None => (
            load_engine(be, &a.model)?,
            a.model.dir().display().to_string(),
        ),
    };
    let mut peak_gpu = engine.be.device_memory_used()?;
    let mut sample_gpu = |be: &B| -> Result<()> {
        if let Some(now) = be.device_memory_used()? {
            peak_gpu = Some(peak_gpu.map_or(now, |p| p.max(now)));
        }
        Ok(())
    };

    let spec = engine.model.spec();
    let vocab = spec.vocab_size as u64;
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % vocab) as u32
    };
    let prompt: Vec<u32> = (0..a.prompt_len.max(1)).map(|_| next()).collect();
    // The warmup's prompt differs from the timed one (same length): MoE
    // prefill sizes its per-expert work by how the tokens route, so a
    // repeated prompt would find exactly its own shapes already prepared.
    let sampling = SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        ..SamplerConfig::default()
    };
    // The next token as `run` chooses it: greedy where the logits are (on a
    // GPU only its id comes back), else sampled (`Session::feed_sample`).
    let greedy = sampling.is_plain_greedy();
    let mut sampler = Sampler::new(sampling.clone());
    // No penalties here, so the sampler needs no history.
    let choose =
        |session: &mut Session<'_, B>, fed: &[u32], sampler: &mut Sampler| -> Result<u32> {
            Ok(if greedy {
                session.feed_argmax(fed)?
            } else {
                session.feed_sample(fed, sampler, &[])?
            })
        };
    // `steps` decode steps after `token`: greedy ones one step ahead of
    // the host, as `run` takes them (Session::decode_greedy).
    let decode = |session: &mut Session<'_, B>,
                  mut token: u32,
                  steps: usize,
                  sampler: &mut Sampler|
     -> Result<()> {
        if greedy {
            session.decode_greedy(token, steps, |_| true)?;
        } else {
            for _ in 0..steps {
                token = choose(session, &[token], sampler)?;
            }
        }
        Ok(())
    };
    for _ in 0..a.warmup {
        let other: Vec<u32> = (0..prompt.len()).map(|_| next()).collect();
        let mut warm = engine.session(prompt.len() + 3)?;
        let token = choose(&mut warm, &other, &mut sampler)?;
        decode(&mut warm, token, 2, &mut sampler)?;
    }
    let mut session = engine.session(prompt.len() + a.gen_len + 1)?;
    let t0 = Instant::now();
    let token = choose(&mut session, &prompt, &mut sampler)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    sample_gpu(&engine.be)?;
    let t1 = Instant::now();
    decode(&mut session, token, a.gen_len, &mut sampler)?;
    let decode_s = t1.elapsed().as_secs_f64();
    sample_gpu(&engine.be)?;
    let recorded = session.decode_recorded();
    let census = session
        .recorded_step()
        .and_then(|g| engine.be.graph_census(g));
    drop(session);

    let prefill = prompt.len() as f64 / prefill_s.max(1e-9);
    let decode = a.gen_len as f64 / decode_s.max(1e-9);
    let weight_bytes = engine.model.decode_bytes();
    let kv_dtype = engine.kv_dtype();
    let kv_bytes = mean_kv_read_bytes(spec, kv_dtype, prompt.len(), a.gen_len);
    let bytes_per_token = weight_bytes + kv_bytes;
    let decode_bandwidth = bytes_per_token as f64 * decode;
    let ceiling = decode_bandwidth / copy_bandwidth;
    let threads = rayon::current_num_threads();
    let (rss, peak_rss) = (proc_status_bytes("VmRSS:"), proc_status_bytes("VmHWM:"));
    let quant = a.model.quant.map(|q| match q {
        QuantArg::Int8 => "int8",
        QuantArg::Int4 => "int4",
    });
    if a.json {
        println!(
            "{}",
            json!({"model": model_name, "device": engine.be.name(), "decode_graph": recorded,
                "decode_graph_nodes": census,
                "device_name": engine.be.describe(), "threads": threads, "quant": quant,
                "quant_group": quant.map(|_| a.model.quant_group),
                "kv_dtype": kv_dtype.name(),
                "layers": spec.num_layers, "prompt_len": prompt.len(), "gen_len": a.gen_len,
                "warmup": a.warmup, "sampling": (!greedy).then_some(&sampling),
                "prefill_tok_s": prefill, "decode_tok_s": decode,
                "weight_bytes_per_token": weight_bytes, "kv_bytes_per_token": kv_bytes,
                "bytes_per_token": bytes_per_token, "decode_gb_s": decode_bandwidth / 1e9,
                "copy_gb_s": copy_bandwidth / 1e9, "ceiling_fraction": ceiling,
                "weight_bytes": engine.model.weight_bytes(&engine.be),
                "peak_gpu_bytes": peak_gpu, "rss_bytes": rss, "peak_rss_bytes": peak_rss})
        );
        return Ok(());
    }
    let size = |b: u64| match b as f64 {
        x if x >= 1e9 => format!("{:.3} GB", x / 1e9),
        x => format!("{:.2} MB", x / 1e6),
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "model   {model_name}{}",
        quant.map_or(String::new(), |q| format!(
            " (--quant {q} --quant-group {})",
            a.model.quant_group
        ))
    );
    println!("device  {} ({})", engine.be.name(), engine.be.describe());
    println!("prefill {prefill:>9.1} tok/s  ({} tokens)", prompt.len());
    let how = if greedy {
        "greedy".to_string()
    } else {
        format!(
            "sampled: temperature {}, top-k {}, top-p {}, min-p {}",
            a.temperature, a.top_k, a.top_p, a.min_p
        )
    };
    println!("decode  {decode:>9.1} tok/s  ({} tokens, {how})", a.gen_len);
    println!(
        "read per decoded token {} (weights {} + KV {}, {})",
        size(bytes_per_token),
        size(weight_bytes),
        size(kv_bytes),
        kv_dtype.name()
    );
    println!(
        "decode {decode:.1} tok/s = {:.1} GB/s = {:.1}% of the measured copy bandwidth {:.1} GB/s",
        decode_bandwidth / 1e9,
        100.0 * ceiling,
        copy_bandwidth / 1e9
    );
    if let Some(c) = census {
        println!(
            "decode step recorded: {} kernels, {} programmatic edges of {}",
            c.kernels, c.programmatic_edges, c.edges
        );
    }
    if let Some(p) = peak_gpu {
        println!("peak GPU memory {:.2} GiB (device-wide, in use)", gib(p));
    }
    println!("peak resident memory {:.2} GiB", gib(peak_rss));
    Ok(())
}

/// The synthetic model's tensors, made one at a time as the loader asks
/// for them, onto `be`. There is no tokenizer or template: bench feeds ids.
fn load_synthetic<B: Backend + 'static>(
    be: B,
    m: &SyntheticModel,
    args: &ModelArgs,
) -> Result<Engine<B>> {
    let bar = LoadBar::new(&m.label());
    let model = turbospark_models::model::load_model_from(
        &be,
        m,
        m.spec.clone(),
        load_options(args),
        &|done, total| bar.update(done, total),
    )?;
    bar.finish();
    Ok(Engine {
        be,
        model,
        tokenizer: None,
        template: None,
        gen_config: GenerationConfig::default(),
        dir: PathBuf::from(m.label()),
        kv_override: kv_dtype(args),
    })
}

/// Refuses, before any weight is loaded, a run longer than the positions
/// the model was made for (`ModelSpec::context_limit`), as `run` refuses a
/// context past them.
fn fits_context(a: &BenchArgs, spec: &ModelSpec) -> Result<()> {
    let (needed, limit) = (a.prompt_len.max(1) + a.gen_len, spec.context_limit());
    if needed > limit {
        anyhow::bail!(
            "--prompt-len {} + --gen-len {} = {needed} positions, but the model has {limit} \
             (max_position_embeddings and RoPE scaling)",
            a.prompt_len,
            a.gen_len,
        );
    }
    Ok(())
}

/// KV bytes one decode step reads with `context` positions filled (its
/// own token included): each layer reads K and V rows of `dtype` for every
/// position its attention sees, all of them or the last `window`.
fn kv_read_bytes(spec: &ModelSpec, dtype: KvDtype, context: usize) -> u64 {
    let rows: u64 = spec
        .layer_spans
        .iter()
        .map(|span| match *span {
            AttnSpan::Full => context,
            AttnSpan::Sliding { window } => context.min(window),
        } as u64)
        .sum();
    rows * spec.kv_dim() as u64 * 2 * dtype.bytes() as u64
}

/// [`kv_read_bytes`] averaged over the decode steps after a prompt of
/// `prompt` tokens (the first step's when there are none).
fn mean_kv_read_bytes(spec: &ModelSpec, dtype: KvDtype, prompt: usize, steps: usize) -> u64 {
    let total: u64 = (1..=steps.max(1))
        .map(|i| kv_read_bytes(spec, dtype, prompt + i))
        .sum();
    total / steps.max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::synth::Preset;

    #[test]
    fn kv_reads_grow_on_full_layers_and_stop_at_the_window_on_sliding_ones() {
        // gpt-oss-20b: 24 layers alternating window 128 and full, 8 KV heads of 64.
        let spec = SyntheticModel::new(Preset::GptOss20b, None, 0)
            .unwrap()
            .spec;
        let row = 512 * 2 * 4;
        let f32 = KvDtype::F32;
        assert_eq!(kv_read_bytes(&spec, f32, 100), 24 * 100 * row);
        assert_eq!(
            kv_read_bytes(&spec, f32, 1000),
            (12 * 1000 + 12 * 128) * row
        );
        // A bf16 store reads half.
        assert_eq!(kv_read_bytes(&spec, KvDtype::Bf16, 100), 24 * 100 * row / 2);
        // Steps at contexts 11, 12, 13: mean 12.
        assert_eq!(mean_kv_read_bytes(&spec, f32, 10, 3), 24 * 12 * row);
    }
}
