//! Building blocks shared by the families: the attention block, the gated
//! MLP, the MoE block, how each meets the residual stream, and the decoder
//! stack that wires them. A family picks these and names its weights; any
//! mechanism two families share lives here, not in a family file.

pub mod attention;
pub mod decoder;
pub mod mlp;
pub mod moe;
pub mod residual;
