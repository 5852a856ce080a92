//! The mixture-of-experts feed-forward block: a router linear (optionally
//! biased) and stacked experts, run by the backend's `moe` operation.
//! Shared by gpt-oss, Qwen3-MoE and Mixtral; what differs (routing, the
//! activation, biases) comes from the [`MoeSpec`], and how the experts are
//! stored is detected from the checkpoint.

use turbospark_backend::{Backend, Experts, MoeParams};
use turbospark_format::{ModelSpec, MoeSpec};

use crate::error::Result;
use crate::layers::residual::BlockNorms;
use crate::loader::Loader;

/// Where a family keeps the router and the experts under the block prefix,
/// and how its checkpoints store them.
pub struct ExpertNames {
    pub router: &'static str,
    pub experts: &'static str,
    /// The fused float layout stores `gate_up_proj` as `[E, H, 2W]`
    /// (input-major, gpt-oss) rather than `[E, 2W, H]` (Qwen3-MoE, Mixtral
    /// in transformers 5).
    pub fused_input_major: bool,
    /// Per-expert tensors of 4.x checkpoints: `{experts}.{e}.{gate|up|down}.weight`.
    pub per_expert: Option<[&'static str; 3]>,
}

pub struct MoeBlock<B: Backend> {
    router: B::Weight,
    router_bias: Option<B::Weight>,
    gate_up: B::Weight,
    gate_up_bias: Option<B::Weight>,
    down: B::Weight,
    down_bias: Option<B::Weight>,
    params: MoeParams,
}

impl<B: Backend> MoeBlock<B> {
    /// Loads the router and the experts in whichever layout the checkpoint
    /// has: MXFP4 (`gate_up_proj_blocks`/`_scales`, output rows, as gpt-oss
    /// is released), fused float (`gate_up_proj`, see [`ExpertNames`]), or
    /// one tensor per expert (stacked here, gate rows before up rows).
    pub fn load(
        l: &Loader<B>,
        prefix: &str,
        spec: &ModelSpec,
        names: &ExpertNames,
    ) -> Result<Self> {
        let m = moe_spec(spec);
        let (e, w, h) = (m.num_experts, m.width, spec.hidden_size);
        let r = format!("{prefix}.{}", names.router);
        let x = format!("{prefix}.{}", names.experts);
        let (gate_up, down) = if l.ckpt.contains(&format!("{x}.gate_up_proj_blocks")) {
            (
                l.mxfp4(&format!("{x}.gate_up_proj"), e, 2 * w, h)?,
                l.mxfp4(&format!("{x}.down_proj"), e, h, w)?,
            )
        } else if let (Some([gate, up, dn]), false) = (
            names.per_expert,
            l.ckpt.contains(&format!("{x}.gate_up_proj")),
        ) {
            let item = |i: usize, part: &str| format!("{x}.{i}.{part}.weight");
            let gate_up: Vec<_> = (0..e)
                .map(|i| vec![(item(i, gate), [w, h]), (item(i, up), [w, h])])
                .collect();
            let down: Vec<_> = (0..e).map(|i| vec![(item(i, dn), [h, w])]).collect();
            (l.stacked(&gate_up)?, l.stacked(&down)?)
        } else if names.fused_input_major {
            (
                l.tensor_transposed(&format!("{x}.gate_up_proj"), [e, h, 2 * w])?,
                l.tensor_transposed(&format!("{x}.down_proj"), [e, w, h])?,
            )
        } else {
            (
                l.tensor(&format!("{x}.gate_up_proj"), &[e, 2 * w, h])?,
                l.tensor(&format!("{x}.down_proj"), &[e, h, w])?,
            )
        };
        Ok(MoeBlock {
            router: l.tensor(&format!("{r}.weight"), &[e, h])?,
            router_bias: l.tensor_if(m.biases, &format!("{r}.bias"), &[e])?,
            gate_up,
            gate_up_bias: l.tensor_if(m.biases, &format!("{x}.gate_up_proj_bias"), &[e, 2 * w])?,
            down,
            down_bias: l.tensor_if(m.biases, &format!("{x}.down_proj_bias"), &[e, h])?,
            params: params(m),
        })
    }

    /// Bytes of the experts a token does not activate, on average.
    pub fn idle_expert_bytes(&self, be: &B) -> u64 {
        let all = be.weight_bytes(&self.gate_up) + be.weight_bytes(&self.down);
        let p = &self.params;
        (all as u64) * (p.num_experts - p.top_k) as u64 / p.num_experts as u64
    }

    /// `x += post(moe(rms_norm(x)))`: the router reads x through the
    /// norm, which also hands the normed rows to the experts
    /// ([`BlockNorms::moe`]).
    pub fn forward(&self, be: &B, x: &mut B::Tensor, norms: &BlockNorms<'_, B>) {
        let experts = Experts {
            gate_up: &self.gate_up,
            gate_up_bias: self.gate_up_bias.as_ref(),
            down: &self.down,
            down_bias: self.down_bias.as_ref(),
        };
        let router = (&self.router, self.router_bias.as_ref());
        norms.moe(be, x, router, &experts, &self.params);
    }
}

fn moe_spec(spec: &ModelSpec) -> &MoeSpec {
    spec.moe
        .as_ref()
        .expect("an MoE block is only loaded for a spec with `moe`")
}

fn params(m: &MoeSpec) -> MoeParams {
    MoeParams {
        num_experts: m.num_experts,
        top_k: m.top_k,
        width: m.width,
        routing: m.routing,
        act: m.activation,
    }
}
