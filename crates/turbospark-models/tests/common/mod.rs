//! The reference-fixture harness: runs a fixture made by
//! `tools/reference/make_fixtures.py` through TurboSpark on the CPU backend
//! and compares with transformers' own logits and greedy continuation.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod mutant;

use std::path::PathBuf;

use turbospark_backend::Backend;
use turbospark_cpu::Cpu;
use turbospark_format::{ModelSpec, npy};
use turbospark_models::{LoadOptions, Session, load_model_with, read_spec, sampler::argmax};

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

pub struct Reference {
    pub tokens: Vec<u32>,
    pub greedy: Vec<u32>,
    pub logits: Vec<f32>,
    pub vocab: usize,
}

pub fn reference(name: &str) -> Reference {
    let dir = fixture_dir(name);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids = |k: &str| -> Vec<u32> {
        json[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let (shape, logits) = npy::read_f32(&dir.join("logits.npy")).unwrap();
    let tokens = ids("tokens");
    assert_eq!(shape[0], tokens.len());
    Reference {
        tokens,
        greedy: ids("greedy"),
        logits,
        vocab: shape[1],
    }
}

/// How far TurboSpark is from the reference.
#[derive(Debug)]
pub struct Comparison {
    /// max over positions of max|Δlogit| / std(reference logits at that position).
    pub worst_rel_err: f32,
    pub argmax_mismatches: usize,
    pub greedy: Vec<u32>,
}

fn std_dev(x: &[f32]) -> f32 {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    (x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt() as f32
}

/// Runs the fixture with `spec` (the fixture's own, possibly mutated) on
/// the CPU backend.
pub fn run(name: &str, spec: ModelSpec, chunk: usize) -> Comparison {
    run_on(&Cpu, name, spec, chunk)
}

/// Runs the fixture on any backend.
pub fn run_on<B: Backend + 'static>(
    be: &B,
    name: &str,
    spec: ModelSpec,
    chunk: usize,
) -> Comparison {
    run_dir(be, &fixture_dir(name), name, spec, chunk)
}

/// Runs the weights in `dir` against fixture `name`'s reference.
pub fn run_dir<B: Backend + 'static>(
    be: &B,
    dir: &std::path::Path,
    name: &str,
    spec: ModelSpec,
    chunk: usize,
) -> Comparison {
    run_with(be, dir, name, spec, LoadOptions::default(), chunk)
}

/// Runs the weights in `dir` with load options (quantization).
pub fn run_with<B: Backend + 'static>(
    be: &B,
    dir: &std::path::Path,
    name: &str,
    spec: ModelSpec,
    opts: LoadOptions,
    chunk: usize,
) -> Comparison {
    let r = reference(name);
    let model = load_model_with(be, dir, spec, opts, &|_, _| {}).unwrap();
    let ctx = r.tokens.len() + r.greedy.len() + 1;
    let mut session = Session::new(be, model.as_ref(), ctx, chunk);
    let logits = session.feed(&r.tokens, true).unwrap();
    assert_eq!(logits.len(), r.logits.len());
    let mut worst = 0.0f32;
    let mut mismatches = 0;
    for (ours, theirs) in logits.chunks(r.vocab).zip(r.logits.chunks(r.vocab)) {
        let sd = std_dev(theirs);
        let err = ours
            .iter()
            .zip(theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        worst = worst.max(err / sd);
        if argmax(ours) != argmax(theirs) {
            mismatches += 1;
        }
    }
    let mut greedy = Vec::new();
    let mut next = argmax(&logits[logits.len() - r.vocab..]);
    for _ in 0..r.greedy.len() {
        greedy.push(next);
        next = argmax(&session.feed(&[next], false).unwrap());
    }
    Comparison {
        worst_rel_err: worst,
        argmax_mismatches: mismatches,
        greedy,
    }
}

/// The foundation's tolerance: max |Δ| / std ≤ 1e-3, every argmax equal,
/// the same greedy continuation.
pub fn assert_matches(name: &str, chunk: usize) {
    assert_dir_matches(&fixture_dir(name), name, chunk);
}

/// [`assert_matches`] for the weights in `dir` (a rewritten copy of fixture
/// `name`).
pub fn assert_dir_matches(dir: &std::path::Path, name: &str, chunk: usize) {
    let spec = read_spec(dir).unwrap();
    let c = run_dir(&Cpu, dir, name, spec, chunk);
    let r = reference(name);
    assert!(
        c.worst_rel_err <= 1e-3,
        "{name}: max |Δlogit|/std = {}",
        c.worst_rel_err
    );
    assert_eq!(c.argmax_mismatches, 0, "{name}: argmax differs");
    assert_eq!(c.greedy, r.greedy, "{name}: greedy continuation differs");
}

/// Asserts that running with a mutated spec is caught by the tolerance.
pub fn assert_mutation_caught(name: &str, mutate: impl FnOnce(&mut ModelSpec)) {
    let mut spec = read_spec(&fixture_dir(name)).unwrap();
    mutate(&mut spec);
    assert_caught(name, run(name, spec, 512));
}

/// Asserts that a backend with a deliberate mistake is caught.
pub fn assert_mistake_caught(name: &str, mistake: mutant::Mistake) {
    let spec = read_spec(&fixture_dir(name)).unwrap();
    assert_caught(name, run_on(&mutant::Mutant::new(mistake), name, spec, 512));
}

fn assert_caught(name: &str, c: Comparison) {
    assert!(
        c.worst_rel_err > 1e-2,
        "{name}: the mutation went unnoticed (max |Δlogit|/std = {})",
        c.worst_rel_err
    );
}
