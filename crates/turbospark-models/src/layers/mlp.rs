//! The gated MLP: `down(act(gate(x)) * up(x))` with optional biases
//! (Llama's `mlp_bias`); SwiGLU or Gemma's GeGLU, read through the block's
//! input norm and projected into the residual stream
//! (`crate::layers::residual`). Weight names `{prefix}.gate_proj.weight`
//! etc.

use turbospark_backend::Backend;
use turbospark_format::{Activation, ModelSpec};

use crate::error::Result;
use crate::layers::residual::BlockNorms;
use crate::loader::Loader;

pub struct GatedMlp<B: Backend> {
    gate: B::Weight,
    up: B::Weight,
    down: B::Weight,
    gate_bias: Option<B::Weight>,
    up_bias: Option<B::Weight>,
    down_bias: Option<B::Weight>,
    activation: Activation,
    width: usize,
}

impl<B: Backend> GatedMlp<B> {
    pub fn load(l: &Loader<B>, prefix: &str, spec: &ModelSpec) -> Result<Self> {
        let (h, i) = (spec.hidden_size, spec.intermediate_size);
        let name = |s: &str| format!("{prefix}.{s}");
        let b = spec.mlp_bias;
        Ok(GatedMlp {
            gate: l.matrix(&name("gate_proj.weight"), [i, h])?,
            up: l.matrix(&name("up_proj.weight"), [i, h])?,
            down: l.matrix(&name("down_proj.weight"), [h, i])?,
            gate_bias: l.tensor_if(b, &name("gate_proj.bias"), &[i])?,
            up_bias: l.tensor_if(b, &name("up_proj.bias"), &[i])?,
            down_bias: l.tensor_if(b, &name("down_proj.bias"), &[h])?,
            activation: spec.activation,
            width: i,
        })
    }

    /// `x += post(mlp(rms_norm(x)))`.
    pub fn forward(&self, be: &B, x: &mut B::Tensor, norms: &BlockNorms<'_, B>) {
        let n = be.shape(x).0;
        let mut act = be.empty(n, self.width);
        let gate = (&self.gate, self.gate_bias.as_ref());
        let up = (&self.up, self.up_bias.as_ref());
        norms.glu(be, x, gate, up, self.activation, &mut act);
        norms.project_into(be, &act, &self.down, self.down_bias.as_ref(), x);
    }
}
