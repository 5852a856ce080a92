//! The typed architecture description every family reads.
//!
//! `ModelSpec` is the one place where the differences between checkpoints
//! (config spelling, family defaults, optional terms) have been resolved into
//! plain values. It owns no weights and knows nothing about backends.

/// The model families TurboSpark can run. One variant per forward-pass
/// definition in `turbospark-models::families`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    GptOss,
    Gemma2,
    Gemma3,
    Qwen3Moe,
    Mixtral,
}

impl Arch {
    pub const SUPPORTED: &'static str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, \
        Qwen3ForCausalLM, GptOssForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, \
        Qwen3MoeForCausalLM, MixtralForCausalLM";

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::GptOss => "gpt_oss",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3_text",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Mixtral => "mixtral",
        }
    }
}

/// Storage dtype of a tensor in a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    U8,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U8 => "u8",
        }
    }
}

/// How rotary frequencies are rescaled for long context.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: inv_freq[i] = theta^(-2i/d).
    None,
    /// Position interpolation: inv_freq / factor.
    Linear { factor: f64 },
    /// Llama 3.1's piecewise rescale of low frequencies.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_positions: f64,
    },
    /// YaRN: per-pair blend of interpolated and extrapolated frequencies
    /// with a linear ramp between the correction dims of `beta_fast` and
    /// `beta_slow`, and an attention factor on cos/sin.
    Yarn {
        factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        original_max_positions: f64,
        /// Round the correction range outward (transformers' default true;
        /// gpt-oss ships false).
        truncate: bool,
        /// Multiplies cos and sin; `0.1·ln(factor) + 1` when not given.
        attention_factor: f64,
    },
}

/// One line for `inspect`: the method, its factor, then its parameters.
impl std::fmt::Display for RopeScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RopeScaling::None => write!(f, "plain"),
            RopeScaling::Linear { factor } => write!(f, "linear x{factor}"),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_positions,
            } => write!(
                f,
                "llama3 x{factor} (original context {original_max_positions}, \
                 low/high frequency factors {low_freq_factor}/{high_freq_factor})"
            ),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original_max_positions,
                truncate,
                attention_factor,
            } => write!(
                f,
                "yarn x{factor} (original context {original_max_positions}, \
                 beta fast/slow {beta_fast}/{beta_slow}, attention factor {attention_factor:.4}{})",
                if *truncate { "" } else { ", not truncated" }
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// Which keys a layer's queries may see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnSpan {
    /// Every earlier position.
    Full,
    /// Only the last `window` positions, the query's own included.
    Sliding { window: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// `gelu_tanh(gate) * up` (Gemma's GeGLU, `gelu_pytorch_tanh`).
    GeluTanh,
}

/// How router logits become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Take the top-k logits, softmax over those k (gpt-oss, Mixtral).
    TopKSoftmax,
    /// Softmax over all experts, take the top k, and renormalise them to sum
    /// to one when `renormalize` (Qwen3-MoE's `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
}

