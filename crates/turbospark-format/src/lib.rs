//! TurboSpark's model-format layer: `config.json` → [`ModelSpec`] and
//! safetensors checkpoints → borrowed [`HostTensor`]s.
//!
//! It owns parsing and validation of what is on disk. It must not know about
//! backends, devices or the forward pass.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod npy;
mod rope_config;
pub mod spec;

pub use checkpoint::{Checkpoint, HostTensor};
pub use config::{load_config, parse_config, token_list};
pub use error::{FormatError, Result};
pub use spec::{
    Activation, Arch, AttnSpan, DType, ExpertAct, ModelSpec, MoeSpec, RopeScaling, RopeSpec,
    Routing,
};
