//! Random weights with a real model's tensor names and shapes, made one
//! tensor at a time when the loader (or `synth`'s writer) fetches it. Float
//! weights are bf16 drawn from a seeded xorshift generator (uniform, std
//! 0.02; norms 1.0), filled in parallel; gpt-oss experts are random MXFP4
//! codes with scales near 2^-7, as released. Every tensor has its own seed
//! (its index in the plan), so a tensor's bytes do not depend on the order
//! of fetches or on the thread count. Speed does not depend on values.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Result, bail};
use rayon::prelude::*;
use serde_json::json;
use turbospark_format::checkpoint::{SourceTensor, TensorSource};
use turbospark_format::{DType, FormatError, ModelSpec};

use super::presets::{Preset, config};

/// A preset's config and its tensors, none of them made yet.
pub struct SyntheticModel {
    pub preset: Preset,
    /// config.json as `synth` writes it (layers overridden when asked).
    pub config: serde_json::Value,
    pub spec: ModelSpec,
    tensors: Vec<Planned>,
    index: HashMap<String, usize>,
    seed: u64,
}

impl SyntheticModel {
    /// `preset`'s shapes, keeping only `layers` layers when given (same
    /// layer shapes, fewer of them).
    pub fn new(preset: Preset, layers: Option<usize>, seed: u64) -> Result<Self> {
        let mut config = config(preset);
        if let Some(n) = layers {
            if n == 0 {
                bail!("--layers must be at least 1");
            }
            config["num_hidden_layers"] = json!(n);
        }
        let spec = turbospark_format::parse_config(&config.to_string())?;
        let tensors = plan(&spec);
        let index = tensors
            .iter()
            .enumerate()
            .map(|(k, t)| (t.name.clone(), k))
            .collect();
        Ok(SyntheticModel {
            preset,
            config,
            spec,
            tensors,
            index,
            seed,
        })
    }

    /// Tensor names in plan order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// "synthetic gpt-oss-20b" (with the layer count when overridden).
    pub fn label(&self) -> String {
        let full = config(self.preset)["num_hidden_layers"].as_u64();
        match self.spec.num_layers as u64 {
            n if Some(n) == full => format!("synthetic {}", self.preset.name()),
            1 => format!("synthetic {} (1 layer)", self.preset.name()),
            n => format!("synthetic {} ({n} layers)", self.preset.name()),
        }
    }
}

impl TensorSource for SyntheticModel {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes() as u64).sum()
    }

    fn fetch(&self, name: &str) -> turbospark_format::Result<SourceTensor<'_>> {
        let &k = self
            .index
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor {
                name: name.to_string(),
                dir: PathBuf::from(format!("<synthetic {}>", self.preset.name())),
            })?;
        let t = &self.tensors[k];
        Ok(SourceTensor {
            name: Cow::Borrowed(&t.name),
            dtype: t.fill.dtype(),
            shape: Cow::Borrowed(&t.shape),
            bytes: Cow::Owned(fill(t.numel(), self.seed ^ (k as u64) << 32, t.fill)),
            map: None,
        })
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

impl Fill {
    fn dtype(self) -> DType {
        match self {
            Fill::Noise | Fill::Ones => DType::BF16,
            Fill::Codes | Fill::Scales => DType::U8,
        }
    }
}

struct Planned {
    name: String,
    shape: Vec<usize>,
    fill: Fill,
}

