//! TurboSpark's runtime: model families written once over the backend trait,
//! the KV-cache manager, sessions (prefill and decode), and the sampler.
//!
//! It owns the forward pass and generation state; it must not know about
//! text, files other than through `turbospark-format`, or the command line.

pub mod error;
pub mod families;
pub mod kv_cache;
pub mod layers;
pub mod loader;
pub mod model;
pub mod rope;
pub mod sampler;
pub mod session;

pub use error::{ModelError, Result};
pub use families::CausalLm;
pub use kv_cache::KvCache;
pub use loader::LoadOptions;
pub use model::{load_model, load_model_with, load_model_with_spec, read_spec};
pub use session::{GreedyEnd, Session};
