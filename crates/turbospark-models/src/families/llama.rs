//! The Llama family and its close relatives, which share one forward pass:
//! Llama 2/3/3.1/3.2, Mistral (dense, optional sliding window), Qwen2/2.5
//! (q/k/v biases) and Qwen3 (per-head q/k RMSNorm, free head_dim). Their
//! differences are all spelled out in the [`ModelSpec`].
//!
//! Per layer: `h = x + attn(rmsnorm(x))`, `x = h + mlp(rmsnorm(h))`; then a
//! final RMSNorm and the LM head (the embedding matrix when tied).

use turbospark_backend::{Backend, RopeTable};
use turbospark_format::ModelSpec;

use crate::error::Result;
use crate::families::CausalLm;
use crate::kv_cache::KvCache;
use crate::layers::attention::Attention;
use crate::layers::mlp::GatedMlp;
use crate::loader::Loader;
use crate::rope::rope_table;

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    attn: Attention<B>,
    mlp_norm: B::Weight,
    mlp: GatedMlp<B>,
}

pub struct Llama<B: Backend> {
    spec: ModelSpec,
    embed: B::Weight,
    layers: Vec<Layer<B>>,
    norm: B::Weight,
    /// `None` when tied to the embedding.
    lm_head: Option<B::Weight>,
    rope: RopeTable,
    bytes: u64,
}

impl<B: Backend> Llama<B> {
    pub fn load(l: &Loader<B>, spec: ModelSpec) -> Result<Self> {
        let (v, h) = (spec.vocab_size, spec.hidden_size);
        let embed = l.tensor("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..spec.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Layer {
                    attn_norm: l.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
                    attn: Attention::load(
                        l,
                        &format!("{p}.self_attn"),
                        &spec,
                        spec.layer_spans[i],
                    )?,
                    mlp_norm: l.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                    mlp: GatedMlp::load(l, &format!("{p}.mlp"), &spec)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = l.tensor("model.norm.weight", &[h])?;
        // Some tied checkpoints still carry lm_head.weight; the tie wins, as
        // in transformers.
        let lm_head = l.tensor_if(!spec.tie_embeddings, "lm_head.weight", &[v, h])?;
        let rope = rope_table(&spec.rope, spec.head_dim);
        Ok(Llama {
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

impl<B: Backend> CausalLm<B> for Llama<B> {
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
            be.rms_norm(&x, &layer.mlp_norm, spec.norm_eps, &mut normed);
            let m = layer.mlp.forward(be, &normed);
            be.add(&mut x, &m);
        }
        cache.advance(n);
        let last = if all_logits { x } else { be.row(&x, n - 1) };
        let rows = be.shape(&last).0;
        let mut normed = be.tensor(rows, h);
        be.rms_norm(&last, &self.norm, spec.norm_eps, &mut normed);
        let mut logits = be.tensor(rows, spec.vocab_size);
        be.linear(
            &normed,
            self.lm_head.as_ref().unwrap_or(&self.embed),
            None,
            &mut logits,
        );
        Ok(logits)
    }

    fn weight_bytes(&self, _be: &B) -> u64 {
        self.bytes
    }
}
