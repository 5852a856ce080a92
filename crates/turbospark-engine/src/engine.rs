//! A model directory opened for generation: weights on a backend, the
//! tokenizer (optional: fixture models have none), the chat template
//! (optional) and generation defaults. gpt-oss directories without
//! tokenizer files get the built-in o200k_harmony tokenizer and Harmony
//! template.

use std::path::{Path, PathBuf};

use turbospark_backend::{Backend, KvDtype};
use turbospark_format::Arch;
use turbospark_models::{CausalLm, LoadOptions, Session, load_model, loader::Progress};
use turbospark_text::{ChatTemplate, GenerationConfig, Message, Tokenizer, harmony_stop_ids};

use crate::error::{EngineError, Result};

pub struct Engine<B: Backend> {
    pub be: B,
    pub model: Box<dyn CausalLm<B>>,
    pub tokenizer: Option<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub gen_config: GenerationConfig,
    pub dir: PathBuf,
    /// The KV store dtype of new sessions; `None`: the backend's default
    /// for the model (`Backend::kv_dtype`).
    pub kv_override: Option<KvDtype>,
}

impl<B: Backend + 'static> Engine<B> {
    pub fn load(be: B, dir: &Path, progress: Progress<'_>) -> Result<Self> {
        Self::load_with(be, dir, LoadOptions::default(), progress)
    }

    pub fn load_with(be: B, dir: &Path, opts: LoadOptions, progress: Progress<'_>) -> Result<Self> {
        let model = load_model(&be, dir, opts, progress)?;
        let mut template = ChatTemplate::from_dir(dir)?;
        // A gpt-oss directory without tokenizer files still chats: the
        // tokenizer falls back to o200k_harmony, the template to the built-in one.
        if template.is_none() && model.spec().arch == Arch::GptOss {
            template = Some(ChatTemplate::gpt_oss()?);
        }
        Ok(Engine {
            be,
            model,
            tokenizer: Tokenizer::find(dir)?,
            template,
            gen_config: GenerationConfig::from_dir(dir)?,
            dir: dir.to_path_buf(),
            kv_override: None,
        })
    }

    /// Whether replies come in gpt-oss' Harmony format (channels for
    /// reasoning, answer and tool calls; see `turbospark_text::harmony`).
    pub fn is_harmony(&self) -> bool {
        self.model.spec().arch == Arch::GptOss
            || self.template.as_ref().is_some_and(ChatTemplate::is_harmony)
    }

    /// The dtype new sessions keep keys and values in.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_override
            .unwrap_or_else(|| self.be.kv_dtype(self.model.spec().dtype))
    }

    /// A new sequence with room for `max_context` positions, fed at most
    /// the backend's `prefill_chunk()` prompt tokens per forward call. Fails
    /// where the backend cannot hold its KV cache.
    pub fn session(&self, max_context: usize) -> Result<Session<'_, B>> {
        let ctx = max_context.max(1);
        let chunk = self.be.prefill_chunk().min(ctx);
        Ok(Session::with_kv_dtype(
            &self.be,
            self.model.as_ref(),
            ctx,
            chunk,
            self.kv_dtype(),
        )?)
    }

    /// Token ids that end generation: generation_config.json's, else
    /// config.json's, plus Harmony's `<|return|>` and `<|call|>` for a
    /// Harmony model (a directory without generation_config.json would
    /// otherwise run past the end of the turn).
    pub fn eos_ids(&self) -> Vec<u32> {
        let mut ids = if self.gen_config.eos_token_ids.is_empty() {
            self.model.spec().eos_token_ids.clone()
        } else {
            self.gen_config.eos_token_ids.clone()
        };
        if let Some(tok) = self.tokenizer.as_ref().filter(|_| self.is_harmony()) {
            for id in harmony_stop_ids(tok) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }

    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            EngineError::Usage(format!(
                "{}: no tokenizer.json (and no built-in tokenizer for this model type); pass token ids with --prompt-tokens",
                self.dir.display()
            ))
        })
    }

    /// Prompt ids for plain text (special tokens such as BOS added as the
    /// tokenizer defines).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokenizer()?.encode(text, true)?)
    }

    /// Prompt ids for a conversation rendered through the chat template. The
    /// template writes BOS itself, so the tokenizer adds no special tokens.
    pub fn encode_chat(
        &self,
        messages: &[Message],
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Vec<u32>> {
        let text = self.chat_template()?.render(messages, true, None, extra)?;
        Ok(self.tokenizer()?.encode(&text, false)?)
    }

    /// Whether conversations can be encoded (a chat template and a
    /// tokenizer), so that `chat` can say so before its first prompt.
    pub fn check_chat(&self) -> Result<()> {
        self.chat_template()?;
        self.tokenizer().map(drop)
    }

    fn chat_template(&self) -> Result<&ChatTemplate> {
        self.template.as_ref().ok_or_else(|| {
            EngineError::Usage(format!(
                "{}: no chat template (chat_template.jinja or tokenizer_config.json); \
                 generate from plain text with `turbospark run --prompt` (without --chat)",
                self.dir.display()
            ))
        })
    }
}
