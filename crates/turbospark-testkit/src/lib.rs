//! The reference-fixture harness: loads a fixture made by
//! `tools/reference/make_fixtures.py` (a tiny transformers model with its
//! float32 logits for every position and a 16-token greedy continuation),
//! runs it through TurboSpark on any backend, and measures the distance.
//! Shared by the CPU tests (turbospark-models) and the GPU tests
//! (turbospark-cuda); it holds no assertions, only measurements.

use std::path::{Path, PathBuf};

use turbospark_backend::{Backend, KvDtype};
use turbospark_format::{ModelSpec, npy};
use turbospark_models::{
    GreedyEnd, LoadOptions, Session, load_model_with, read_spec, sampler::argmax,
};

/// The fixtures folder: `$TURBOSPARK_FIXTURES` when set (a test binary
/// copied to another machine), else the repository's `tests/fixtures`.
pub fn fixtures_root() -> PathBuf {
    std::env::var_os("TURBOSPARK_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"))
}

pub fn fixture_dir(name: &str) -> PathBuf {
    fixtures_root().join(name)
}

/// Every fixture directory, sorted by name.
pub fn all_fixtures() -> Vec<PathBuf> {
    let root = fixtures_root();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("reference.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

pub struct Reference {
    pub tokens: Vec<u32>,
    pub greedy: Vec<u32>,
    pub logits: Vec<f32>,
    pub vocab: usize,
}

impl Reference {
    /// The reference's logits and greedy continuation, as a [`Run`].
    pub fn as_run(&self) -> Run {
        Run {
            logits: self.logits.clone(),
            greedy: self.greedy.clone(),
        }
    }
}

/// The recorded transformers outputs in fixture directory `dir`.
pub fn reference(dir: &Path) -> Reference {
    let text = std::fs::read_to_string(dir.join("reference.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        json[k]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no `{k}`", dir.display()))
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
    /// max over positions of max|Δlogit| / std(reference logits at that
    /// position); infinite when any logit is NaN.
    pub worst_rel_err: f32,
    /// The same measure at each position, in order.
    pub rel_errs: Vec<f32>,
    pub argmax_mismatches: usize,
    pub positions: usize,
    pub greedy: Vec<u32>,
    pub greedy_reference: Vec<u32>,
}

impl Comparison {
    /// The per-position measure at quantile `q` (nearest rank).
    pub fn quantile(&self, q: f64) -> f32 {
        let mut s = self.rel_errs.clone();
        s.sort_by(f32::total_cmp);
        s[((s.len() - 1) as f64 * q).round() as usize]
    }
}

fn std_dev(x: &[f32]) -> f32 {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    (x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt() as f32
}

/// What TurboSpark makes of a fixture's prompt: every position's logits
/// (`[tokens, vocab]`) and the greedy continuation.
pub struct Run {
    pub logits: Vec<f32>,
    pub greedy: Vec<u32>,
}

/// Runs the weights in `dir` with `spec` and `opts` on the prompt of
/// `r`, feeding it `chunk` tokens at a time into a KV cache of `kv` (the
/// backend's default for the model when `None`), then decodes greedily as
/// many tokens as `r` has.
pub fn run<B: Backend + 'static>(
    be: &B,
    dir: &Path,
    r: &Reference,
    (spec, opts): (ModelSpec, LoadOptions),
    chunk: usize,
    kv: Option<KvDtype>,
) -> Run {
    let model = load_model_with(be, dir, spec, opts, &|_, _| {}).unwrap();
    let ctx = r.tokens.len() + r.greedy.len() + 1;
    let kv = kv.unwrap_or_else(|| be.kv_dtype(model.spec().dtype));
    let mut session = Session::with_kv_dtype(be, model.as_ref(), ctx, chunk, kv).unwrap();
    let logits = session.feed(&r.tokens, true).unwrap();
    assert_eq!(logits.len(), r.logits.len());
    let mut greedy = Vec::new();
    let mut next = argmax(&logits[logits.len() - r.vocab..]);
    for _ in 0..r.greedy.len() {
        greedy.push(next);
        next = session.feed_argmax(&[next]).unwrap();
    }
    Run { logits, greedy }
}

/// How far `ours` is from `theirs` (a [`Reference`], or another run of it).
pub fn measure(ours: &Run, theirs: &Run, vocab: usize) -> Comparison {
    let mut rel_errs = Vec::new();
    let mut mismatches = 0;
    for (ours, theirs) in ours.logits.chunks(vocab).zip(theirs.logits.chunks(vocab)) {
        // A NaN anywhere must fail, not vanish in the max.
        let err = if ours.iter().any(|v| v.is_nan()) {
            f32::INFINITY
        } else {
            ours.iter()
                .zip(theirs)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        rel_errs.push(err / std_dev(theirs));
        mismatches += usize::from(argmax(ours) != argmax(theirs));
    }
    Comparison {
        worst_rel_err: rel_errs.iter().copied().fold(0.0, f32::max),
        positions: rel_errs.len(),
        rel_errs,
        argmax_mismatches: mismatches,
        greedy: ours.greedy.clone(),
        greedy_reference: theirs.greedy.clone(),
    }
}

/// Runs the weights in `dir` (fixture `reference_dir`'s or a rewritten copy)
/// with `spec` and `opts`, feeding the prompt `chunk` tokens at a time, then
/// decodes greedily as many tokens as the reference has, and measures the
/// distance from transformers' outputs.
pub fn compare<B: Backend + 'static>(
    be: &B,
    dir: &Path,
    reference_dir: &Path,
    spec: ModelSpec,
    opts: LoadOptions,
    chunk: usize,
) -> Comparison {
    let r = reference(reference_dir);
    let ours = run(be, dir, &r, (spec, opts), chunk, None);
    measure(&ours, &r.as_run(), r.vocab)
}

/// [`compare`] on fixture `dir` itself, with its own spec, and a KV cache
/// of `kv` (the backend's default when `None`).
pub fn compare_fixture_kv<B: Backend + 'static>(
    be: &B,
    dir: &Path,
    chunk: usize,
    kv: Option<KvDtype>,
) -> Comparison {
    let r = reference(dir);
    let spec = read_spec(dir).unwrap();
    let ours = run(be, dir, &r, (spec, LoadOptions::default()), chunk, kv);
    measure(&ours, &r.as_run(), r.vocab)
}

/// [`compare`] on fixture `dir` itself, with its own spec.
pub fn compare_fixture<B: Backend + 'static>(be: &B, dir: &Path, chunk: usize) -> Comparison {
    compare_fixture_kv(be, dir, chunk, None)
}

/// `n` greedy choices after `first`, one [`Session::feed_argmax`] at a
/// time (each fed): what [`Session::decode_greedy`] is checked against.
pub fn greedy_by_steps<B: Backend + 'static>(
    s: &mut Session<'_, B>,
    first: u32,
    n: usize,
) -> Vec<u32> {
    let mut choices = Vec::with_capacity(n);
    let mut last = first;
    for _ in 0..n {
        last = s.feed_argmax(&[last]).unwrap();
        choices.push(last);
    }
    choices
}

/// [`Session::decode_greedy`] from `first` for `steps` feeds, keeping
/// every choice: the choices, and why it ended.
pub fn greedy_ahead<B: Backend + 'static>(
    s: &mut Session<'_, B>,
    first: u32,
    steps: usize,
) -> (Vec<u32>, GreedyEnd) {
    let mut choices = Vec::new();
    let end = s
        .decode_greedy(first, steps, |t| {
            choices.push(t);
            true
        })
        .unwrap();
    (choices, end)
}
