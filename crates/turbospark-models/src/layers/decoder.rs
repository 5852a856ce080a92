//! The pre-norm decoder stack shared by every family: embedding (Gemma
//! scales it), layers `h = x + post(attn(rmsnorm(x))); x = h +
//! post(ffn(rmsnorm(h)))` where the `post` norms exist only in Gemma's
//! sandwich layout (`crate::layers::residual` owns that wiring), the final
//! RMSNorm, the LM head and Gemma 2's final soft-cap. Families decide how
//! the pieces are named and loaded (dense or MoE feed-forward, which norms
//! exist); the forward pass is written once, here. Sliding layers use the local RoPE table when the family has one.

use turbospark_backend::{Backend, RopeTable};
use turbospark_format::{AttnSpan, DType, ModelSpec};

use crate::error::Result;
use crate::families::CausalLm;
use crate::kv_cache::KvCache;
use crate::layers::attention::Attention;
use crate::layers::mlp::GatedMlp;
use crate::layers::moe::MoeBlock;
use crate::layers::residual::BlockNorms;
use crate::loader::Loader;
use crate::rope::rope_table;

/// A layer's feed-forward half.
pub enum Ffn<B: Backend> {
    Dense(GatedMlp<B>),
    Moe(MoeBlock<B>),
}

impl<B: Backend> Ffn<B> {
    fn forward(&self, be: &B, x: &mut B::Tensor, norms: &BlockNorms<'_, B>) {
        match self {
            Ffn::Dense(m) => m.forward(be, x, norms),
            Ffn::Moe(m) => m.forward(be, x, norms),
        }
    }
}

/// A family's names for the per-layer norms under `model.layers.N`.
pub struct NormNames {
    pub attn: &'static str,
    pub post_attn: Option<&'static str>,
    pub ffn: &'static str,
    pub post_ffn: Option<&'static str>,
}

/// Llama's: `input_layernorm` before attention, `post_attention_layernorm`
/// before the feed-forward, nothing after either.
pub const PRE_NORMS: NormNames = NormNames {
    attn: "input_layernorm",
    post_attn: None,
    ffn: "post_attention_layernorm",
    post_ffn: None,
};

pub struct DecoderLayer<B: Backend> {
    attn_norm: B::Weight,
    attn: Attention<B>,
    post_attn_norm: Option<B::Weight>,
    ffn_norm: B::Weight,
    ffn: Ffn<B>,
    post_ffn_norm: Option<B::Weight>,
    /// Index into the decoder's RoPE tables.
    rope: usize,
}

pub struct Decoder<B: Backend> {
    spec: ModelSpec,
    embed: B::Weight,
    layers: Vec<DecoderLayer<B>>,
    norm: B::Weight,
    /// `None` when tied to the embedding (a tied head is a quantized copy
    /// of it under `--quant`: `Loader::tied_head`).
    lm_head: Option<B::Weight>,
    /// The global table, then the local one when the family has it.
    ropes: Vec<RopeTable>,
    /// √hidden rounded to the checkpoint dtype, as Gemma computes it.
    embed_scale: Option<f32>,
    bytes: u64,
    decode_bytes: u64,
}

