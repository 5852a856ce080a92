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
        "Gemma2ForCausalLM" | "gemma2" => Some(Arch::Gemma2),
        "Gemma3ForCausalLM" | "gemma3_text" => Some(Arch::Gemma3),
        "Qwen3MoeForCausalLM" | "qwen3_moe" => Some(Arch::Qwen3Moe),
        "MixtralForCausalLM" | "mixtral" => Some(Arch::Mixtral),
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

/// Per-family defaults, as each transformers config class sets them.
struct Defaults {
    head_dim_from_hidden: bool,
    tie: bool,
    window: Option<usize>,
    norm_eps: f64,
}

fn defaults(arch: Arch) -> Defaults {
    let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
    Defaults {
        // Gemma's classes default head_dim to 256, not hidden/heads.
        head_dim_from_hidden: !gemma,
        tie: gemma,
        window: match arch {
            Arch::GptOss => Some(128),
            Arch::Gemma2 | Arch::Gemma3 => Some(4096),
            _ => None,
        },
        norm_eps: match arch {
            Arch::GptOss => 1e-5,
            _ => 1e-6,
        },
    }
}

fn read_spec(f: &Fields, arch: Arch) -> Result<ModelSpec> {
    let d = defaults(arch);
    let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
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
        None if !d.head_dim_from_hidden => 256,
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

    // Gemma names its activation `hidden_activation` (with `hidden_act` as an
    // older alias); gpt-oss says `silu` but its experts use their own.
    let act_key = if f.get("hidden_activation").is_some() {
        "hidden_activation"
    } else {
        "hidden_act"
    };
    let activation =
        match f
            .str_opt(act_key)?
            .unwrap_or(if gemma { "gelu_pytorch_tanh" } else { "silu" })
        {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_tanh" => Activation::GeluTanh,
            other => return Err(f.err(act_key, format!("`{other}` is not supported"))),
        };
    f.get("hidden_act");

    // Biases: Qwen2 always has q/k/v biases and never an o bias; gpt-oss
    // defaults to all four; the rest put all four behind `attention_bias`.
    let attention_bias = f
        .bool_opt("attention_bias")?
        .unwrap_or(arch == Arch::GptOss);
    let (qkv_bias, o_bias) = match arch {
        Arch::Qwen2 => (true, false),
        Arch::Mistral | Arch::Mixtral => (false, false),
        _ => (attention_bias, attention_bias),
    };
    let mlp_bias = match arch {
        Arch::Llama => f.bool_opt("mlp_bias")?.unwrap_or(false),
        _ => false,
    };

    let layer_spans = read_layer_spans(f, arch, num_layers, d.window)?;
    let (rope, rope_local) = crate::rope_config::read_rope(f, arch)?;
    let moe = read_moe(f, arch, num_layers)?;
    read_quantization(f, arch)?;
    let dtype = read_dtype(f, arch)?;
    let (bos_token_id, eos_token_ids) = read_special_tokens(f)?;
    let positive = |key: &str| -> Result<Option<f32>> {
        Ok(f.f64_opt(key)?.filter(|&c| c > 0.0).map(|c| c as f32))
    };
    let (attn_softcap, final_softcap) = match arch {
        Arch::Gemma2 | Arch::Gemma3 => (
            positive("attn_logit_softcapping")?,
            positive("final_logit_softcapping")?,
        ),
        _ => (None, None),
    };
    let attn_scale = match arch {
        Arch::Gemma2 | Arch::Gemma3 => {
            (f.f64_opt("query_pre_attn_scalar")?.unwrap_or(256.0) as f32).powf(-0.5)
        }
        _ => (head_dim as f32).powf(-0.5),
    };

    // Ignored on purpose: they do not change inference arithmetic.
    for key in [
        "pretraining_tp",
        "attention_dropout",
        "initializer_range",
        "use_cache",
        "router_aux_loss_coef",
        "output_router_logits",
        "initial_context_length",
        "router_jitter_noise",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "use_bidirectional_attention",
    ] {
        f.get(key);
    }

    Ok(ModelSpec {
        arch,
        vocab_size: f.usize("vocab_size")?,
        hidden_size,
        intermediate_size: f.usize_opt("intermediate_size")?.unwrap_or(0),
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        norm_eps: f.f64_opt("rms_norm_eps")?.unwrap_or(d.norm_eps) as f32,
        norm_offset: if gemma { 1.0 } else { 0.0 },
        max_positions: f.usize_opt("max_position_embeddings")?.unwrap_or(4096),
        tie_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(d.tie),
        embed_scale: gemma.then_some((hidden_size as f32).sqrt()),
        qkv_bias,
        o_bias,
        mlp_bias,
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3),
        activation,
        rope,
        rope_local,
        layer_spans,
        attn_sinks: arch == Arch::GptOss,
        attn_scale,
        attn_softcap,
        final_softcap,
        moe,
        dtype,
        bos_token_id,
        eos_token_ids,
    })
}

