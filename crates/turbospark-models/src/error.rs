//! Errors of the runtime. Each names what the user can change.

use turbospark_backend::BackendError;
use turbospark_format::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("token id {id} is out of range: the vocabulary has {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error(
        "the sequence needs {needed} positions but the context holds {capacity} (raise --context)"
    )]
    ContextFull { needed: usize, capacity: usize },
    #[error("empty prompt: give at least one token")]
    EmptyPrompt,
}

pub type Result<T> = std::result::Result<T, ModelError>;
