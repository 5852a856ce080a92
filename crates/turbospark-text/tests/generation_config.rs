//! generation_config.json: EOS ids as an integer or a list, sampling
//! defaults, and errors that name the file and field.

use std::path::Path;

use turbospark_text::{GenerationConfig, TextError};

fn from_json(text: &str) -> Result<GenerationConfig, TextError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("generation_config.json"), text).unwrap();
    GenerationConfig::from_dir(dir.path())
}

#[test]
fn llama31_style_config() {
    // As shipped with Llama 3.1 8B Instruct.
    let cfg = from_json(
        r#"{"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
            "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"}"#,
    )
    .unwrap();
    assert_eq!(cfg.eos_token_ids, [128_001, 128_008, 128_009]);
    assert_eq!(cfg.bos_token_id, Some(128_000));
    assert_eq!(cfg.do_sample, Some(true));
    assert_eq!(cfg.temperature, Some(0.6));
    assert_eq!(cfg.top_p, Some(0.9));
    assert_eq!(cfg.top_k, None);
    assert_eq!(cfg.min_p, None);
}

#[test]
fn single_eos_and_nulls() {
    let cfg = from_json(
        r#"{"eos_token_id": 50256, "bos_token_id": null, "top_k": 20, "min_p": 0.05,
            "repetition_penalty": 1.1}"#,
    )
    .unwrap();
    assert_eq!(cfg.eos_token_ids, [50_256]);
    assert_eq!(cfg.bos_token_id, None);
    assert_eq!(cfg.top_k, Some(20));
    assert_eq!(cfg.min_p, Some(0.05));
    assert_eq!(cfg.repetition_penalty, Some(1.1));
}

#[test]
fn missing_file_gives_defaults() {
    let cfg = GenerationConfig::from_dir(Path::new("/nonexistent/model")).unwrap();
    assert_eq!(cfg, GenerationConfig::default());
    assert!(cfg.eos_token_ids.is_empty());
}

#[test]
fn malformed_file_names_file_and_field() {
    let err = from_json("{\"eos_token_id\": ").unwrap_err().to_string();
    assert!(
        err.contains("generation_config.json: invalid JSON"),
        "{err}"
    );

    let err = from_json(r#"{"eos_token_id": "</s>"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("generation_config.json") && err.contains("field `eos_token_id`"),
        "{err}"
    );

    let err = from_json(r#"{"top_k": -1}"#).unwrap_err().to_string();
    assert!(
        err.contains("field `top_k`") && err.contains("got -1"),
        "{err}"
    );

    let err = from_json(r#"{"temperature": "hot"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("field `temperature`: expected a number"),
        "{err}"
    );

    let err = from_json("[1, 2]").unwrap_err().to_string();
    assert!(err.contains("expected a JSON object"), "{err}");
}
