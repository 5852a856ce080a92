//! How a block meets the residual stream, the same for every block and
//! family: `x += post(block(rms_norm(x)))`. The block reads `x` through its
//! input norm ([`BlockNorms::linears`]: the norm and the block's first
//! projections are one backend operation, which a backend may fuse) and
//! adds its output back ([`BlockNorms::add_output`]: the output projection
//! or the experts accumulate into `x` where no post-norm sits between them).
//! The post-norms exist only in Gemma's sandwich layout. It owns the order
//! of those steps; the blocks own what happens between them.

use turbospark_backend::{Backend, Experts, MoeParams, rms_norm_route};
use turbospark_format::Activation;

/// A block's norms: `pre` before it, `post` (Gemma) on its output before
/// the residual add.
pub struct BlockNorms<'a, B: Backend> {
    pub pre: &'a B::Weight,
    pub post: Option<&'a B::Weight>,
    pub eps: f32,
}

impl<B: Backend> BlockNorms<'_, B> {
    /// `outs[i] = rms_norm(x) · Wᵢᵀ (+ biasᵢ)`; with `normed`, the normed
    /// rows too (for a block that reads them other than through these
    /// projections).
    pub fn linears(
        &self,
        be: &B,
        x: &B::Tensor,
        parts: &[(&B::Weight, Option<&B::Weight>)],
        outs: &mut [&mut B::Tensor],
        normed: Option<&mut B::Tensor>,
    ) {
        be.rms_norm_linears(x, self.pre, self.eps, parts, outs, normed);
    }

    /// `out = act(rms_norm(x) · Gᵀ + bg) * (rms_norm(x) · Uᵀ + bu)`: a gated
    /// MLP's first projections and activation through the input norm (one
    /// backend operation, which a backend may fuse).
    pub fn glu(
        &self,
        be: &B,
        x: &B::Tensor,
        gate: (&B::Weight, Option<&B::Weight>),
        up: (&B::Weight, Option<&B::Weight>),
        act: Activation,
        out: &mut B::Tensor,
    ) {
        be.rms_norm_glu(x, self.pre, self.eps, gate, up, act, out);
    }

    /// `x += post(moe(rms_norm(x)))`, routed by `rms_norm(x) · Rᵀ (+ rb)`:
    /// one backend operation without a post-norm (which a backend may
    /// fuse), else the router through the norm, then the experts added
    /// through the post-norm.
    pub fn moe(
        &self,
        be: &B,
        x: &mut B::Tensor,
        router: (&B::Weight, Option<&B::Weight>),
        experts: &Experts<'_, B::Weight>,
        params: &MoeParams,
    ) {
        if self.post.is_none() {
            return be.rms_norm_moe(x, self.pre, self.eps, router, experts, params);
        }
        let (normed, logits) =
            rms_norm_route(be, x, self.pre, self.eps, router, params.num_experts);
        self.add_output(be, x, |acc| be.moe(&normed, &logits, experts, params, acc));
    }

    /// `x += post(y · Wᵀ + bias)`: the block's output projection into the
    /// residual stream (one operation without a post-norm; with one, the
    /// projection writes a new tensor, which is normed and added).
    pub fn project_into(
        &self,
        be: &B,
        y: &B::Tensor,
        w: &B::Weight,
        bias: Option<&B::Weight>,
        x: &mut B::Tensor,
    ) {
        let Some(post) = self.post else {
            return be.linear_add(y, w, bias, x);
        };
        let (rows, cols) = be.shape(x);
        let mut out = be.empty(rows, cols);
        be.linear(y, w, bias, &mut out);
        self.add_normed(be, x, &out, post);
    }

    /// `x += post(out)` for a block output that `add` adds into the tensor
    /// it is given: straight into `x` without a post-norm, else into zeros
    /// (a new tensor), which are then normed and added.
    pub fn add_output(&self, be: &B, x: &mut B::Tensor, add: impl FnOnce(&mut B::Tensor)) {
        let Some(post) = self.post else {
            return add(x);
        };
        let (rows, cols) = be.shape(x);
        let mut out = be.tensor(rows, cols);
        add(&mut out);
        self.add_normed(be, x, &out, post);
    }

    /// `x += rms_norm(out) · post`.
    fn add_normed(&self, be: &B, x: &mut B::Tensor, out: &B::Tensor, post: &B::Weight) {
        let (rows, cols) = be.shape(x);
        let mut normed = be.empty(rows, cols);
        be.rms_norm(out, post, self.eps, &mut normed);
        be.add(x, &normed);
    }
}
