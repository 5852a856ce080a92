//! [`Tokenizer`]: text to token ids and back, through a Hugging Face
//! `tokenizer.json` and the `tokenizers` crate. It owns loading and the
//! id/token lookups; it must not know about chat formats or generation.

use std::path::Path;

use crate::error::{Result, TextError};

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        Self::from_file(&dir.join("tokenizer.json"))
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
        Ok(Tokenizer { inner })
    }

    /// Token ids of `text`. Added tokens (e.g. `<|im_start|>`) in the text are
    /// always recognised; `add_special_tokens` only controls what the
    /// post-processor adds around the text (BOS for Llama 3).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| TextError::Tokenize(format!("encoding failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`; `skip_special` drops special tokens such as `<|eot_id|>`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            // The tokenizers crate silently skips unknown ids; a model whose
            // vocabulary is larger than its tokenizer's would lose text unseen.
            return Err(TextError::Tokenize(format!(
                "token id {bad} is outside the vocabulary ({} tokens)",
                self.vocab_size()
            )));
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TextError::Tokenize(format!("decoding failed: {e}")))
    }

    /// Number of distinct tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}
