//! Mixtral: the shared pre-norm decoder (optional sliding window) with a
//! mixture of experts in every layer: top-2 of 8, weights renormalised over
//! the selected experts, SwiGLU experts. 4.x checkpoints name it
//! `block_sparse_moe` with per-expert `w1` (gate), `w3` (up), `w2` (down);
//! transformers 5 writes `mlp` with fused `experts.gate_up_proj`.

use turbospark_backend::Backend;
use turbospark_format::ModelSpec;

use crate::error::Result;
use crate::layers::decoder::{Decoder, Ffn, PRE_NORMS};
use crate::layers::moe::{ExpertNames, MoeBlock};
use crate::loader::Loader;

const NAMES: ExpertNames = ExpertNames {
    router: "gate",
    experts: "experts",
    fused_input_major: false,
    per_expert: Some(["w1", "w3", "w2"]),
};

pub fn load<B: Backend>(l: &Loader<B>, spec: ModelSpec) -> Result<Decoder<B>> {
    let block = if l
        .ckpt
        .contains("model.layers.0.block_sparse_moe.gate.weight")
    {
        "block_sparse_moe"
    } else {
        "mlp"
    };
    let s = spec.clone();
    Decoder::load(l, spec, &PRE_NORMS, block, |_, prefix| {
        Ok(Ffn::Moe(MoeBlock::load(l, prefix, &s, &NAMES)?))
    })
}
