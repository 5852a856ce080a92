//! config.json → [`ModelSpec`].
//!
//! Reads both spellings transformers writes (4.x: `rope_theta`, `rope_scaling`,
//! `torch_dtype`; 5.x: `rope_parameters`, `dtype`) and applies each family's
//! defaults exactly as its transformers config class does. A value TurboSpark
//! does not understand is an error naming the field; so is a field that is not
//! read but would change the arithmetic (anything about rope, norms, biases,
//! windows, scaling or soft-caps), so that no checkpoint runs silently wrong.
//! This module must not touch weights.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{FormatError, Result};
use crate::spec::{Activation, Arch, AttnSpan, DType, ExpertAct, ModelSpec, MoeSpec, Routing};

/// A JSON object that remembers which keys were read.
pub(crate) struct Fields<'a> {
    prefix: &'a str,
    map: &'a Map<String, Value>,
    pub(crate) read: RefCell<BTreeSet<String>>,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(prefix: &'a str, map: &'a Map<String, Value>) -> Self {
        Fields {
            prefix,
            map,
            read: RefCell::new(BTreeSet::new()),
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// The value of `key`, treating JSON `null` as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.read.borrow_mut().insert(key.to_string());
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn err(&self, key: &str, what: impl Into<String>) -> FormatError {
        FormatError::config(self.path(key), what)
    }

    pub(crate) fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                self.err(key, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?
            .ok_or_else(|| self.err(key, "required but missing"))
    }

    pub(crate) fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a number, found {v}"))),
        }
    }

    pub(crate) fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    pub(crate) fn str_opt(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }

    /// Fails on keys that were never read and look like they change the math.
    fn reject_unread_math(&self) -> Result<()> {
        const MATH_WORDS: [&str; 10] = [
            "rope", "norm", "bias", "window", "scal", "softcap", "act", "sink", "expert", "partial",
        ];
        let read = self.read.borrow();
        for (key, value) in self.map {
            if read.contains(key) || value.is_null() || value == &Value::Bool(false) {
                continue;
            }
            if MATH_WORDS.iter().any(|w| key.contains(w)) {
                return Err(self.err(key, "not understood by TurboSpark for this architecture"));
            }
        }
        Ok(())
    }
}

/// Reads `DIR/config.json`.
pub fn load_config(dir: &Path) -> Result<ModelSpec> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FormatError::Missing { path: path.clone() },
        _ => FormatError::Io {
            path: path.clone(),
            what: e.to_string(),
        },
    })?;
    parse_config(&text).map_err(|e| match e {
        FormatError::Json { what, .. } => FormatError::Json { path, what },
        other => other,
    })
}

/// Parses the text of a config.json.
pub fn parse_config(text: &str) -> Result<ModelSpec> {
    let value: Value = serde_json::from_str(text).map_err(|e| FormatError::Json {
        path: "config.json".into(),
        what: e.to_string(),
    })?;
    let map = value
        .as_object()
        .ok_or_else(|| FormatError::config("(top level)", "expected a JSON object"))?;
    let f = Fields::new("", map);
    let arch = read_arch(&f)?;
    let spec = read_spec(&f, arch)?;
    f.reject_unread_math()?;
    Ok(spec)
}

fn read_arch(f: &Fields) -> Result<Arch> {
    let from_name = |name: &str| match name {
        "LlamaForCausalLM" | "llama" => Some(Arch::Llama),
        "MistralForCausalLM" | "mistral" => Some(Arch::Mistral),
        "Qwen2ForCausalLM" | "qwen2" => Some(Arch::Qwen2),
        "Qwen3ForCausalLM" | "qwen3" => Some(Arch::Qwen3),
        "GptOssForCausalLM" | "gpt_oss" => Some(Arch::GptOss),
        _ => None,
    };
    if let Some(list) = f.get("architectures") {
        let first = list
            .as_array()
            .and_then(|a| a.first())
            .and_then(|v| v.as_str())
            .ok_or_else(|| f.err("architectures", "expected a list of class names"))?;
        f.get("model_type");
        return from_name(first)
            .ok_or_else(|| FormatError::Unsupported(first.to_string(), Arch::SUPPORTED.into()));
    }
    let model_type = f.str_opt("model_type")?.ok_or_else(|| {
        f.err(
            "architectures",
            "neither `architectures` nor `model_type` is set",
        )
    })?;
    from_name(model_type)
        .ok_or_else(|| FormatError::Unsupported(model_type.to_string(), Arch::SUPPORTED.into()))
}

