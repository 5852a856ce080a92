//! `turbospark synth`: a checkpoint with random weights and the exact
//! shapes and config.json of a real model, for benchmarks and load tests
//! where the real weights cannot be downloaded. Weights are bf16 drawn from a
//! seeded xorshift generator (uniform, std 0.02; norms 1.0), which is fast
//! enough to write a 1B model in seconds. Speed does not depend on values.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use clap::ValueEnum;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

use crate::args::SynthArgs;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Preset {
    #[value(name = "llama-3.2-1b")]
    Llama32_1b,
    #[value(name = "llama-3.1-8b")]
    Llama31_8b,
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
}

/// config.json of the preset, in the 4.x spelling real downloads use.
fn config(p: Preset) -> serde_json::Value {
    let llama3_rope = json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    match p {
        Preset::Llama32_1b => json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "rope_scaling": llama3_rope, "tie_word_embeddings": true,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001}),
        Preset::Llama31_8b => json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": llama3_rope, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}),
        Preset::Qwen3_0_6b => json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "bos_token_id": 151643, "eos_token_id": 151645}),
    }
}

/// Seeded bf16 noise; each tensor gets its own stream so tensors can be
/// filled in parallel and the result does not depend on thread count.
fn noise(n: usize, seed: u64, fill_one: bool) -> Vec<u8> {
    if fill_one {
        return half::bf16::ONE.to_le_bytes().repeat(n);
    }
    let mut out = vec![0u8; n * 2];
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(chunk, bytes)| {
            let mut s = seed ^ (chunk as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for b in bytes.chunks_exact_mut(2) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                // Uniform in [-a, a] with a = 0.02·√3 has standard deviation 0.02.
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                let v = (u * 2.0 - 1.0) * 0.034_641;
                b.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        });
    out
}

pub fn main(a: SynthArgs) -> Result<()> {
    let mut cfg = config(a.preset);
    if let Some(n) = a.layers {
        cfg["num_hidden_layers"] = json!(n);
    }
    let spec = turbospark_format::parse_config(&cfg.to_string())?;
    let (h, i, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
    let (q, kv, hd) = (spec.q_dim(), spec.kv_dim(), spec.head_dim);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, h]),
        ("model.norm.weight".into(), vec![h]),
    ];
    if !spec.tie_embeddings {
        shapes.push(("lm_head.weight".into(), vec![v, h]));
    }
    for l in 0..spec.num_layers {
        let p = format!("model.layers.{l}");
        let mut add = |n: &str, s: Vec<usize>| shapes.push((format!("{p}.{n}"), s));
        add("input_layernorm.weight", vec![h]);
        add("post_attention_layernorm.weight", vec![h]);
        add("self_attn.q_proj.weight", vec![q, h]);
        add("self_attn.k_proj.weight", vec![kv, h]);
        add("self_attn.v_proj.weight", vec![kv, h]);
        add("self_attn.o_proj.weight", vec![h, q]);
        if spec.qk_norm {
            add("self_attn.q_norm.weight", vec![hd]);
            add("self_attn.k_norm.weight", vec![hd]);
        }
        add("mlp.gate_proj.weight", vec![i, h]);
        add("mlp.up_proj.weight", vec![i, h]);
        add("mlp.down_proj.weight", vec![h, i]);
    }
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(k, (name, s))| {
            noise(
                s.iter().product(),
                a.seed ^ (k as u64) << 32,
                name.contains("norm"),
            )
        })
        .collect();
    let views: HashMap<String, TensorView> = shapes
        .iter()
        .zip(&data)
        .map(|((name, s), d)| Ok((name.clone(), TensorView::new(Dtype::BF16, s.clone(), d)?)))
        .collect::<Result<_>>()?;
    write(&a.out, &cfg, views)?;
    eprintln!(
        "wrote {} ({:.3} B parameters, bf16) to {}",
        cfg["architectures"][0],
        spec.parameter_count() as f64 / 1e9,
        a.out.display()
    );
    Ok(())
}

fn write(dir: &Path, cfg: &serde_json::Value, views: HashMap<String, TensorView>) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(cfg)?)?;
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}
