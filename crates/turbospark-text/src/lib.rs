//! TurboSpark's text layer: tokenizing prompts, rendering chat templates,
//! turning generated ids back into printable text and cutting it at stop
//! strings, reading gpt-oss' Harmony replies (reasoning, answer, tool
//! calls), and reading a model's generation defaults.
//!
//! It owns everything between the user's text and token ids. It must not
//! know about tensors, backends or how tokens are sampled.

mod chat;
mod error;
mod generation;
pub mod harmony;
mod o200k;
mod pyjson;
mod stop;
mod stream;
mod strftime;
mod tokenizer;

pub use chat::{ChatTemplate, Message};
pub use error::{Result, TextError};
pub use generation::GenerationConfig;
pub use harmony::{
    HarmonyEvent, HarmonyMessage, HarmonyStream, HarmonyTokenStream, harmony_stop_ids,
};
pub use stop::StopStrings;
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