fn read_spec(f: &Fields, arch: Arch) -> Result<ModelSpec> {
    let hidden_size = f.usize("hidden_size")?;
    let num_heads = f.usize("num_attention_heads")?;
    let num_layers = f.usize("num_hidden_layers")?;
    let num_kv_heads = f.usize_opt("num_key_value_heads")?.unwrap_or(num_heads);
    if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
        return Err(f.err(
            "num_key_value_heads",
            format!("{num_kv_heads} does not divide num_attention_heads = {num_heads}"),
        ));
    }
    let head_dim = match f.usize_opt("head_dim")? {
        Some(d) => d,
        None if hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => {
            return Err(f.err(
                "head_dim",
                "missing, and hidden_size is not a multiple of num_attention_heads",
            ));
        }
    };
    if head_dim % 2 != 0 {
        return Err(f.err("head_dim", format!("{head_dim} is odd; RoPE needs pairs")));
    }

    let activation = match f.str_opt("hidden_act")?.unwrap_or("silu") {
        "silu" | "swish" => Activation::Silu,
        other => return Err(f.err("hidden_act", format!("`{other}` is not supported"))),
    };

    // Biases: Qwen2 always has q/k/v biases and never an o bias; Llama, Mistral
    // and Qwen3 put all four behind `attention_bias`.
    // gpt-oss defaults to all four.
    let attention_bias = f
        .bool_opt("attention_bias")?
        .unwrap_or(arch == Arch::GptOss);
    let (qkv_bias, o_bias) = match arch {
        Arch::Qwen2 => (true, false),
        Arch::Mistral => (false, false),
        Arch::Llama | Arch::Qwen3 | Arch::GptOss => (attention_bias, attention_bias),
    };
    let mlp_bias = match arch {
        Arch::Llama => f.bool_opt("mlp_bias")?.unwrap_or(false),
        _ => false,
    };

    let layer_spans = read_layer_spans(f, arch, num_layers)?;
    let rope = crate::rope_config::read_rope(f, arch)?;
    let moe = read_moe(f, arch)?;
    read_quantization(f, arch)?;
    let dtype = read_dtype(f)?;
    let (bos_token_id, eos_token_ids) = read_special_tokens(f)?;

    // Ignored on purpose: they do not change inference arithmetic.
    for key in [
        "pretraining_tp",
        "attention_dropout",
        "initializer_range",
        "use_cache",
        "router_aux_loss_coef",
        "output_router_logits",
        "initial_context_length",
    ] {
        f.get(key);
    }

    let spec = ModelSpec {
        arch,
        vocab_size: f.usize("vocab_size")?,
        hidden_size,
        intermediate_size: f.usize("intermediate_size")?,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        norm_eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-6) as f32,
        max_positions: f.usize_opt("max_position_embeddings")?.unwrap_or(4096),
        // Every family here defaults to untied in its transformers config class.
        tie_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias,
        o_bias,
        mlp_bias,
        qk_norm: arch == Arch::Qwen3,
        activation,
        rope,
        layer_spans,
        attn_sinks: arch == Arch::GptOss,
        moe,
        dtype,
        bos_token_id,
        eos_token_ids,
    };
    Ok(spec)
}

