//! Qwen3-MoE: the shared pre-norm decoder with Qwen3's q/k norms and, at
//! `model.layers.N.mlp`, either a mixture of experts (router `mlp.gate`,
//! softmax over all experts, top-k, renormalised when `norm_topk_prob`) or,
//! for `mlp_only_layers` / off-step layers, a dense MLP.

use turbospark_backend::Backend;
use turbospark_format::ModelSpec;

use crate::error::Result;
use crate::layers::decoder::{Decoder, Ffn, PRE_NORMS};
use crate::layers::mlp::GatedMlp;
use crate::layers::moe::{ExpertNames, MoeBlock};
use crate::loader::Loader;

const NAMES: ExpertNames = ExpertNames {
    router: "gate",
    experts: "experts",
    fused_input_major: false,
    per_expert: Some(["gate_proj", "up_proj", "down_proj"]),
};

pub fn load<B: Backend>(l: &Loader<B>, spec: ModelSpec) -> Result<Decoder<B>> {
    let s = spec.clone();
    Decoder::load(l, spec, &PRE_NORMS, "mlp", |i, prefix| {
        let sparse = s.moe.as_ref().is_some_and(|m| m.sparse_layers[i]);
        Ok(if sparse {
            Ffn::Moe(MoeBlock::load(l, prefix, &s, &NAMES)?)
        } else {
            Ffn::Dense(GatedMlp::load(l, prefix, &s)?)
        })
    })
}
