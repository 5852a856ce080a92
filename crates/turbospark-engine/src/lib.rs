//! The engine: what the CLI (and later the server) drive. It ties a loaded
//! model to its tokenizer, chat template and generation defaults, and runs
//! the generation loop (prefill, decode, sampling, streaming text, stops).
//!
//! It must stay free of terminal and HTTP concerns: callers receive text
//! through a callback and decide how to show it.

pub mod engine;
pub mod error;
pub mod generate;
pub mod perplexity;

pub use engine::Engine;
pub use error::{EngineError, Result};
pub use generate::{FinishReason, GenParams, Generated};
pub use perplexity::{Perplexity, Scoring};
