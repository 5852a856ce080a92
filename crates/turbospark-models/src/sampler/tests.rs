//! The sampler's tests: the pipeline's semantics on small rows, and the
//! fast paths (selection, parallel chunks, summaries) against plain
//! references on vocabulary-sized ones.

use turbospark_backend::ScoreStats;
use turbospark_backend::scores::Keep;

use super::*;

fn cfg(temperature: f32) -> SamplerConfig {
    SamplerConfig {
        temperature,
        seed: 42,
        ..SamplerConfig::default()
    }
}

fn ln(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

/// Empirical frequencies of each id over `n` draws.
fn frequencies(cfg: SamplerConfig, logits: &[f32], n: usize) -> Vec<f64> {
    let mut s = Sampler::new(cfg);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, &[]) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

fn random_logits(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| (unit_f64(&mut rng) * 20.0 - 10.0) as f32)
        .collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "id {i}: got {g}, want {w} (+-{tol}); all {got:?}"
        );
    }
}

#[test]
fn argmax_first_max_and_nan_safe() {
    assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 0.5]), 1);
    assert_eq!(argmax(&[0.5, f32::NAN, 2.0]), 2);
    assert_eq!(argmax(&[-1.0, f32::NAN]), 0);
    assert_eq!(argmax(&[]), 0);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY, -1e30, f32::NEG_INFINITY]), 1);
}

#[test]
fn greedy_is_argmax() {
    let mut s = Sampler::new(SamplerConfig::default());
    for seed in 0..20 {
        let logits = random_logits(seed, 1000);
        assert_eq!(s.sample(&logits, &[]), argmax(&logits));
    }
    // Tiny temperatures are greedy too.
    let mut s = Sampler::new(cfg(1e-7));
    let logits = [0.0, 0.1, 0.0999];
    for _ in 0..100 {
        assert_eq!(s.sample(&logits, &[]), 1);
    }
}

#[test]
fn repetition_penalty_values() {
    let c = SamplerConfig {
        repetition_penalty: 2.0,
        ..SamplerConfig::default()
    };
    let mut l = vec![3.0, -1.0, 2.0, -4.0];
    // id 0 twice (penalised once), id 1 once, id 9 out of range.
    apply_penalties(&c, &mut l, &[0, 1, 0, 9], &mut Vec::new());
    assert_eq!(l, vec![1.5, -2.0, 2.0, -4.0]);
}

#[test]
fn repetition_penalty_flips_argmax() {
    let c = SamplerConfig {
        repetition_penalty: 2.0,
        ..SamplerConfig::default()
    };
    let mut s = Sampler::new(c);
    // Positive: 3.0 / 2 = 1.5 < 2.0.
    assert_eq!(s.sample(&[3.0, 2.0, 0.0], &[]), 0);
    assert_eq!(s.sample(&[3.0, 2.0, 0.0], &[0]), 1);
    // Negative: -1.0 * 2 = -2.0 < -1.5 (dividing would make it win more).
    assert_eq!(s.sample(&[-1.0, -1.5, -3.0], &[]), 0);
    assert_eq!(s.sample(&[-1.0, -1.5, -3.0], &[0]), 1);
}

#[test]
fn presence_and_frequency_values() {
    let c = SamplerConfig {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..SamplerConfig::default()
    };
    let mut l = vec![1.0; 4];
    apply_penalties(&c, &mut l, &[0, 0, 3, 0, 1], &mut Vec::new());
    // id 0: 1 - 0.5 - 3 * 0.25; id 1 and 3: 1 - 0.5 - 0.25; id 2 unseen.
    assert_eq!(l, vec![-0.25, 0.25, 1.0, 0.25]);

    // Frequency alone flips the argmax: 2.0 - 2 * 0.15 = 1.7 < 1.8.
    let mut s = Sampler::new(SamplerConfig {
        frequency_penalty: 0.15,
        ..SamplerConfig::default()
    });
    assert_eq!(s.sample(&[2.0, 1.8], &[0]), 0);
    assert_eq!(s.sample(&[2.0, 1.8], &[0, 0]), 1);
    // Presence alone: 2.0 - 0.3 = 1.7 < 1.8, however often it occurred.
    let mut s = Sampler::new(SamplerConfig {
        presence_penalty: 0.3,
        ..SamplerConfig::default()
    });
    assert_eq!(s.sample(&[2.0, 1.8], &[1]), 0);
    assert_eq!(s.sample(&[2.0, 1.8], &[0]), 1);
}