impl Planned {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn bytes(&self) -> usize {
        self.numel() * self.fill.dtype().size()
    }
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
/// can be made in any order. One xorshift step makes 8 bytes: 8 codes or
/// scales, or 4 bf16 values (12 random bits each, looked up in a table of
/// 4096 evenly spaced values).
fn fill(n: usize, seed: u64, how: Fill) -> Vec<u8> {
    let mut out = vec![0u8; n * how.dtype().size()];
    match how {
        Fill::Ones => return half::bf16::ONE.to_le_bytes().repeat(n),
        Fill::Noise => {
            // Uniform in [-a, a] with a = 0.02·√3 has standard deviation 0.02.
            let mut noise = [[0u8; 2]; 4096];
            for (k, v) in noise.iter_mut().enumerate() {
                let u = (k as f32 + 0.5) / 4096.0;
                *v = half::bf16::from_f32((u * 2.0 - 1.0) * 0.034_641).to_le_bytes();
            }
            random_words(&mut out, seed, |w, r| {
                for k in 0..4 {
                    let v = noise[(r >> (16 * k)) as usize & 0xFFF];
                    w[2 * k..2 * k + 2].copy_from_slice(&v);
                }
            });
        }
        Fill::Codes => random_words(&mut out, seed, |w, r| *w = r.to_le_bytes()),
        Fill::Scales => random_words(&mut out, seed, |w, r| {
            for (b, r) in w.iter_mut().zip(r.to_le_bytes()) {
                *b = 119 + r % 3;
            }
        }),
    }
    out
}

/// Fills `out` 8 bytes at a time with `put(word, xorshift step)`, in
/// parallel 64 KiB pieces. Each piece has its own seed, so the result does
/// not depend on the thread count.
fn random_words(out: &mut [u8], seed: u64, put: impl Fn(&mut [u8; 8], u64) + Sync) {
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(piece, bytes)| {
            let mut s = (seed ^ (piece as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)).max(1);
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s
            };
            let mut words = bytes.chunks_exact_mut(8);
            for w in &mut words {
                put(w.try_into().expect("8 bytes"), next());
            }
            let rest = words.into_remainder();
            if !rest.is_empty() {
                let mut w = [0u8; 8];
                put(&mut w, next());
                let n = rest.len();
                rest.copy_from_slice(&w[..n]);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_made_on_request_with_their_shapes_and_seeds() {
        let m = SyntheticModel::new(Preset::Qwen3_0_6b, Some(1), 7).unwrap();
        assert_eq!(m.spec.num_layers, 1);
        assert_eq!(m.label(), "synthetic qwen3-0.6b (1 layer)");
        let mut total = 0;
        for name in m.names() {
            let t = m.fetch(name).unwrap();
            assert_eq!(t.bytes.len(), t.view().numel() * t.dtype.size(), "{name}");
            total += t.bytes.len() as u64;
        }
        assert_eq!(total, m.total_bytes());
        assert!(m.contains("model.layers.0.self_attn.q_norm.weight"));
        assert!(!m.contains("model.layers.1.self_attn.q_norm.weight"));
        assert!(
            m.fetch("lm_head.weight").is_err(),
            "Qwen3-0.6B ties its head"
        );
        let shape = [2048, 1024];
        let q = m
            .fetch_shaped("model.layers.0.self_attn.q_proj.weight", &shape)
            .unwrap();
        let k = m
            .fetch_shaped("model.layers.0.self_attn.k_proj.weight", &[1024, 1024])
            .unwrap();
        // Made again, the same bytes; another tensor, other bytes.
        let again = m.fetch(&q.name).unwrap();
        assert_eq!(q.bytes, again.bytes);
        assert_ne!(q.bytes[..4096], k.bytes[..4096]);
        // Uniform noise of standard deviation 0.02 around 0.
        let v = q.view().to_f32();
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32).sqrt();
        assert!(
            mean.abs() < 1e-3 && (std - 0.02).abs() < 1e-3,
            "{mean} {std}"
        );
        let norm = m.fetch("model.norm.weight").unwrap().view().to_f32();
        assert!(norm.iter().all(|&x| x == 1.0));
    }

    #[test]
    fn mxfp4_experts_are_codes_and_scales_near_two_to_the_minus_7() {
        let m = SyntheticModel::new(Preset::GptOss20b, Some(1), 0).unwrap();
        let scales = m
            .fetch("model.layers.0.mlp.experts.down_proj_scales")
            .unwrap();
        assert_eq!(scales.dtype, DType::U8);
        assert_eq!(&*scales.shape, &[32, 2880, 90]);
        assert!(scales.bytes.iter().all(|s| (119..=121).contains(s)));
        let codes = m
            .fetch("model.layers.0.mlp.experts.down_proj_blocks")
            .unwrap();
        let zeros = codes.bytes.iter().filter(|&&b| b == 0).count();
        assert!(
            zeros < codes.bytes.len() / 128,
            "random bytes: {zeros} zeros"
        );
    }

    #[test]
    fn zero_layers_is_refused() {
        let err = SyntheticModel::new(Preset::Llama32_1b, Some(0), 0)
            .err()
            .unwrap();
        assert!(err.to_string().contains("--layers"), "{err}");
    }
}
