//! [`ChatTemplate`]: renders a conversation into the prompt text a model was
//! trained on, with the model's own Jinja chat template. It owns finding the
//! template and special tokens in a model directory and reproducing the
//! rendering environment of transformers' `apply_chat_template`; it must not
//! tokenize or parse the model's replies.
//!
//! Fidelity is the point: transformers renders with jinja2 under
//! `trim_blocks=True, lstrip_blocks=True`, with `raise_exception`,
//! `strftime_now` and its own `tojson`, and passes `messages`, `tools`,
//! `documents`, `add_generation_prompt`, the tokenizer's special tokens and
//! every extra keyword. A difference of one newline changes the tokens the
//! model sees, so all of that is mirrored here.

use std::path::Path;

use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::Map;

use crate::error::{Result, TextError, read_file, read_json};
use crate::{pyjson, strftime};

/// One chat message. Fields other than `role` and `content` (`tool_calls`,
/// `tool_call_id`, `reasoning_content`, ...) go to the template as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// Missing or null reads as empty: OpenAI-style clients send
    /// `"content": null` for an assistant turn that only calls tools.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    #[serde(flatten)]
    pub extra: Map<String, serde_json::Value>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            extra: Map::new(),
        }
    }
}

/// Names a message's reasoning goes by. transformers copies the first one
/// found to `reasoning_content` (what most templates read) and `thinking`
/// (what gpt-oss reads).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The key of the one compiled template in the environment.
const TEMPLATE: &str = "chat";

pub struct ChatTemplate {
    /// Where the template came from, for error messages.
    name: String,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// `strftime_now`'s clock: `None` is the system clock, `Some` a fixed
    /// Unix time for reproducible prompts.
    fixed_time: Option<i64>,
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The model's chat template: `dir/chat_template.jinja` if present, else
    /// `chat_template` in `dir/tokenizer_config.json` (a string, or a list of
    /// `{name, template}` of which "default" is used). `Ok(None)` when the
    /// model has none (a base model). BOS/EOS come from tokenizer_config.json.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.exists() {
            Some(read_json(&config_path)?)
        } else {
            None
        };
        let token = |key: &str| -> Result<Option<String>> {
            config
                .as_ref()
                .map_or(Ok(None), |c| special_token(&config_path, c, key))
        };
        let (bos, eos) = (token("bos_token")?, token("eos_token")?);

        let jinja_path = dir.join("chat_template.jinja");
        if jinja_path.exists() {
            let source = read_file(&jinja_path)?;
            return Self::new(source, bos, eos)
                .map(|t| Some(t.with_name(jinja_path.display().to_string())));
        }
        let Some(config) = config else {
            return Ok(None);
        };
        let Some(source) = template_in_config(&config_path, &config)? else {
            return Ok(None);
        };
        let name = format!("{} (chat_template)", config_path.display());
        Self::new(source, bos, eos).map(|t| Some(t.with_name(name)))
    }

    /// Compiles `source`; syntax errors are reported here, not at render time.
    pub fn new(source: String, bos: Option<String>, eos: Option<String>) -> Result<ChatTemplate> {
        let mut template = ChatTemplate {
            name: "chat_template".into(),
            source,
            bos_token: bos,
            eos_token: eos,
            fixed_time: None,
            env: Environment::new(),
        };
        template.build_env()?;
        Ok(template)
    }

    /// Names the template in error messages (e.g. the file it came from).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Makes `strftime_now` report this Unix time (UTC) instead of the
    /// current one, so that the same conversation always renders the same.
    pub fn with_fixed_time(mut self, unix_secs: i64) -> Result<Self> {
        self.fixed_time = Some(unix_secs);
        self.build_env()?;
        Ok(self)
    }

    /// gpt-oss' template (Harmony), compiled into the program: the fallback
    /// for a gpt-oss directory that ships none, as `Tokenizer::from_dir`
    /// falls back to o200k_harmony. BOS/EOS as in gpt-oss'
    /// tokenizer_config.json.
    pub fn gpt_oss() -> Result<ChatTemplate> {
        let source = include_str!("../testdata/templates/openai-gpt-oss-120b.jinja");
        Self::new(
            source.to_string(),
            Some("<|startoftext|>".into()),
            Some("<|return|>".into()),
        )
        .map(|t| t.with_name("built-in gpt-oss template"))
    }

    /// Whether the template writes gpt-oss' Harmony format, whose replies
    /// come in channels (see [`crate::harmony`]).
    pub fn is_harmony(&self) -> bool {
        self.source.contains("<|channel|>")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders the conversation. `tools` is the list of tool JSON schemas;
    /// every key of `extra` becomes a template variable too (e.g.
    /// `enable_thinking`, `reasoning_effort`), overriding the special tokens
    /// as in transformers.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        extra: &Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx = Map::new();
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token".into(), bos.clone().into());
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token".into(), eos.clone().into());
        }
        for (key, value) in extra {
            ctx.insert(key.clone(), value.clone());
        }
        let messages = messages.iter().map(template_message).collect();
        ctx.insert("messages".into(), serde_json::Value::Array(messages));
        // transformers always passes these two, as None when absent.
        ctx.insert("tools".into(), tools.cloned().unwrap_or_default());
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());

        let template = self
            .env
            .get_template(TEMPLATE)
            .map_err(|e| self.error(&e))?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| self.error(&e))
    }

    fn build_env(&mut self) -> Result<()> {
        let mut env = Environment::new();
        // transformers' settings; keep_trailing_newline stays false there too.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        // A name like "tokenizer_config.json" would otherwise turn on JSON
        // escaping of every printed string.
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", pyjson::tojson);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        let fixed_time = self.fixed_time;
        env.add_function("strftime_now", move |format: String| {
            strftime::strftime(&format, fixed_time.unwrap_or_else(strftime::unix_now))
        });
        env.add_template_owned(TEMPLATE, self.source.clone())
            .map_err(|e| self.error(&e))?;
        self.env = env;
        Ok(())
    }

    fn error(&self, e: &Error) -> TextError {
        // The line number matters most when a template fails; minijinja puts
        // it in the Display text as "(in chat:LINE)".
        let mut what = e
            .to_string()
            .replace(&format!("(in {TEMPLATE}:"), "(at line ");
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            what.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        TextError::Template {
            name: self.name.clone(),
            what,
        }
    }
}

