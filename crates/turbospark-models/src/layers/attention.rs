//! The self-attention block: q/k/v projections (+ optional biases), optional
//! per-head q/k RMSNorm, RoPE, the KV write, attention, and the output
//! projection.
//!
//! Order of operations (as transformers): project, add bias (before RoPE:
//! the reverse order is a different function), per-head norm, rotate q and
//! k, store k (rotated) and v (never rotated), attend (with per-head sink
//! logits when the family has them) (those four steps are one
//! `Backend::rope_kv_attention`, which a backend may fuse), project out into the
//! residual stream. The input norm and the residual add are
//! `crate::layers::residual`'s. Weight names follow the Llama convention
//! `{prefix}.q_proj.weight`.

use turbospark_backend::{AttnParams, Backend, RopeTable};
use turbospark_format::{AttnSpan, ModelSpec};

use crate::error::Result;
use crate::layers::residual::BlockNorms;
use crate::loader::Loader;

pub struct Attention<B: Backend> {
    q: B::Weight,
    k: B::Weight,
    v: B::Weight,
    o: B::Weight,
    q_bias: Option<B::Weight>,
    k_bias: Option<B::Weight>,
    v_bias: Option<B::Weight>,
    o_bias: Option<B::Weight>,
    q_norm: Option<B::Weight>,
    k_norm: Option<B::Weight>,
    sinks: Option<B::Weight>,
    params: AttnParams,
    norm_eps: f32,
}

impl<B: Backend> Attention<B> {
    pub fn load(l: &Loader<B>, prefix: &str, spec: &ModelSpec, span: AttnSpan) -> Result<Self> {
        let (h, q, kv, hd) = (spec.hidden_size, spec.q_dim(), spec.kv_dim(), spec.head_dim);
        let name = |s: &str| format!("{prefix}.{s}");
        Ok(Attention {
            q: l.matrix(&name("q_proj.weight"), [q, h])?,
            k: l.matrix(&name("k_proj.weight"), [kv, h])?,
            v: l.matrix(&name("v_proj.weight"), [kv, h])?,
            o: l.matrix(&name("o_proj.weight"), [h, q])?,
            q_bias: l.tensor_if(spec.qkv_bias, &name("q_proj.bias"), &[q])?,
            k_bias: l.tensor_if(spec.qkv_bias, &name("k_proj.bias"), &[kv])?,
            v_bias: l.tensor_if(spec.qkv_bias, &name("v_proj.bias"), &[kv])?,
            o_bias: l.tensor_if(spec.o_bias, &name("o_proj.bias"), &[h])?,
            q_norm: l.norm_if(spec.qk_norm, &name("q_norm.weight"), hd, spec.norm_offset)?,
            k_norm: l.norm_if(spec.qk_norm, &name("k_norm.weight"), hd, spec.norm_offset)?,
            sinks: l.tensor_if(spec.attn_sinks, &name("sinks"), &[spec.num_heads])?,
            params: AttnParams {
                num_heads: spec.num_heads,
                num_kv_heads: spec.num_kv_heads,
                head_dim: hd,
                scale: spec.attn_scale,
                span,
                softcap: spec.attn_softcap,
            },
            norm_eps: spec.norm_eps,
        })
    }

    /// `x += post(attention(rms_norm(x)))` for the residual stream `x`
    /// `[n, hidden]`.
    pub fn forward(
        &self,
        be: &B,
        x: &mut B::Tensor,
        norms: &BlockNorms<'_, B>,
        batch: &B::Batch,
        kv: &mut B::Kv,
        rope: &RopeTable,
    ) {
        let n = be.shape(x).0;
        let p = &self.params;
        let (q_dim, kv_dim) = (p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim);
        let mut q = be.empty(n, q_dim);
        let mut k = be.empty(n, kv_dim);
        let mut v = be.empty(n, kv_dim);
        norms.linears(
            be,
            x,
            &[
                (&self.q, self.q_bias.as_ref()),
                (&self.k, self.k_bias.as_ref()),
                (&self.v, self.v_bias.as_ref()),
            ],
            &mut [&mut q, &mut k, &mut v],
            None,
        );
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            let mut qo = be.empty(n, q_dim);
            let mut ko = be.empty(n, kv_dim);
            be.rms_norm(&q, qn, self.norm_eps, &mut qo);
            be.rms_norm(&k, kn, self.norm_eps, &mut ko);
            (q, k) = (qo, ko);
        }
        let mut attn = be.empty(n, q_dim);
        let qkv = (&mut q, &mut k, &v);
        be.rope_kv_attention(qkv, kv, batch, rope, p, self.sinks.as_ref(), &mut attn);
        norms.project_into(be, &attn, &self.o, self.o_bias.as_ref(), x);
    }
}