#[test]
fn penalties_apply_before_sampling() {
    // Without penalties id 0 has ~all the mass; with it banned-ish, id 1.
    let mut s = Sampler::new(SamplerConfig {
        frequency_penalty: 100.0,
        ..cfg(1.0)
    });
    for _ in 0..200 {
        assert_eq!(s.sample(&[10.0, 0.0, -10.0], &[0]), 1);
    }
}

#[test]
fn top_k_one_is_greedy_at_any_temperature() {
    for (i, &t) in [1e-3, 0.1, 0.7, 1.0, 5.0, 1e3, 1e6].iter().enumerate() {
        let mut s = Sampler::new(SamplerConfig { top_k: 1, ..cfg(t) });
        for j in 0..20 {
            let logits = random_logits(100 * i as u64 + j, 1000);
            assert_eq!(s.sample(&logits, &[]), argmax(&logits), "t={t}");
        }
    }
}

#[test]
fn top_k_keeps_k_best_on_full_vocab() {
    let mut logits = random_logits(7, 201_000);
    for l in &mut logits {
        *l = l.min(5.0);
    }
    logits[123_456] = 8.0;
    logits[7] = 8.0 - 2f32.ln(); // half as likely as 123_456
    logits[200_999] = 8.0 - 4f32.ln(); // a quarter as likely
    let c = SamplerConfig {
        top_k: 3,
        ..cfg(1.0)
    };
    let f = frequencies(c, &logits, 2000);
    let mut want = vec![0.0; logits.len()];
    want[123_456] = 4.0 / 7.0;
    want[7] = 2.0 / 7.0;
    want[200_999] = 1.0 / 7.0;
    assert_close(&f, &want, 0.04);
}

#[test]
fn top_k_ties_go_to_lower_ids() {
    let c = SamplerConfig {
        top_k: 3,
        ..cfg(1.0)
    };
    let f = frequencies(c, &[0.0; 10], 3000);
    let third = 1.0 / 3.0;
    let mut want = vec![0.0; 10];
    want[..3].fill(third);
    assert_close(&f, &want, 0.04);
}

#[test]
fn top_p_keeps_exactly_two() {
    // Cumulative 0.5, 0.8 >= 0.75: keeps ids 0 and 3, renormalised to
    // 0.625 / 0.375.
    let logits = ln(&[0.5, 0.1, 0.1, 0.3]);
    let c = SamplerConfig {
        top_p: 0.75,
        ..cfg(1.0)
    };
    let f = frequencies(c, &logits, 1000);
    assert_eq!(f[1] + f[2], 0.0, "{f:?}");
    assert_close(&f, &[0.625, 0.0, 0.0, 0.375], 0.05);
}

#[test]
fn top_p_tiny_keeps_one() {
    let logits = ln(&[0.2, 0.5, 0.3]);
    for top_p in [0.0, 1e-3, 0.5] {
        let c = SamplerConfig { top_p, ..cfg(1.0) };
        assert_eq!(frequencies(c, &logits, 200), vec![0.0, 1.0, 0.0]);
    }
}

/// The draw of a plain reference: every candidate scaled in id order
/// and fully sorted; `keep` says how many of them stay (given them and
/// their max); then the draw over their f32-rounded weights, as
/// `sample` makes it.
fn reference_draw(
    logits: &[f32],
    t: f32,
    u: f64,
    keep: impl Fn(&[Candidate], f64) -> usize,
) -> u32 {
    let mut c: Vec<Candidate> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| **l / t > f32::NEG_INFINITY)
        .map(|(id, &l)| Candidate {
            id: id as u32,
            score: l / t,
        })
        .collect();
    c.sort_unstable_by(by_score_desc);
    let max = f64::from(c[0].score);
    c.truncate(keep(&c, max));
    let w: Vec<f64> = c
        .iter()
        .map(|c| weight(c.score, max) as f32 as f64)
        .collect();
    let total: f64 = w.iter().sum();
    let mut cum = 0.0;
    for (c, w) in c.iter().zip(&w) {
        cum += w;
        if u * total < cum {
            return c.id;
        }
    }
    c.last().map_or(0, |c| c.id)
}

/// `n` draws of a sampler made from `cfg` equal `reference` given the
/// same uniform numbers.
fn assert_draws(
    cfg: SamplerConfig,
    logits: &[f32],
    n: usize,
    reference: impl Fn(f64) -> u32,
    what: &str,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut s = Sampler::new(cfg);
    for _ in 0..n {
        let u = unit_f64(&mut rng);
        assert_eq!(s.sample(logits, &[]), reference(u), "{what}");
    }
}

