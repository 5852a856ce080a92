//! The pre-norm decoder stack shared by every family whose layers are
//! `h = x + attn(rmsnorm(x)); x = h + ffn(rmsnorm(h))` (Llama, Mistral, Qwen2,
//! Qwen3, gpt-oss, and the MoE families): embedding, layers, final RMSNorm,
//! LM head. Families decide how the pieces are loaded (names, biases, dense
//! or MoE feed-forward); the forward pass is written once, here.

use turbospark_backend::{Backend, RopeTable};
use turbospark_format::ModelSpec;

use crate::error::Result;
use crate::families::CausalLm;
use crate::kv_cache::KvCache;
use crate::layers::attention::Attention;
use crate::layers::mlp::GatedMlp;
use crate::layers::moe::MoeBlock;
use crate::loader::Loader;
use crate::rope::rope_table;

/// A layer's feed-forward half.
pub enum Ffn<B: Backend> {
    Dense(GatedMlp<B>),
    Moe(MoeBlock<B>),
}

impl<B: Backend> Ffn<B> {
    fn forward(&self, be: &B, x: &B::Tensor) -> B::Tensor {
        match self {
            Ffn::Dense(m) => m.forward(be, x),
            Ffn::Moe(m) => m.forward(be, x),
        }
    }
}

pub struct DecoderLayer<B: Backend> {
    pub attn_norm: B::Weight,
    pub attn: Attention<B>,
    pub ffn_norm: B::Weight,
    pub ffn: Ffn<B>,
}

pub struct Decoder<B: Backend> {
    spec: ModelSpec,
    embed: B::Weight,
    layers: Vec<DecoderLayer<B>>,
    norm: B::Weight,
    /// `None` when tied to the embedding.
    lm_head: Option<B::Weight>,
    rope: RopeTable,
    bytes: u64,
}

impl<B: Backend> Decoder<B> {
    /// Loads the parts every such family names the same way
    /// (`model.embed_tokens`, `model.layers.N.input_layernorm`,
    /// `…post_attention_layernorm`, `…self_attn`, `model.norm`, `lm_head`);
    /// `ffn(i, prefix)` loads layer i's feed-forward block from `prefix`.
    pub fn load(
        l: &Loader<B>,
        spec: ModelSpec,
        ffn_name: &str,
        ffn: impl Fn(usize, &str) -> Result<Ffn<B>>,
    ) -> Result<Self> {
        let (v, h) = (spec.vocab_size, spec.hidden_size);
        let embed = l.tensor("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..spec.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(DecoderLayer {
                    attn_norm: l.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
                    attn: Attention::load(
                        l,
                        &format!("{p}.self_attn"),
                        &spec,
                        spec.layer_spans[i],
                    )?,
                    ffn_norm: l.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                    ffn: ffn(i, &format!("{p}.{ffn_name}"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = l.tensor("model.norm.weight", &[h])?;
        // Some tied checkpoints still carry lm_head.weight; the tie wins, as
        // in transformers.
        let lm_head = l.tensor_if(!spec.tie_embeddings, "lm_head.weight", &[v, h])?;
        let rope = rope_table(&spec.rope, spec.head_dim);
        Ok(Decoder {
            spec,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            bytes: l.device_bytes(),
        })
    }
}

impl<B: Backend> CausalLm<B> for Decoder<B> {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn forward(
        &self,
        be: &B,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        all_logits: bool,
    ) -> Result<B::Tensor> {
        let spec = &self.spec;
        let positions = cache.reserve(tokens.len())?;
        let n = tokens.len();
        let h = spec.hidden_size;
        let mut x = be.tensor(n, h);
        be.embed(&self.embed, tokens, &mut x);
        let mut normed = be.tensor(n, h);
        for (i, layer) in self.layers.iter().enumerate() {
            be.rms_norm(&x, &layer.attn_norm, spec.norm_eps, &mut normed);
            let a = layer
                .attn
                .forward(be, &normed, &positions, cache.layer_mut(i), &self.rope);
            be.add(&mut x, &a);
            be.rms_norm(&x, &layer.ffn_norm, spec.norm_eps, &mut normed);
            let m = layer.ffn.forward(be, &normed);
            be.add(&mut x, &m);
        }
        cache.advance(n);
        let last = if all_logits { x } else { be.row(&x, n - 1) };
        let rows = be.shape(&last).0;
        let mut normed = be.tensor(rows, h);
        be.rms_norm(&last, &self.norm, spec.norm_eps, &mut normed);
        let mut logits = be.tensor(rows, spec.vocab_size);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        be.linear(&normed, head, None, &mut logits);
        Ok(logits)
    }

    fn weight_bytes(&self, _be: &B) -> u64 {
        self.bytes
    }
}
