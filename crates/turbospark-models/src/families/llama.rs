//! The Llama family and its close relatives: Llama 2/3/3.1/3.2, Mistral
//! (dense, optional sliding window), Qwen2/2.5 (q/k/v biases) and Qwen3
//! (per-head q/k RMSNorm, free head_dim). Their differences are all in the
//! [`ModelSpec`]; the layers are the shared pre-norm decoder with a dense
//! gated MLP at `model.layers.N.mlp`.

use turbospark_backend::Backend;
use turbospark_format::ModelSpec;

use crate::error::Result;
use crate::layers::decoder::{Decoder, Ffn, PRE_NORMS};
use crate::layers::mlp::GatedMlp;
use crate::loader::Loader;

pub fn load<B: Backend>(l: &Loader<B>, spec: ModelSpec) -> Result<Decoder<B>> {
    let mlp_spec = spec.clone();
    Decoder::load(l, spec, &PRE_NORMS, "mlp", |_, prefix| {
        Ok(Ffn::Dense(GatedMlp::load(l, prefix, &mlp_spec)?))
    })
}