/// The nucleus found by bucketing is the one a full sort finds:
/// on vocabularies of 5,000-60,000 peaked and flat random logits, with
/// nuclei from one token to tens of thousands (those past 2,048 are left
/// unsorted and drawn from by bucketing too), every draw equals a reference
/// that sorts every candidate and sums the total in sorted order (the two
/// totals differ by rounding only).
#[test]
fn top_p_by_selection_equals_a_full_sort() {
    for (seed, n, spread, top_p, peak) in [
        (1, 5_000, 2.0, 0.9f32, 12.0),
        (2, 60_000, 2.5, 0.95, 12.0),
        (3, 20_000, 20.0, 0.5, 12.0),
        (4, 20_000, 0.2, 0.99, 12.0),
        (5, 5_000, 8.0, 0.999, 12.0),
        // Flat rows (a random model's): nuclei of ~24,000 and ~4,900.
        (6, 60_000, 2.0, 0.9, 0.0),
        (7, 60_000, 10.0, 0.9, 0.0),
    ] {
        let mut logits = random_logits(seed, n);
        // A few peaks over a spread of noise.
        for (i, l) in logits.iter_mut().enumerate() {
            *l = *l * spread / 10.0 + if i % 997 == 0 { peak } else { 0.0 };
        }
        let nucleus = |c: &[Candidate], max: f64| {
            let total: f64 = c.iter().map(|c| weight(c.score, max)).sum();
            let mut cum = 0.0;
            c.iter()
                .position(|c| {
                    cum += weight(c.score, max);
                    cum >= f64::from(top_p) * total
                })
                .map_or(c.len(), |i| i + 1)
        };
        let c = SamplerConfig {
            temperature: 0.7,
            top_p,
            seed,
            ..SamplerConfig::default()
        };
        assert_draws(
            c,
            &logits,
            40,
            |u| reference_draw(&logits, 0.7, u, nucleus),
            &format!("vocabulary {n}, spread {spread}, top_p {top_p}"),
        );
        if peak == 0.0 {
            // Long enough to be drawn from unsorted.
            reference_draw(&logits, 0.7, 0.5, |c, max| {
                assert!(nucleus(c, max) > 2_048, "{}", nucleus(c, max));
                1
            });
        }
    }
}

/// The chunked passes (parallel scaling when nothing is dropped, top-k
/// cut chunk by chunk) give the draws of a plain reference: every
/// candidate scaled in id order, fully sorted, the k best kept. Rows of
/// 50,000 with and without NaN / −inf entries, k from 1 to past a chunk.
#[test]
fn chunked_top_k_equals_a_full_sort() {
    for (seed, holes) in [(7, false), (8, true)] {
        let mut logits = random_logits(seed, 50_000);
        if holes {
            for i in (0..logits.len()).step_by(7) {
                logits[i] = if i % 2 == 0 {
                    f32::NEG_INFINITY
                } else {
                    f32::NAN
                };
            }
        }
        for k in [1, 40, 5_000, 9_000] {
            let c = SamplerConfig {
                temperature: 1.3,
                top_k: k,
                seed,
                ..SamplerConfig::default()
            };
            assert_draws(
                c,
                &logits,
                10,
                |u| reference_draw(&logits, 1.3, u, |_, _| k),
                &format!("top_k {k}, holes {holes}"),
            );
        }
    }
}

/// A row that counts how often it is read whole.
struct Counted<'a> {
    row: &'a [f32],
    reads: std::cell::Cell<usize>,
}

impl Scores for Counted<'_> {
    fn stats(&self, t: f32) -> ScoreStats {
        self.row.stats(t)
    }
    fn above(&self, t: f32, floor: f32, cap: usize) -> Option<Vec<(u32, f32)>> {
        // Any order: the device's is not the host's.
        self.row.above(t, floor, cap).map(|mut v| {
            v.reverse();
            v
        })
    }
    fn buckets(&self, t: f32, max: f32, keep: &Keep, rounded: bool) -> Vec<f64> {
        self.row.buckets(t, max, keep, rounded)
    }
    fn members(
        &self,
        t: f32,
        max: f32,
        keep: &Keep,
        bucket: usize,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        self.row.members(t, max, keep, bucket, cap).map(|mut v| {
            v.reverse();
            v
        })
    }
    fn draw(&self, t: f32, min_w: f64, u: f64) -> Option<u32> {
        self.row.draw(t, min_w, u)
    }
    fn row(&self) -> Vec<f32> {
        self.reads.set(self.reads.get() + 1);
        self.row.to_vec()
    }
}

