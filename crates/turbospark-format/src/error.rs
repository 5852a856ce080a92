//! The loader's error type. Every variant names the thing a user must fix
//! (a path, a tensor, a config field); the CLI prints it on one line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {what}")]
    Io { path: PathBuf, what: String },
    #[error("{path}: no such file or directory")]
    Missing { path: PathBuf },
    #[error(
        "{path}: is a file, not a model directory (config.json with *.safetensors, as downloaded from Hugging Face)"
    )]
    NotADirectory { path: PathBuf },
    #[error("{path}: invalid JSON: {what}")]
    Json { path: PathBuf, what: String },
    #[error("config.json: field `{field}`: {what}")]
    Config { field: String, what: String },
    #[error("unsupported architecture `{0}` (supported: {1})")]
    Unsupported(String, String),
    #[error("{file}: malformed safetensors file: {what}")]
    Safetensors { file: PathBuf, what: String },
    #[error("tensor `{name}` is missing from the checkpoint in {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    #[error("tensor `{name}` has shape {got:?} but config.json implies {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("tensor `{name}` has dtype {dtype}, which TurboSpark cannot use here")]
    Dtype { name: String, dtype: String },
}

pub type Result<T> = std::result::Result<T, FormatError>;

impl FormatError {
    pub fn config(field: impl Into<String>, what: impl Into<String>) -> Self {
        FormatError::Config {
            field: field.into(),
            what: what.into(),
        }
    }
}
