//! [`Tokenizer`]: text to token ids and back. Two backends behind one API:
//! a Hugging Face `tokenizer.json` through the `tokenizers` crate, and, for
//! gpt-oss directories without one, the o200k_harmony encoding
//! ([`crate::o200k`]). It owns loading, choosing the backend and the
//! id/token lookups; it must not know about chat formats or generation.

use std::path::Path;

use crate::error::{Result, TextError, read_json};
use crate::o200k::O200kHarmony;

pub struct Tokenizer {
    backend: Backend,
}

enum Backend {
    // Both boxed: inline they are 1.1 kB and 0.3 kB.
    HuggingFace(Box<tokenizers::Tokenizer>),
    O200kHarmony(Box<O200kHarmony>),
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`; without one, a gpt-oss directory
    /// (config.json's `model_type` is `gpt_oss`) gets o200k_harmony. A path
    /// to a file is taken as the tokenizer.json itself (`tokenize --model
    /// path/to/tokenizer.json`, as Hugging Face's `Tokenizer.from_file`).
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        if dir.is_file() {
            return Self::from_file(dir);
        }
        match Self::find(dir)? {
            Some(tok) => Ok(tok),
            None => Err(TextError::Missing {
                path: dir.join("tokenizer.json"),
            }),
        }
    }

    /// Like [`Tokenizer::from_dir`], but `Ok(None)` when the directory has
    /// neither a tokenizer.json nor a model type with a known built-in
    /// tokenizer (test fixtures run from token ids).
    pub fn find(dir: &Path) -> Result<Option<Tokenizer>> {
        let json = dir.join("tokenizer.json");
        if json.exists() {
            return Self::from_file(&json).map(Some);
        }
        let config = dir.join("config.json");
        if !config.exists() {
            return Ok(None);
        }
        let model_type = read_json(&config)?
            .get("model_type")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        match model_type.as_deref() {
            Some("gpt_oss") => Self::o200k_harmony().map(Some),
            _ => Ok(None),
        }
    }

    /// gpt-oss' o200k_harmony encoding, built from data compiled into the
    /// program.
    pub fn o200k_harmony() -> Result<Tokenizer> {
        Ok(Tokenizer {
            backend: Backend::O200kHarmony(Box::new(O200kHarmony::new()?)),
        })
    }

    /// Loads a `tokenizer.json` at any path.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        // Read the text ourselves so a missing file is reported as such, not
        // as whatever the tokenizers crate makes of it.
        let text = crate::error::read_file(path)?;
        let inner =
            text.parse::<tokenizers::Tokenizer>()
                .map_err(|e| TextError::TokenizerFile {
                    path: path.to_path_buf(),
                    what: e.to_string(),
                })?;
        Ok(Tokenizer {
            backend: Backend::HuggingFace(Box::new(inner)),
        })
    }

    /// Token ids of `text`. Added tokens (e.g. `<|im_start|>`) in the text are
    /// always recognised; `add_special_tokens` only controls what the
    /// post-processor adds around the text (BOS for Llama 3; nothing for
    /// o200k_harmony, which has no post-processor).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::HuggingFace(inner) => {
                let encoding = inner
                    .encode(text, add_special_tokens)
                    .map_err(|e| TextError::Tokenize(format!("encoding failed: {e}")))?;
                Ok(encoding.get_ids().to_vec())
            }
            Backend::O200kHarmony(o200k) => o200k.encode(text),
        }
    }

    /// Text of `ids`; `skip_special` drops special tokens such as `<|eot_id|>`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        match &self.backend {
            Backend::HuggingFace(inner) => {
                if let Some(bad) = ids.iter().find(|&&id| inner.id_to_token(id).is_none()) {
                    // The tokenizers crate silently skips unknown ids; a model
                    // whose vocabulary is larger than its tokenizer's would
                    // lose text unseen.
                    return Err(TextError::Tokenize(format!(
                        "token id {bad} is outside the vocabulary ({} tokens)",
                        self.vocab_size()
                    )));
                }
                inner
                    .decode(ids, skip_special)
                    .map_err(|e| TextError::Tokenize(format!("decoding failed: {e}")))
            }
            Backend::O200kHarmony(o200k) => o200k.decode(ids, skip_special),
        }
    }

    /// Number of distinct tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::HuggingFace(inner) => inner.get_vocab_size(true),
            Backend::O200kHarmony(o200k) => o200k.vocab_size(),
        }
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        match &self.backend {
            Backend::HuggingFace(inner) => inner.token_to_id(token),
            Backend::O200kHarmony(o200k) => o200k.token_id(token),
        }
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.backend {
            Backend::HuggingFace(inner) => inner.id_to_token(id),
            Backend::O200kHarmony(o200k) => o200k.id_to_token(id),
        }
    }
}
