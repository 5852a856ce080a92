//! The CPU side of the reference-fixture harness: the assertions of the
//! foundation's tolerance over `turbospark-testkit`'s measurements, and the
//! mutation checks (a term switched off in the spec, or a deliberate
//! mistake in the backend, must be caught).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod mutant;

use std::path::Path;

use turbospark_cpu::Cpu;
use turbospark_format::ModelSpec;
use turbospark_models::{LoadOptions, read_spec};
pub use turbospark_testkit::{Comparison, compare, fixture_dir};

/// The foundation's tolerance: max |Δ| / std ≤ 1e-3, every argmax equal,
/// the same greedy continuation.
pub fn assert_matches(name: &str, chunk: usize) {
    assert_dir_matches(&fixture_dir(name), name, chunk);
}

/// [`assert_matches`] for the weights in `dir` (a rewritten copy of fixture
/// `name`).
pub fn assert_dir_matches(dir: &Path, name: &str, chunk: usize) {
    let spec = read_spec(dir).unwrap();
    let c = compare(
        &Cpu,
        dir,
        &fixture_dir(name),
        spec,
        LoadOptions::default(),
        chunk,
    );
    assert_tolerance(name, c);
}

fn assert_tolerance(name: &str, c: Comparison) {
    assert!(
        c.worst_rel_err <= 1e-3,
        "{name}: max |Δlogit|/std = {}",
        c.worst_rel_err
    );
    assert_eq!(c.argmax_mismatches, 0, "{name}: argmax differs");
    assert_eq!(
        c.greedy, c.greedy_reference,
        "{name}: greedy continuation differs"
    );
}

/// Runs fixture `name` on the CPU with `opts` (quantization).
pub fn run_with_options(name: &str, opts: LoadOptions) -> Comparison {
    let dir = fixture_dir(name);
    let spec = read_spec(&dir).unwrap();
    compare(&Cpu, &dir, &dir, spec, opts, 512)
}

/// Asserts that running with a mutated spec is caught by the tolerance.
pub fn assert_mutation_caught(name: &str, mutate: impl FnOnce(&mut ModelSpec)) {
    let dir = fixture_dir(name);
    let mut spec = read_spec(&dir).unwrap();
    mutate(&mut spec);
    assert_caught(
        name,
        compare(&Cpu, &dir, &dir, spec, LoadOptions::default(), 512),
    );
}

/// Asserts that fixture `name` matches on the CPU backend with `empty`
/// tensors full of NaN ([`mutant::Mistake::NanEmpty`]).
pub fn assert_matches_with_nan_empty(name: &str) {
    let dir = fixture_dir(name);
    let spec = read_spec(&dir).unwrap();
    let be = mutant::Mutant::new(mutant::Mistake::NanEmpty);
    assert_tolerance(
        name,
        compare(&be, &dir, &dir, spec, LoadOptions::default(), 512),
    );
}

/// Asserts that a backend with a deliberate mistake is caught.
pub fn assert_mistake_caught(name: &str, mistake: mutant::Mistake) {
    let dir = fixture_dir(name);
    let spec = read_spec(&dir).unwrap();
    let be = mutant::Mutant::new(mistake);
    assert_caught(
        name,
        compare(&be, &dir, &dir, spec, LoadOptions::default(), 512),
    );
}

fn assert_caught(name: &str, c: Comparison) {
    assert!(
        c.worst_rel_err > 1e-2,
        "{name}: the mutation went unnoticed (max |Δlogit|/std = {})",
        c.worst_rel_err
    );
}
