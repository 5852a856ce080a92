//! `turbospark inspect`: architecture, parameter count, stored dtypes and
//! the memory a run needs, without loading weights.

use anyhow::Result;
use turbospark_format::{AttnSpan, Checkpoint};
use turbospark_models::read_spec;

use crate::args::InspectArgs;

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
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
    println!("vocabulary      {}", spec.vocab_size);
    println!("context         {}", spec.max_positions);
    println!(
        "rope            theta {} {:?}",
        spec.rope.theta, spec.rope.scaling
    );
    println!("tied embeddings {}", spec.tie_embeddings);
    println!(
        "parameters      {:.3} B (from config.json)",
        spec.parameter_count() as f64 / 1e9
    );
    let stored: Vec<String> = ckpt
        .dtype_counts()
        .iter()
        .map(|(d, n)| format!("{} {:.3} B", d.name(), *n as f64 / 1e9))
        .collect();
    println!("stored          {}", stored.join(", "));
    let weights = ckpt.total_bytes() as f64;
    // f32 K and V for every layer that keeps the whole context.
    let kv_per_token = (2 * spec.kv_dim() * 4 * (spec.num_layers - sliding)) as f64;
    let ctx = spec.max_positions.min(8192) as f64;
    println!("weights memory  {}", gib(weights));
    println!(
        "KV cache        {} per 1k tokens; {} at {} tokens",
        gib(kv_per_token * 1024.0),
        gib(kv_per_token * ctx),
        ctx
    );
    Ok(())
}
