//! `turbospark synth`: a checkpoint with random weights and the exact
//! shapes, tensor names and config.json of a real model, for benchmarks and
//! load tests where the real weights cannot be downloaded. Float weights are
//! bf16 drawn from a seeded xorshift generator (uniform, std 0.02; norms
//! 1.0), fast enough to write gigabytes in seconds; gpt-oss experts are
//! random MXFP4 codes with scales near 2^-7, as released. Speed does not
//! depend on values.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use clap::ValueEnum;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;
use turbospark_format::ModelSpec;

use crate::args::SynthArgs;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Preset {
    #[value(name = "llama-3.2-1b")]
    Llama32_1b,
    #[value(name = "llama-3.1-8b")]
    Llama31_8b,
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
    #[value(name = "gpt-oss-20b")]
    GptOss20b,
    #[value(name = "gpt-oss-120b")]
    GptOss120b,
    #[value(name = "qwen3-30b-a3b")]
    Qwen3_30bA3b,
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
        Preset::GptOss20b | Preset::GptOss120b => {
            let (layers, experts) = match p {
                Preset::GptOss20b => (24, 32),
                _ => (36, 128),
            };
            // The released config.json, 4.x spelling.
            json!({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                "attention_bias": true, "experts_per_token": 4, "head_dim": 64,
                "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
                "intermediate_size": 2880, "max_position_embeddings": 131072,
                "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": layers,
                "num_key_value_heads": 8, "num_local_experts": experts, "rms_norm_eps": 1e-5,
                "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert":
                    ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                     "model.embed_tokens", "lm_head"]},
                "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                    "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
                "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
                "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 201088,
                "eos_token_id": 200002, "pad_token_id": 199999})
        }
        Preset::Qwen3_30bA3b => json!({"architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
            "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645}),
    }
}

/// How a tensor's bytes are made.
#[derive(Clone, Copy)]
enum Fill {
    /// bf16 noise, std 0.02.
    Noise,
    /// bf16 ones (norm weights).
    Ones,
    /// Random E2M1 code bytes.
    Codes,
    /// E8M0 scales around 2^-7 (119..=121), so weights stay small.
    Scales,
}

struct Planned {
    name: String,
    shape: Vec<usize>,
    fill: Fill,
}

/// Every tensor of the checkpoint, named as the real model names it.
fn plan(spec: &ModelSpec) -> Vec<Planned> {
    let (h, v) = (spec.hidden_size, spec.vocab_size);
    let (q, kv, hd) = (spec.q_dim(), spec.kv_dim(), spec.head_dim);
    let mut out = Vec::new();
    let mut add =
        |name: String, shape: Vec<usize>, fill: Fill| out.push(Planned { name, shape, fill });
    add("model.embed_tokens.weight".into(), vec![v, h], Fill::Noise);
    add("model.norm.weight".into(), vec![h], Fill::Ones);
    if !spec.tie_embeddings {
        add("lm_head.weight".into(), vec![v, h], Fill::Noise);
    }
    for l in 0..spec.num_layers {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![h], Fill::Ones);
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Fill::Ones,
        );
        for (n, rows, cols) in [
            ("q_proj", q, h),
            ("k_proj", kv, h),
            ("v_proj", kv, h),
            ("o_proj", h, q),
        ] {
            add(
                format!("{p}.self_attn.{n}.weight"),
                vec![rows, cols],
                Fill::Noise,
            );
            if (n != "o_proj" && spec.qkv_bias) || (n == "o_proj" && spec.o_bias) {
                add(format!("{p}.self_attn.{n}.bias"), vec![rows], Fill::Noise);
            }
        }
        if spec.qk_norm {
            add(format!("{p}.self_attn.q_norm.weight"), vec![hd], Fill::Ones);
            add(format!("{p}.self_attn.k_norm.weight"), vec![hd], Fill::Ones);
        }
        if spec.attn_sinks {
            add(
                format!("{p}.self_attn.sinks"),
                vec![spec.num_heads],
                Fill::Noise,
            );
        }
        match &spec.moe {
            Some(m) if m.biases => {
                // gpt-oss as released: MXFP4 experts, biased router.
                let (e, w) = (m.num_experts, m.width);
                add(format!("{p}.mlp.router.weight"), vec![e, h], Fill::Noise);
                add(format!("{p}.mlp.router.bias"), vec![e], Fill::Noise);
                let x = format!("{p}.mlp.experts");
                for (n, rows, cols) in [("gate_up_proj", 2 * w, h), ("down_proj", h, w)] {
                    add(
                        format!("{x}.{n}_blocks"),
                        vec![e, rows, cols / 32, 16],
                        Fill::Codes,
                    );
                    add(
                        format!("{x}.{n}_scales"),
                        vec![e, rows, cols / 32],
                        Fill::Scales,
                    );
                    add(format!("{x}.{n}_bias"), vec![e, rows], Fill::Noise);
                }
            }
            Some(m) => {
                // transformers 5's fused layout.
                let (e, w) = (m.num_experts, m.width);
                add(format!("{p}.mlp.gate.weight"), vec![e, h], Fill::Noise);
                add(
                    format!("{p}.mlp.experts.gate_up_proj"),
                    vec![e, 2 * w, h],
                    Fill::Noise,
                );
                add(
                    format!("{p}.mlp.experts.down_proj"),
                    vec![e, h, w],
                    Fill::Noise,
                );
            }
            None => {
                let i = spec.intermediate_size;
                add(format!("{p}.mlp.gate_proj.weight"), vec![i, h], Fill::Noise);
                add(format!("{p}.mlp.up_proj.weight"), vec![i, h], Fill::Noise);
                add(format!("{p}.mlp.down_proj.weight"), vec![h, i], Fill::Noise);
            }
        }
    }
    out
}

/// Seeded bytes for one tensor; each tensor gets its own stream so tensors
/// can be filled in parallel and the result does not depend on thread count.
fn fill(n: usize, seed: u64, how: Fill) -> Vec<u8> {
    let elem = match how {
        Fill::Noise | Fill::Ones => 2,
        Fill::Codes | Fill::Scales => 1,
    };
    if let Fill::Ones = how {
        return half::bf16::ONE.to_le_bytes().repeat(n);
    }
    let mut out = vec![0u8; n * elem];
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(chunk, bytes)| {
            let mut s = seed ^ (chunk as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for b in bytes.chunks_exact_mut(elem) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match how {
                    Fill::Noise => {
                        // Uniform in [-a, a] with a = 0.02·√3 has standard deviation 0.02.
                        let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                        let v = (u * 2.0 - 1.0) * 0.034_641;
                        b.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
                    }
                    Fill::Codes => b[0] = (s >> 32) as u8,
                    Fill::Scales => b[0] = 119 + (s >> 40) as u8 % 3,
                    Fill::Ones => unreachable!("handled above"),
                }
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
    let tensors = plan(&spec);
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(k, t)| fill(t.shape.iter().product(), a.seed ^ (k as u64) << 32, t.fill))
        .collect();
    let views: HashMap<String, TensorView> = tensors
        .iter()
        .zip(&data)
        .map(|(t, d)| {
            let dtype = match t.fill {
                Fill::Noise | Fill::Ones => Dtype::BF16,
                Fill::Codes | Fill::Scales => Dtype::U8,
            };
            Ok((t.name.clone(), TensorView::new(dtype, t.shape.clone(), d)?))
        })
        .collect::<Result<_>>()?;
    write(&a.out, &cfg, views)?;
    eprintln!(
        "wrote {} ({:.3} B parameters) to {}",
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