/// The expert MLP's activation, which also fixes the gate/up row layout of
/// the fused gate_up weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertAct {
    /// Rows `[0, width)` are gate, `[width, 2·width)` up: `silu(gate) · up`.
    SwiGlu,
    /// gpt-oss: even rows gate, odd rows up; gate clamped to ≤ limit, up to
    /// [−limit, limit]; `(up + 1) · gate · sigmoid(alpha · gate)`.
    ClampedSwiGlu { alpha: f32, limit: f32 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpec {
    pub num_experts: usize,
    pub top_k: usize,
    /// Width of one expert's hidden layer.
    pub width: usize,
    pub routing: Routing,
    pub activation: ExpertAct,
    /// Router and expert biases (gpt-oss).
    pub biases: bool,
    /// Per layer: MoE (true) or the dense MLP (Qwen3-MoE's `mlp_only_layers`,
    /// `decoder_sparse_step`).
    pub sparse_layers: Vec<bool>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub norm_eps: f32,
    /// Added to every RMSNorm weight: Gemma's `x · (1 + w)` is 1.0.
    pub norm_offset: f32,
    pub max_positions: usize,
    pub tie_embeddings: bool,
    /// Gemma multiplies embeddings by √hidden.
    pub embed_scale: Option<f32>,
    /// Biases on the q, k and v projections (Qwen2, `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (`attention_bias` on Llama).
    pub o_bias: bool,
    /// Biases on gate/up/down (`mlp_bias` on Llama).
    pub mlp_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    pub activation: Activation,
    /// RoPE of full-attention layers (and of every layer when `rope_local`
    /// is `None`).
    pub rope: RopeSpec,
    /// RoPE of sliding layers when it differs (Gemma 3's local base).
    pub rope_local: Option<RopeSpec>,
    /// One entry per layer.
    pub layer_spans: Vec<AttnSpan>,
    /// A learned per-head logit that joins the softmax denominator (gpt-oss).
    pub attn_sinks: bool,
    /// Multiplies q·k: head_dim^-½, or Gemma's query_pre_attn_scalar^-½.
    pub attn_scale: f32,
    /// `cap · tanh(score / cap)` on attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// `cap · tanh(logit / cap)` on the output logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Mixture-of-experts MLP, when the family has one.
    pub moe: Option<MoeSpec>,
    /// The dtype the checkpoint says it was saved in.
    pub dtype: DType,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl ModelSpec {
    /// The longest context the model is made for: config.json's
    /// `max_position_embeddings`, or what its RoPE scaling reaches when that
    /// is more, as vLLM derives it. YaRN reaches factor × its original
    /// context (Qwen's recipe adds a factor 4 over 32,768 and leaves
    /// `max_position_embeddings` at 32,768); linear scaling stretches the
    /// positions given; Llama 3's `max_position_embeddings` already is the
    /// scaled context (3.2's factor 32 over 8,192 would overshoot it).
    pub fn context_limit(&self) -> usize {
        let scaled = match self.rope.scaling {
            RopeScaling::None | RopeScaling::Llama3 { .. } => 0.0,
            RopeScaling::Linear { factor } => factor * self.max_positions as f64,
            RopeScaling::Yarn {
                factor,
                original_max_positions,
                ..
            } => factor * original_max_positions,
        };
        self.max_positions.max(scaled as usize)
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    /// Parameters implied by the architecture (embedding counted once when tied).
    pub fn parameter_count(&self) -> u64 {
        let h = self.hidden_size as u64;
        let q = self.q_dim() as u64;
        let kv = self.kv_dim() as u64;
        let mut layer = h * q + 2 * h * kv + q * h + 2 * h;
        layer += match &self.moe {
            Some(m) => {
                let (e, w) = (m.num_experts as u64, m.width as u64);
                let biases = if m.biases { e * (2 * w + h) + e } else { 0 };
                h * e + e * 3 * h * w + biases
            }
            None => {
                let i = self.intermediate_size as u64;
                // (Qwen3-MoE's dense layers are counted as MoE here: an
                // estimate for `inspect`.)
                3 * h * i + if self.mlp_bias { 2 * i + h } else { 0 }
            }
        };
        if self.qkv_bias {
            layer += q + 2 * kv;
        }
        if self.o_bias {
            layer += h;
        }
        if self.qk_norm {
            layer += 2 * self.head_dim as u64;
        }
        if self.attn_sinks {
            layer += self.num_heads as u64;
        }
        let emb = self.vocab_size as u64 * h;
        let head = if self.tie_embeddings { 0 } else { emb };
        emb + head + h + layer * self.num_layers as u64
    }
}

#[cfg(test)]
mod tests {
    use crate::parse_config;

    /// A Llama-shaped config.json with `extra` fields.
    fn limit(extra: &str) -> usize {
        parse_config(&format!(
            r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "vocab_size": 256, "intermediate_size": 128, {extra}}}"#
        ))
        .unwrap()
        .context_limit()
    }

    #[test]
    fn context_limit_follows_vllm() {
        assert_eq!(limit(r#""max_position_embeddings": 2048"#), 2048);
        // Llama 3.2: factor 32 over 8,192 would be 262,144; the config's
        // 131,072 is the scaled context.
        assert_eq!(
            limit(
                r#""max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3",
                "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}"#
            ),
            131_072
        );
        // Qwen's YaRN recipe: factor 4 over 32,768, max_position_embeddings
        // left at 32,768.
        assert_eq!(
            limit(
                r#""max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn",
                "factor": 4.0, "original_max_position_embeddings": 32768}"#
            ),
            131_072
        );
        assert_eq!(
            limit(
                r#""max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear",
                "factor": 2.0}"#
            ),
            8192
        );
    }
}