/// Sampling from summaries draws what sampling the row draws, call for
/// call on one RNG stream, and reads the row whole only where it must:
/// top-k, top-p and min-p on peaked rows of 50,000 (with NaN, −inf and
/// +inf holes in some; a top-k whose k-th best lies in a dense band far
/// below the max) use the summaries, temperature alone and min-p alone
/// (also on a flat row) the row's own draw, top-p on a noisy row without
/// peaks (a nucleus of thousands) bucket sums; penalties, greedy, top-k on
/// a row of equal scores (too many above any floor), top-p there (one
/// bucket of 50,000) and +inf scores read the row.
#[test]
fn sample_from_summaries_equals_sample() {
    let mut peaked = random_logits(30, 50_000);
    for (i, l) in peaked.iter_mut().enumerate() {
        *l = *l * 0.25 + if i % 1_009 == 0 { 11.0 } else { 0.0 };
    }
    let mut holes = peaked.clone();
    for i in (3..holes.len()).step_by(11) {
        holes[i] = [f32::NAN, f32::NEG_INFINITY][i % 2];
    }
    let mut infinite = peaked.clone();
    infinite[77] = f32::INFINITY;
    // 39 peaks far above a dense band: the 40th best is in the band.
    let mut deep = random_logits(31, 50_000);
    for (i, l) in deep.iter_mut().enumerate() {
        *l = *l * 0.25 + if i % 1_300 == 0 { 20.0 } else { 0.0 };
    }
    let flat = vec![0.5f32; 50_000];
    // A random model's row: no peak, scores within a few units.
    let noise: Vec<f32> = random_logits(32, 50_000).iter().map(|l| l * 0.2).collect();
    let base = SamplerConfig {
        temperature: 0.8,
        seed: 5,
        ..SamplerConfig::default()
    };
    let cases: [(SamplerConfig, &[f32], bool); 17] = [
        (
            SamplerConfig {
                top_p: 0.9,
                ..base.clone()
            },
            &peaked,
            true,
        ),
        (
            SamplerConfig {
                top_p: 0.5,
                ..base.clone()
            },
            &holes,
            true,
        ),
        (
            SamplerConfig {
                top_k: 40,
                ..base.clone()
            },
            &peaked,
            true,
        ),
        (
            SamplerConfig {
                top_k: 40,
                top_p: 0.95,
                min_p: 0.05,
                ..base.clone()
            },
            &holes,
            true,
        ),
        (
            SamplerConfig {
                min_p: 0.1,
                ..base.clone()
            },
            &peaked,
            true,
        ),
        (
            SamplerConfig {
                top_k: 40,
                ..base.clone()
            },
            &deep,
            true,
        ),
        (
            SamplerConfig {
                top_k: 3,
                ..base.clone()
            },
            &flat,
            false,
        ),
        (
            SamplerConfig {
                top_p: 0.9,
                ..base.clone()
            },
            &flat,
            false,
        ),
        (
            SamplerConfig {
                min_p: 0.05,
                ..base.clone()
            },
            &flat,
            true,
        ),
        (
            SamplerConfig {
                top_p: 0.9,
                ..base.clone()
            },
            &noise,
            true,
        ),
        (
            SamplerConfig {
                top_p: 0.7,
                min_p: 0.5,
                ..base.clone()
            },
            &noise,
            true,
        ),
        (
            SamplerConfig {
                top_p: 0.9,
                ..base.clone()
            },
            &infinite,
            false,
        ),
        (
            SamplerConfig {
                top_p: 0.9,
                repetition_penalty: 1.3,
                ..base.clone()
            },
            &peaked,
            false,
        ),
        (base.clone(), &peaked, true),
        (base.clone(), &holes, true),
        (base.clone(), &infinite, false),
        (
            SamplerConfig {
                temperature: 0.0,
                ..base.clone()
            },
            &peaked,
            false,
        ),
    ];
    for (cfg, row, summaries) in cases {
        let (mut direct, mut from) = (Sampler::new(cfg.clone()), Sampler::new(cfg.clone()));
        let counted = Counted {
            row,
            reads: std::cell::Cell::new(0),
        };
        let history = [1, 2, 3];
        for step in 0..25 {
            assert_eq!(
                from.sample_from(&counted, &history),
                direct.sample(row, &history),
                "{cfg:?}, call {step}"
            );
        }
        let reads = counted.reads.get();
        assert_eq!(reads == 0, summaries, "{cfg:?}: {reads} whole reads");
    }
}