/// Per-layer attention span: `layer_types` when present (5.x writes it),
/// otherwise each family's 4.x rule.
fn read_layer_spans(
    f: &Fields,
    arch: Arch,
    num_layers: usize,
    default_window: Option<usize>,
) -> Result<Vec<AttnSpan>> {
    let window = f.usize_opt("sliding_window")?.or(default_window);
    let use_sliding = match arch {
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => {
            f.bool_opt("use_sliding_window")?.unwrap_or(false)
        }
        Arch::Mistral | Arch::Mixtral => window.is_some(),
        _ => false,
    };
    let max_window_layers = match arch {
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => {
            f.usize_opt("max_window_layers")?.unwrap_or(num_layers)
        }
        _ => 0,
    };
    // Gemma 3's 4.x spelling of its pattern: every Nth layer is global.
    let pattern = f.usize_opt("sliding_window_pattern")?.unwrap_or(6).max(1);
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
            let slides = match arch {
                // GptOssConfig and Gemma2Config: even layers slide.
                Arch::GptOss | Arch::Gemma2 => i % 2 == 0,
                Arch::Gemma3 => (i + 1) % pattern != 0,
                // transformers' Qwen2 rule: layers at or past max_window_layers slide.
                _ => use_sliding && i >= max_window_layers.min(num_layers),
            };
            if slides {
                sliding(window)
            } else {
                Ok(AttnSpan::Full)
            }
        })
        .collect()
}

/// The MoE block of the families that have one.
fn read_moe(f: &Fields, arch: Arch, num_layers: usize) -> Result<Option<MoeSpec>> {
    let experts_key = match arch {
        Arch::GptOss | Arch::Mixtral => "num_local_experts",
        Arch::Qwen3Moe => "num_experts",
        _ => return Ok(None),
    };
    let num_experts = f.usize(experts_key)?;
    // gpt-oss's released config carries both spellings of top-k.
    let top_k = match f.usize_opt("num_experts_per_tok")? {
        Some(k) => k,
        None => f.usize_opt("experts_per_token")?.unwrap_or(2),
    };
    f.get("experts_per_token");
    if top_k == 0 || top_k > num_experts {
        return Err(f.err(
            "num_experts_per_tok",
            format!("{top_k} is not between 1 and {experts_key} = {num_experts}"),
        ));
    }
    let (width, routing, activation, biases) = match arch {
        Arch::GptOss => (
            f.usize("intermediate_size")?,
            Routing::TopKSoftmax,
            ExpertAct::ClampedSwiGlu {
                alpha: f.f64_opt("swiglu_alpha")?.unwrap_or(1.702) as f32,
                limit: f.f64_opt("swiglu_limit")?.unwrap_or(7.0) as f32,
            },
            true,
        ),
        // Mathematically top-k-then-softmax; transformers 5 computes it as a
        // softmax over all experts renormalised over the top k, and so do we.
        Arch::Mixtral => (
            f.usize("intermediate_size")?,
            Routing::SoftmaxTopK { renormalize: true },
            ExpertAct::SwiGlu,
            false,
        ),
        _ => (
            f.usize("moe_intermediate_size")?,
            Routing::SoftmaxTopK {
                renormalize: f.bool_opt("norm_topk_prob")?.unwrap_or(false),
            },
            ExpertAct::SwiGlu,
            false,
        ),
    };
    // Qwen3-MoE's rule: a layer is sparse unless listed in mlp_only_layers,
    // and only every `decoder_sparse_step`-th layer.
    let (only_dense, step) = match arch {
        Arch::Qwen3Moe => {
            let list = match f.get("mlp_only_layers") {
                None => Vec::new(),
                Some(v) => v
                    .as_array()
                    .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect())
                    .ok_or_else(|| f.err("mlp_only_layers", "expected a list of layer indices"))?,
            };
            (
                list,
                f.usize_opt("decoder_sparse_step")?.unwrap_or(1).max(1),
            )
        }
        _ => (Vec::new(), 1),
    };
    let sparse_layers = (0..num_layers)
        .map(|i| !only_dense.contains(&i) && (i + 1) % step == 0)
        .collect();
    Ok(Some(MoeSpec {
        num_experts,
        top_k,
        width,
        routing,
        activation,
        biases,
        sparse_layers,
    }))
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

fn read_dtype(f: &Fields, arch: Arch) -> Result<DType> {
    // The released gpt-oss config.json has no dtype; its weights are bf16.
    let fallback = if arch == Arch::GptOss {
        "bfloat16"
    } else {
        "float32"
    };
    let (key, name) = match f.str_opt("dtype")? {
        Some(d) => ("dtype", d),
        None => ("torch_dtype", f.str_opt("torch_dtype")?.unwrap_or(fallback)),
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
