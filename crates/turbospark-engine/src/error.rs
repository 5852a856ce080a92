//! Errors of the engine layer, wrapping those of the layers below.

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] turbospark_models::ModelError),
    #[error(transparent)]
    Text(#[from] turbospark_text::TextError),
    #[error("{0}")]
    Usage(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;
