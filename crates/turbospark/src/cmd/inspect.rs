//! `turbospark inspect`: architecture, parameter count, stored dtypes and
//! the memory a run needs, without loading weights.

use anyhow::Result;
use turbospark_format::{AttnSpan, Checkpoint};
use turbospark_models::read_spec;

use crate::args::InspectArgs;

/// Bytes in the largest binary unit that keeps the number ≥ 1.
fn bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", units[u])
}

/// A count with a K/M/B suffix.
fn count(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.3} B", n / 1e9),
        n if n >= 1e6 => format!("{:.2} M", n / 1e6),
        n if n >= 1e3 => format!("{:.1} K", n / 1e3),
        n => format!("{n}"),
    }
}

pub fn main(a: InspectArgs) -> Result<()> {
    let spec = read_spec(&a.dir)?;
    let ckpt = Checkpoint::open(&a.dir)?;
    let sliding = spec
        .layer_spans
        .iter()
        .filter(|s| matches!(s, AttnSpan::Sliding { .. }))
        .count();
    println!("architecture    {}", spec.arch.name());
    println!(
        "layers          {} ({} sliding, {} full)",
        spec.num_layers,
        sliding,
        spec.num_layers - sliding
    );
    println!("hidden          {}", spec.hidden_size);
    println!("intermediate    {}", spec.intermediate_size);
    println!(
        "attention       {} query heads, {} KV heads, head_dim {}",
        spec.num_heads, spec.num_kv_heads, spec.head_dim
    );
    if let Some(m) = &spec.moe {
        let packed = ckpt.names().any(|n| n.ends_with("_blocks"));
        println!(
            "experts         {} (top-{}), width {}{}",
            m.num_experts,
            m.top_k,
            m.width,
            if packed { ", MXFP4" } else { "" }
        );
    }
    println!("vocabulary      {}", spec.vocab_size);
    // The positions `run` allows (max_position_embeddings or RoPE
    // scaling's reach), as `run` and `perplexity` check them.
    println!("context         {}", spec.context_limit());
    println!(
        "rope            theta {}, {}",
        spec.rope.theta, spec.rope.scaling
    );
    println!("tied embeddings {}", spec.tie_embeddings);
    println!(
        "parameters      {} (from config.json)",
        count(spec.parameter_count() as f64)
    );
    let stored: Vec<String> = ckpt
        .dtype_counts()
        .iter()
        .map(|(d, n)| format!("{} {}", d.name(), count(*n as f64)))
        .collect();
    println!("stored          {}", stored.join(", "));
    let weights = ckpt.total_bytes() as f64;
    // f32 K and V (the default but for bf16 models on the GPU) for every
    // layer that keeps the whole context; a bf16 cache is half.
    let kv_per_token = (2 * spec.kv_dim() * 4 * (spec.num_layers - sliding)) as f64;
    let ctx = spec.context_limit().min(8192) as f64;
    println!("weights memory  {}", bytes(weights));
    // Sliding layers keep a ring of window + prefill-chunk rows whatever the
    // context (kv_cache.rs), so they do not grow with it.
    let rings = if sliding > 0 {
        format!(" (full layers; the {sliding} sliding layers keep fixed rings)")
    } else {
        String::new()
    };
    println!(
        "KV cache        {} per 1k tokens; {} at {} tokens{rings}; in f32 (a bf16 cache: half)",
        bytes(kv_per_token * 1024.0),
        bytes(kv_per_token * ctx),
        ctx
    );
    Ok(())
}
