//! gpt-oss (20b, 120b): the shared pre-norm decoder with attention sinks,
//! biases on q/k/v/o (added before RoPE, by the attention block's order),
//! YaRN RoPE, alternating sliding/full layers (from `layer_types`), and a
//! mixture-of-experts MLP at `model.layers.N.mlp` with a biased router
//! (`mlp.router`) and experts either in MXFP4 as released
//! (`experts.gate_up_proj_blocks`/`_scales`) or in the plain float layout
//! that `save_pretrained` writes for a dequantized model.

use turbospark_backend::Backend;
use turbospark_format::ModelSpec;

use crate::error::Result;
use crate::layers::decoder::{Decoder, Ffn, PRE_NORMS};
use crate::layers::moe::{ExpertNames, MoeBlock};
use crate::loader::Loader;

const NAMES: ExpertNames = ExpertNames {
    router: "router",
    experts: "experts",
    fused_input_major: true,
    per_expert: None,
};

pub fn load<B: Backend>(l: &Loader<B>, spec: ModelSpec) -> Result<Decoder<B>> {
    let moe_spec = spec.clone();
    Decoder::load(l, spec, &PRE_NORMS, "mlp", |_, prefix| {
        Ok(Ffn::Moe(MoeBlock::load(l, prefix, &moe_spec, &NAMES)?))
    })
}