#[test]
fn top_p_renormalises_after_top_k() {
    // top_k = 2 leaves {0: 4/7, 1: 3/7}; top_p = 0.5 then keeps only
    // id 0. On the raw distribution top_p = 0.5 would keep two.
    let logits = ln(&[0.4, 0.3, 0.2, 0.1]);
    let c = SamplerConfig {
        top_k: 2,
        top_p: 0.5,
        ..cfg(1.0)
    };
    assert_eq!(frequencies(c, &logits, 300), vec![1.0, 0.0, 0.0, 0.0]);
    let c = SamplerConfig {
        top_p: 0.5,
        ..cfg(1.0)
    };
    assert_close(
        &frequencies(c, &logits, 2000),
        &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0],
        0.04,
    );
}

#[test]
fn min_p_excludes_below_threshold() {
    // min_p = 0.25: threshold 0.125 -> keeps 0.5, 0.3, 0.15; drops 0.05.
    let probs = [0.3, 0.05, 0.5, 0.15];
    let c = SamplerConfig {
        min_p: 0.25,
        ..cfg(1.0)
    };
    let f = frequencies(c, &ln(&probs), 3000);
    assert_eq!(f[1], 0.0, "{f:?}");
    assert_close(&f, &[0.3 / 0.95, 0.0, 0.5 / 0.95, 0.15 / 0.95], 0.04);
    // min_p = 0.5: threshold 0.25 -> keeps 0.5 and 0.3, also with a
    // top-p that does not cut anything (sorted path).
    for top_p in [1.0, 0.999] {
        let c = SamplerConfig {
            min_p: 0.5,
            top_p,
            ..cfg(1.0)
        };
        let f = frequencies(c, &ln(&probs), 3000);
        assert_close(&f, &[0.375, 0.0, 0.625, 0.0], 0.04);
    }
    // min_p above 1 still keeps the top token.
    let c = SamplerConfig {
        min_p: 3.0,
        ..cfg(1.0)
    };
    assert_eq!(frequencies(c, &ln(&probs), 100), vec![0.0, 0.0, 1.0, 0.0]);
}

#[test]
fn seed_determines_sequence() {
    let logits = random_logits(3, 50)
        .iter()
        .map(|l| l / 10.0)
        .collect::<Vec<_>>();
    let run = |seed: u64| {
        let mut s = Sampler::new(SamplerConfig { seed, ..cfg(1.0) });
        (0..200).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
    };
    let a = run(1);
    assert_eq!(a, run(1));
    assert_ne!(a, run(2));
    // Not a constant sequence either.
    assert!(a.iter().any(|&t| t != a[0]));
    // A cloned sampler continues the same stream.
    let mut s = Sampler::new(SamplerConfig {
        seed: 5,
        ..cfg(1.0)
    });
    s.sample(&logits, &[]);
    let mut t = s.clone();
    for _ in 0..20 {
        assert_eq!(s.sample(&logits, &[]), t.sample(&logits, &[]));
    }
}

#[test]
fn temperature_reshapes_distribution() {
    let logits = [2.0, 1.0, 0.0];
    let softmax = |t: f64| {
        let e: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / t).exp()).collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|x| x / z).collect::<Vec<_>>()
    };
    let mut p0 = Vec::new();
    for t in [0.5f32, 1.0, 2.0] {
        let f = frequencies(cfg(t), &logits, 3000);
        assert_close(&f, &softmax(f64::from(t)), 0.03);
        p0.push(f[0]);
    }
    // Lower temperature sharpens: the top token gets more likely.
    assert!(p0[0] > p0[1] + 0.1 && p0[1] > p0[2] + 0.1, "{p0:?}");
}

#[test]
fn degenerate_logits_do_not_panic() {
    for c in [SamplerConfig::default(), cfg(1.0)] {
        let mut s = Sampler::new(SamplerConfig {
            top_k: 2,
            top_p: 0.9,
            min_p: 0.1,
            repetition_penalty: 1.3,
            ..c
        });
        assert_eq!(s.sample(&[], &[1, 2]), 0);
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 4], &[0]), 0);
        assert_eq!(s.sample(&[f32::NAN; 4], &[]), 0);
        for _ in 0..50 {
            assert_eq!(s.sample(&[f32::NAN, -5.0, f32::NAN], &[]), 1);
        }
    }
    // +inf entries share the mass uniformly.
    let inf = f32::INFINITY;
    let f = frequencies(cfg(1.0), &[inf, 0.0, inf, 1e30], 2000);
    assert_close(&f, &[0.5, 0.0, 0.5, 0.0], 0.04);
}

#[test]
fn config_serde_defaults() {
    let c: SamplerConfig = serde_json::from_str(r#"{"temperature":0.7,"top_k":40}"#).unwrap();
    assert_eq!(
        c,
        SamplerConfig {
            temperature: 0.7,
            top_k: 40,
            ..SamplerConfig::default()
        }
    );
    let back: SamplerConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}
