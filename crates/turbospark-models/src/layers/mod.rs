//! Building blocks shared by the families: the attention block and the gated
//! MLP. A family composes these with its own norms and residual wiring; any
//! mechanism two families share lives here, not in a family file.

pub mod attention;
pub mod decoder;
pub mod mlp;
pub mod moe;
