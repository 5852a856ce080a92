//! A gpt-oss directory without tokenizer files (the gpt-oss-bf16 fixture):
//! the engine falls back to o200k_harmony and the built-in Harmony
//! template, stops at Harmony's end-of-turn tokens, and passes the
//! reasoning effort to the template.

use std::path::PathBuf;

use serde_json::{Map, json};
use turbospark_cpu::Cpu;
use turbospark_engine::Engine;
use turbospark_text::Message;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

#[test]
fn gpt_oss_without_tokenizer_files_gets_harmony() {
    let dir = fixture("gpt-oss-bf16");
    assert!(!dir.join("tokenizer.json").exists() && !dir.join("tokenizer_config.json").exists());
    let engine = Engine::load(Cpu, &dir, &|_, _| {}).unwrap();
    assert!(engine.is_harmony());
    let tok = engine.tokenizer().unwrap();
    assert_eq!(tok.vocab_size(), 201_088);
    assert_eq!(tok.encode("Hello world", false).unwrap(), [13225, 2375]);
    // The fixture's config names no EOS; Harmony's stops are added.
    assert_eq!(engine.eos_ids(), [200_002, 200_012, 199_999]);

    let mut vars = Map::new();
    vars.insert("reasoning_effort".into(), json!("low"));
    let ids = engine
        .encode_chat(&[Message::new("user", "Hi")], &vars)
        .unwrap();
    let text = tok.decode(&ids, false).unwrap();
    assert!(text.starts_with("<|start|>system<|message|>"), "{text}");
    assert!(text.contains("Reasoning: low\n"), "{text}");
    assert!(
        text.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"),
        "{text}"
    );
    assert_eq!(ids[ids.len() - 2], 200_006);
}

#[test]
fn other_families_are_not_harmony() {
    let engine = Engine::load(Cpu, &fixture("llama3-rope"), &|_, _| {}).unwrap();
    assert!(!engine.is_harmony());
    assert!(engine.tokenizer.is_none());
    assert!(engine.template.is_none());
    assert_eq!(engine.eos_ids(), [2]);
}
