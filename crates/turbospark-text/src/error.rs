//! The crate's error type. Every variant names what a user must fix: a file,
//! a field in it, or a chat template. It must not carry recovery logic.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("{path}: no such file")]
    Missing { path: PathBuf },
    #[error("{path}: {what}")]
    Io { path: PathBuf, what: String },
    /// Malformed JSON, or a field with the wrong type.
    #[error("{path}: {what}")]
    Json { path: PathBuf, what: String },
    /// tokenizer.json could not be loaded.
    #[error("{path}: cannot load tokenizer: {what}")]
    TokenizerFile { path: PathBuf, what: String },
    /// Encoding or decoding failed (e.g. an id outside the vocabulary).
    #[error("tokenizer: {0}")]
    Tokenize(String),
    /// A chat template failed to compile or to render.
    #[error("chat template {name}: {what}")]
    Template { name: String, what: String },
}

pub type Result<T> = std::result::Result<T, TextError>;

/// Reads a whole file, telling a missing file apart from other I/O errors.
pub(crate) fn read_file(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => TextError::Missing {
            path: path.to_path_buf(),
        },
        _ => TextError::Io {
            path: path.to_path_buf(),
            what: e.to_string(),
        },
    })
}

/// Reads and parses a JSON file; errors name the file.
pub(crate) fn read_json(path: &std::path::Path) -> Result<serde_json::Value> {
    let text = read_file(path)?;
    serde_json::from_str(&text).map_err(|e| TextError::Json {
        path: path.to_path_buf(),
        what: format!("invalid JSON: {e}"),
    })
}
