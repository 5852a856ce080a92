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
}

impl Arch {
    pub const SUPPORTED: &'static str =
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
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
    pub max_positions: usize,
    pub tie_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2, `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (`attention_bias` on Llama).
    pub o_bias: bool,
    /// Biases on gate/up/down (`mlp_bias` on Llama).
    pub mlp_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    pub activation: Activation,
    pub rope: RopeSpec,
    /// One entry per layer.
    pub layer_spans: Vec<AttnSpan>,
    /// The dtype the checkpoint says it was saved in.
    pub dtype: DType,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl ModelSpec {
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
        let i = self.intermediate_size as u64;
        let mut layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
        if self.qkv_bias {
            layer += q + 2 * kv;
        }
        if self.o_bias {
            layer += h;
        }
        if self.mlp_bias {
            layer += 2 * i + h;
        }
        if self.qk_norm {
            layer += 2 * self.head_dim as u64;
        }
        let emb = self.vocab_size as u64 * h;
        let head = if self.tie_embeddings { 0 } else { emb };
        emb + head + h + layer * self.num_layers as u64
    }
}
