//! The real models `synth` and `bench --synthetic` imitate: each preset is
//! the model's released config.json (4.x spelling, as real downloads have it).

use clap::ValueEnum;
use serde_json::json;

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

impl Preset {
    /// The name on the command line, e.g. "gpt-oss-20b".
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }
}

/// config.json of the preset, in the 4.x spelling real downloads use.
pub fn config(p: Preset) -> serde_json::Value {
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
