//! Gemma 2 and Gemma 3 (text): the shared decoder in Gemma's sandwich
//! layout (input, post-attention, pre-feed-forward and post-feed-forward
//! RMSNorms, each `x · (1 + w)`), embeddings scaled by √hidden, a GeGLU
//! (gelu-tanh) MLP, `query_pre_attn_scalar` as the attention scale, tied
//! embeddings. Gemma 2 adds attention and final logit soft-caps; Gemma 3 adds
//! q/k norms and a separate RoPE base for its sliding layers. All of it is
//! in the [`ModelSpec`]; this file only names the norms.

use turbospark_backend::Backend;
use turbospark_format::ModelSpec;

use crate::error::Result;
use crate::layers::decoder::{Decoder, Ffn, NormNames};
use crate::layers::mlp::GatedMlp;
use crate::loader::Loader;

const SANDWICH: NormNames = NormNames {
    attn: "input_layernorm",
    post_attn: Some("post_attention_layernorm"),
    ffn: "pre_feedforward_layernorm",
    post_ffn: Some("post_feedforward_layernorm"),
};

pub fn load<B: Backend>(l: &Loader<B>, spec: ModelSpec) -> Result<Decoder<B>> {
    let s = spec.clone();
    Decoder::load(l, spec, &SANDWICH, "mlp", |_, prefix| {
        Ok(Ffn::Dense(GatedMlp::load(l, prefix, &s)?))
    })
}
