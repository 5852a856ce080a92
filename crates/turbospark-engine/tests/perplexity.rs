//! Perplexity against a value computed from transformers' own logits
//! (the llama3-rope fixture), for one window and for several, through the
//! prompt path and the decode path.

use std::path::PathBuf;

use turbospark_backend::Quant;
use turbospark_cpu::Cpu;
use turbospark_engine::{Engine, Scoring};
use turbospark_format::npy;
use turbospark_models::LoadOptions;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama3-rope")
}

fn reference() -> (Vec<u32>, Vec<f32>, usize) {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap())
            .unwrap();
    let tokens: Vec<u32> = json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let (shape, logits) = npy::read_f32(&fixture().join("logits.npy")).unwrap();
    (tokens, logits, shape[1])
}

/// Mean NLL of tokens[1..] under the reference logits of one window.
fn reference_nll(tokens: &[u32], logits: &[f32], vocab: usize) -> f64 {
    let mut nll = 0.0;
    for (row, &next) in logits.chunks(vocab).zip(&tokens[1..]) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln();
        nll += lse - row[next as usize] as f64;
    }
    nll / (tokens.len() - 1) as f64
}

#[test]
fn one_window_matches_transformers_logits() {
    let (tokens, logits, vocab) = reference();
    let engine = Engine::load(Cpu, &fixture(), &|_, _| {}).unwrap();
    let p = engine
        .perplexity(&tokens, tokens.len(), Scoring::Prompt)
        .unwrap();
    let expected = reference_nll(&tokens, &logits, vocab).exp();
    assert_eq!(p.scored_tokens, tokens.len() - 1);
    assert!(
        (p.perplexity / expected - 1.0).abs() < 1e-4,
        "{} vs {expected}",
        p.perplexity
    );
}

/// One decode step a token gives transformers' value too: every step's
/// logits score the token after it (f32 weights, so decode rounds nothing).
#[test]
fn decode_steps_match_transformers_logits() {
    let (tokens, logits, vocab) = reference();
    let engine = Engine::load(Cpu, &fixture(), &|_, _| {}).unwrap();
    let w = tokens.len() / 2;
    let p = engine
        .perplexity(&tokens[..2 * w], w, Scoring::Decode)
        .unwrap();
    assert_eq!((p.windows, p.scored_tokens), (2, 2 * (w - 1)));
    assert_eq!(p.scoring, Scoring::Decode);
    let first = reference_nll(&tokens[..w], &logits[..w * vocab], vocab);
    let second = engine
        .perplexity(&tokens[w..2 * w], w, Scoring::Prompt)
        .unwrap()
        .nll;
    let expected = (first + second) / 2.0;
    assert!((p.nll - expected).abs() < 1e-4, "{} vs {expected}", p.nll);
}

#[test]
fn windows_restart_the_context() {
    let (tokens, logits, vocab) = reference();
    let engine = Engine::load(Cpu, &fixture(), &|_, _| {}).unwrap();
    // The first window's positions are the same as the reference's; the
    // second window starts fresh, so its score differs from the reference.
    let w = 16;
    let p = engine
        .perplexity(&tokens[..2 * w], w, Scoring::Prompt)
        .unwrap();
    assert_eq!((p.windows, p.scored_tokens), (2, 2 * (w - 1)));
    let first = reference_nll(&tokens[..w], &logits[..w * vocab], vocab);
    let second_fresh = engine
        .perplexity(&tokens[w..2 * w], w, Scoring::Prompt)
        .unwrap()
        .nll;
    let expected = (first + second_fresh) / 2.0;
    assert!((p.nll - expected).abs() < 1e-4, "{} vs {expected}", p.nll);
}

/// The shipped demo model on its held-out validation text, against
/// transformers' value for the same windows
/// (`tools/train-demo/perplexity_reference.py`, recorded in
/// `tools/train-demo/perplexity_reference.json`).
#[test]
fn demo_model_perplexity_matches_transformers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tools/train-demo/perplexity_reference.json")).unwrap(),
    )
    .unwrap();
    let engine = Engine::load(Cpu, &root.join("models/rust-docs-gpt-oss"), &|_, _| {}).unwrap();
    let text = std::fs::read_to_string(root.join("tools/train-demo/corpus/valid.txt")).unwrap();
    let tokens = engine.tokenizer().unwrap().encode(&text, false).unwrap();
    let context = reference["context"].as_u64().unwrap() as usize;
    let p = engine
        .perplexity(&tokens, context, Scoring::Prompt)
        .unwrap();
    let expected = reference["perplexity"].as_f64().unwrap();
    assert_eq!(
        p.scored_tokens as u64,
        reference["scored_tokens"].as_u64().unwrap()
    );
    // The issue asks for 0.5%; float32 logits agree far closer than that.
    assert!(
        (p.perplexity / expected - 1.0).abs() < 1e-4,
        "{} vs transformers {expected}",
        p.perplexity
    );
}

/// The demo model with int8 attention and head: the decode path multiplies
/// activations rounded to int8 (and MXFP4 experts' rounded to int16), so
/// its score differs from the prompt path's (f32 activations), by far less
/// than the weights' own rounding costs (+0.013%, BENCHMARKS.md).
#[test]
fn decode_scoring_sees_the_integer_activations() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let opts = LoadOptions {
        quant: Some(Quant::Int8),
        ..LoadOptions::default()
    };
    let engine = Engine::load_with(
        Cpu,
        &root.join("models/rust-docs-gpt-oss"),
        opts,
        &|_, _| {},
    )
    .unwrap();
    let text = std::fs::read_to_string(root.join("tools/train-demo/corpus/valid.txt")).unwrap();
    let tokens = engine.tokenizer().unwrap().encode(&text, false).unwrap();
    let tokens = &tokens[..256];
    let prompt = engine.perplexity(tokens, 128, Scoring::Prompt).unwrap();
    let decode = engine.perplexity(tokens, 128, Scoring::Decode).unwrap();
    assert_eq!(decode.scored_tokens, prompt.scored_tokens);
    let relative = (decode.nll - prompt.nll).abs() / prompt.nll;
    assert!(
        relative > 0.0 && relative < 1e-3,
        "decode nll {} vs prompt nll {}",
        decode.nll,
        prompt.nll
    );
}