impl<B: Backend> Decoder<B> {
    /// Loads the parts every family names the same way
    /// (`model.embed_tokens`, `model.layers.N.self_attn`, the norms in
    /// `norms`, `model.norm`, `lm_head`); `ffn(i, prefix)` loads layer i's
    /// feed-forward block from `model.layers.N.{ffn_name}`.
    pub fn load(
        l: &Loader<B>,
        spec: ModelSpec,
        norms: &NormNames,
        ffn_name: &str,
        ffn: impl Fn(usize, &str) -> Result<Ffn<B>>,
    ) -> Result<Self> {
        let (v, h, off) = (spec.vocab_size, spec.hidden_size, spec.norm_offset);
        let embed = l.tensor("model.embed_tokens.weight", &[v, h])?;
        let norm = |p: &str, name: &str| l.norm(&format!("{p}.{name}.weight"), h, off);
        let optional = |p: &str, name: Option<&str>| name.map(|n| norm(p, n)).transpose();
        let layers = (0..spec.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let span = spec.layer_spans[i];
                Ok(DecoderLayer {
                    attn_norm: norm(&p, norms.attn)?,
                    attn: Attention::load(l, &format!("{p}.self_attn"), &spec, span)?,
                    post_attn_norm: optional(&p, norms.post_attn)?,
                    ffn_norm: norm(&p, norms.ffn)?,
                    ffn: ffn(i, &format!("{p}.{ffn_name}"))?,
                    post_ffn_norm: optional(&p, norms.post_ffn)?,
                    rope: match span {
                        AttnSpan::Sliding { .. } if spec.rope_local.is_some() => 1,
                        _ => 0,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = l.norm("model.norm.weight", h, off)?;
        // Some tied checkpoints still carry lm_head.weight; the tie wins, as
        // in transformers.
        let lm_head = if spec.tie_embeddings {
            l.tied_head("model.embed_tokens.weight", [v, h])?
        } else {
            Some(l.matrix("lm_head.weight", [v, h])?)
        };
        let mut ropes = vec![rope_table(&spec.rope, spec.head_dim)];
        ropes.extend(
            spec.rope_local
                .as_ref()
                .map(|r| rope_table(r, spec.head_dim)),
        );
        let embed_scale = spec.embed_scale.map(|s| round_to(s, spec.dtype));
        let bytes = l.device_bytes();
        // With a head of its own, a token reads only its embedding row.
        let gathered = if lm_head.is_some() {
            l.be.weight_bytes(&embed) as u64
        } else {
            0
        };
        let idle: u64 = layers
            .iter()
            .map(|layer| match &layer.ffn {
                Ffn::Moe(m) => m.idle_expert_bytes(l.be),
                Ffn::Dense(_) => 0,
            })
            .sum();
        Ok(Decoder {
            spec,
            embed,
            layers,
            norm,
            lm_head,
            ropes,
            embed_scale,
            bytes,
            decode_bytes: bytes - gathered - idle,
        })
    }
}

/// `v` rounded to `dtype` (Gemma's embedding normalizer is a tensor of the
/// activation dtype).
fn round_to(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::F32 | DType::U8 => v,
    }
}

impl<B: Backend> CausalLm<B> for Decoder<B> {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn forward_batch(
        &self,
        be: &B,
        batch: &B::Batch,
        n: usize,
        cache: &mut KvCache<B>,
        all_logits: bool,
    ) -> Result<B::Tensor> {
        let spec = &self.spec;
        // Checks the room (the caller reserved these positions already).
        cache.reserve(n)?;
        let h = spec.hidden_size;
        let mut x = be.empty(n, h);
        be.embed(&self.embed, batch, &mut x);
        if let Some(s) = self.embed_scale {
            be.scale(&mut x, s);
        }
        let eps = spec.norm_eps;
        for (i, layer) in self.layers.iter().enumerate() {
            let rope = &self.ropes[layer.rope];
            let attn = BlockNorms {
                pre: &layer.attn_norm,
                post: layer.post_attn_norm.as_ref(),
                eps,
            };
            let kv = cache.layer_mut(i);
            layer.attn.forward(be, &mut x, &attn, batch, kv, rope);
            let ffn = BlockNorms {
                pre: &layer.ffn_norm,
                post: layer.post_ffn_norm.as_ref(),
                eps,
            };
            layer.ffn.forward(be, &mut x, &ffn);
        }
        cache.advance(n);
        // One row is its own last row (no copy in a decode step).
        let last = if all_logits || n == 1 {
            x
        } else {
            be.row(&x, n - 1)
        };
        let rows = be.shape(&last).0;
        let mut logits = be.empty(rows, spec.vocab_size);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        // The final norm and the LM head, as one operation.
        be.rms_norm_linears(
            &last,
            &self.norm,
            eps,
            &[(head, None)],
            &mut [&mut logits],
            None,
        );
        if let Some(cap) = spec.final_softcap {
            be.softcap(&mut logits, cap);
        }
        Ok(logits)
    }

    fn weight_bytes(&self, _be: &B) -> u64 {
        self.bytes
    }

    fn decode_bytes(&self) -> u64 {
        self.decode_bytes
    }
}