/// Per-layer attention span: `layer_types` when present (5.x writes it),
/// otherwise each family's 4.x rule.
fn read_layer_spans(f: &Fields, arch: Arch, num_layers: usize) -> Result<Vec<AttnSpan>> {
    let window = match arch {
        // GptOssConfig's default window.
        Arch::GptOss => Some(f.usize_opt("sliding_window")?.unwrap_or(128)),
        _ => f.usize_opt("sliding_window")?,
    };
    let use_sliding = match arch {
        Arch::Qwen2 | Arch::Qwen3 => f.bool_opt("use_sliding_window")?.unwrap_or(false),
        Arch::Mistral => window.is_some(),
        Arch::Llama | Arch::GptOss => false,
    };
    let max_window_layers = match arch {
        Arch::Qwen2 | Arch::Qwen3 => f.usize_opt("max_window_layers")?.unwrap_or(num_layers),
        _ => 0,
    };
    let sliding = |w: Option<usize>| -> Result<AttnSpan> {
        match w {
            Some(0) | None => {
                Err(f.err("sliding_window", "a sliding layer needs a positive window"))
            }
            Some(window) => Ok(AttnSpan::Sliding { window }),
        }
    };
    if let Some(types) = f.get("layer_types") {
        let types = types
            .as_array()
            .ok_or_else(|| f.err("layer_types", "expected a list"))?;
        if types.len() != num_layers {
            return Err(f.err(
                "layer_types",
                format!(
                    "has {} entries but num_hidden_layers = {num_layers}",
                    types.len()
                ),
            ));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(AttnSpan::Full),
                Some("sliding_attention") => sliding(window),
                _ => Err(f.err("layer_types", format!("unknown layer type {t}"))),
            })
            .collect();
    }
    (0..num_layers)
        .map(|i| {
            // GptOssConfig's default pattern: even layers slide.
            if arch == Arch::GptOss && i % 2 == 0 {
                return sliding(window);
            }
            // transformers' Qwen2 rule: layers at or past max_window_layers slide.
            if use_sliding && i >= max_window_layers.min(num_layers) {
                sliding(window)
            } else {
                Ok(AttnSpan::Full)
            }
        })
        .collect()
}

/// The MoE block of the families that have one.
fn read_moe(f: &Fields, arch: Arch) -> Result<Option<MoeSpec>> {
    match arch {
        Arch::GptOss => {
            let num_experts = f.usize("num_local_experts")?;
            // Released configs carry both spellings of top-k.
            let top_k = match f.usize_opt("num_experts_per_tok")? {
                Some(k) => k,
                None => f.usize_opt("experts_per_token")?.unwrap_or(4),
            };
            f.get("experts_per_token");
            if top_k == 0 || top_k > num_experts {
                return Err(f.err(
                    "num_experts_per_tok",
                    format!("{top_k} is not between 1 and num_local_experts = {num_experts}"),
                ));
            }
            Ok(Some(MoeSpec {
                num_experts,
                top_k,
                width: f.usize("intermediate_size")?,
                routing: Routing::TopKSoftmax,
                activation: ExpertAct::ClampedSwiGlu {
                    alpha: f.f64_opt("swiglu_alpha")?.unwrap_or(1.702) as f32,
                    limit: f.f64_opt("swiglu_limit")?.unwrap_or(7.0) as f32,
                },
                biases: true,
            }))
        }
        Arch::Llama | Arch::Mistral | Arch::Qwen2 | Arch::Qwen3 => Ok(None),
    }
}

/// `quantization_config`: only the MXFP4 experts of gpt-oss are understood
/// (the weights themselves say which tensors are packed).
fn read_quantization(f: &Fields, arch: Arch) -> Result<()> {
    let Some(q) = f.get("quantization_config") else {
        return Ok(());
    };
    let method = q
        .get("quant_method")
        .and_then(|m| m.as_str())
        .unwrap_or("(none)");
    match (arch, method) {
        (Arch::GptOss, "mxfp4") => Ok(()),
        _ => Err(f.err(
            "quantization_config",
            format!(
                "quant_method `{method}` is not supported for {}",
                arch.name()
            ),
        )),
    }
}

fn read_dtype(f: &Fields) -> Result<DType> {
    let (key, name) = match f.str_opt("dtype")? {
        Some(d) => ("dtype", d),
        None => (
            "torch_dtype",
            f.str_opt("torch_dtype")?.unwrap_or("float32"),
        ),
    };
    match name {
        "float32" => Ok(DType::F32),
        "float16" => Ok(DType::F16),
        "bfloat16" => Ok(DType::BF16),
        other => Err(f.err(key, format!("`{other}` is not a supported dtype"))),
    }
}

fn read_special_tokens(f: &Fields) -> Result<(Option<u32>, Vec<u32>)> {
    let bos = f.usize_opt("bos_token_id")?.map(|x| x as u32);
    let eos = token_list(f.get("eos_token_id"))
        .ok_or_else(|| f.err("eos_token_id", "expected an integer or a list of integers"))?;
    f.get("pad_token_id");
    Ok((bos, eos))
}

/// An integer or a list of integers (generation_config.json uses both too).
pub fn token_list(value: Option<&Value>) -> Option<Vec<u32>> {
    match value {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]),
        Some(Value::Array(items)) => items.iter().map(|v| v.as_u64().map(|x| x as u32)).collect(),
        Some(_) => None,
    }
}