/// A message as transformers hands it to the template: keys whose value is
/// null dropped, and reasoning copied under the names templates read.
fn template_message(message: &Message) -> serde_json::Value {
    let mut map = Map::new();
    map.insert("role".into(), message.role.clone().into());
    map.insert("content".into(), message.content.clone().into());
    for (key, value) in &message.extra {
        if !value.is_null() {
            map.insert(key.clone(), value.clone());
        }
    }
    if let Some(reasoning) = REASONING_FIELDS.iter().find_map(|k| map.get(*k)).cloned() {
        // transformers builds {"thinking": r, **message, "reasoning_content": r}:
        // an existing `thinking` wins, `reasoning_content` is always set.
        map.entry("thinking").or_insert_with(|| reasoning.clone());
        map.insert("reasoning_content".into(), reasoning);
    }
    serde_json::Value::Object(map)
}

/// `bos_token` / `eos_token` in tokenizer_config.json: a string, an
/// AddedToken object `{"content": ...}`, or null.
fn special_token(path: &Path, config: &serde_json::Value, key: &str) -> Result<Option<String>> {
    let value = match config.get(key) {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(v) => v,
    };
    let text = value
        .as_str()
        .or_else(|| value.get("content").and_then(serde_json::Value::as_str));
    match text {
        Some(t) => Ok(Some(t.to_string())),
        None => Err(TextError::Json {
            path: path.to_path_buf(),
            what: format!(
                "field `{key}`: expected a string or an object with a string `content`, got {value}"
            ),
        }),
    }
}

/// `chat_template` in tokenizer_config.json: a string, or a list of named
/// templates (e.g. "default", "tool_use", "rag") of which we use "default".
fn template_in_config(path: &Path, config: &serde_json::Value) -> Result<Option<String>> {
    let err = |what: String| TextError::Json {
        path: path.to_path_buf(),
        what: format!("field `chat_template`: {what}"),
    };
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(list)) => {
            let mut names = Vec::new();
            for entry in list {
                let name = entry.get("name").and_then(serde_json::Value::as_str);
                let template = entry.get("template").and_then(serde_json::Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_string())),
                    (Some(n), Some(_)) => names.push(n.to_string()),
                    _ => {
                        return Err(err(format!(
                            "expected {{\"name\", \"template\"}} strings, got {entry}"
                        )));
                    }
                }
            }
            Err(err(format!(
                "no template named \"default\" among {names:?}"
            )))
        }
        Some(other) => Err(err(format!(
            "expected a string or a list of {{name, template}}, got {other}"
        ))),
    }
}
