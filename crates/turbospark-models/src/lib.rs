//! The runtime (being written).
pub mod sampler;
