//! [`GenerationConfig`]: the sampling defaults and end-of-sequence ids a
//! model ships in `generation_config.json`. It owns reading that file; it
//! must not sample or decide how the CLI's flags override these values.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Result, TextError, read_json};

/// What `generation_config.json` says; every field is optional in the file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// `eos_token_id`: one id or a list (Llama 3.1 lists three).
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// `do_sample: false` means greedy decoding whatever the other fields say.
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_k: Option<u32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; a model without one gets the
    /// defaults (no EOS ids, no sampling preferences).
    pub fn from_dir(dir: &Path) -> Result<GenerationConfig> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(GenerationConfig::default());
        }
        let value = read_json(&path)?;
        let fields = Fields {
            path: &path,
            map: value.as_object().ok_or_else(|| TextError::Json {
                path: path.clone(),
                what: "expected a JSON object at the top level".into(),
            })?,
        };
        let eos = fields.map.get("eos_token_id");
        Ok(GenerationConfig {
            eos_token_ids: turbospark_format::token_list(eos).ok_or_else(|| {
                fields.err("eos_token_id", "expected an integer or a list of integers")
            })?,
            bos_token_id: fields.u32("bos_token_id")?,
            do_sample: fields.bool("do_sample")?,
            temperature: fields.f32("temperature")?,
            top_k: fields.u32("top_k")?,
            top_p: fields.f32("top_p")?,
            min_p: fields.f32("min_p")?,
            repetition_penalty: fields.f32("repetition_penalty")?,
        })
    }
}

/// Typed access to the file's fields; `null` counts as absent, as in
/// transformers.
struct Fields<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn err(&self, key: &str, what: &str) -> TextError {
        let got = self.map.get(key).map_or("nothing".into(), Value::to_string);
        TextError::Json {
            path: self.path.to_path_buf(),
            what: format!("field `{key}`: {what}, got {got}"),
        }
    }

    fn u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| self.err(key, "expected a non-negative 32-bit integer"))
            })
            .transpose()
    }

    fn f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| self.err(key, "expected a number"))
            })
            .transpose()
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.err(key, "expected true or false"))
            })
            .transpose()
    }
}
