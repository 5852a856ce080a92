//! What sampling needs of a row of logits, computed where the logits are:
//! the candidates' statistics, the candidates above a floor, their weights
//! by score bucket and a bucket's members, and a draw by temperature or
//! min-p alone, so that a GPU sends back a few numbers instead of the
//! row. The sampler
//! (`turbospark_models::sampler`) defines the candidates: the scores
//! `l / t` (f32) that are neither NaN nor −inf. This module is the host
//! definition, which [`crate::Backend`]'s default methods (and so the CPU
//! backend) use and a device implementation must match; it must not know
//! how the sampler uses them.

/// Statistics of one row's candidates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreStats {
    /// How many scores are candidates.
    pub count: usize,
    /// The largest candidate score (−inf when there is none).
    pub max: f32,
    /// Whether any score is +inf.
    pub pos_inf: bool,
    /// Σ exp(score − max) over the candidates, in f64 (exp of the f64
    /// difference); the order of the sum is the implementation's, so two
    /// implementations agree to f64 rounding. 0 without candidates;
    /// meaningless when some score is +inf.
    pub total: f64,
}

/// [`ScoreStats`] of `logits` scaled by `1 / t`.
pub fn score_stats(logits: &[f32], t: f32) -> ScoreStats {
    let mut count = 0;
    let mut max = f32::NEG_INFINITY;
    let mut pos_inf = false;
    for &l in logits {
        let s = l / t;
        if s > f32::NEG_INFINITY {
            count += 1;
            max = max.max(s);
            pos_inf |= s == f32::INFINITY;
        }
    }
    let total = if count == 0 || pos_inf {
        0.0
    } else {
        let m = f64::from(max);
        logits
            .iter()
            .map(|&l| l / t)
            .filter(|&s| s > f32::NEG_INFINITY)
            .map(|s| (f64::from(s) - m).exp())
            .sum()
    };
    ScoreStats {
        count,
        max,
        pos_inf,
        total,
    }
}

/// The candidates of `logits` scaled by `1 / t` whose score is at least
/// `floor` (finite), as (id, score) in id order; `None` when there are
/// more than `cap`.
pub fn scores_above(logits: &[f32], t: f32, floor: f32, cap: usize) -> Option<Vec<(u32, f32)>> {
    let mut out = Vec::new();
    for (id, &l) in logits.iter().enumerate() {
        let s = l / t;
        if s >= floor {
            if out.len() == cap {
                return None;
            }
            out.push((id as u32, s));
        }
    }
    Some(out)
}

/// A draw from `logits` scaled by `1 / t` over the candidates whose weight
/// exp(score − max) (computed in f64) is at least `min_w` (0: every
/// candidate; min-p's threshold otherwise), given the uniform number `u`
/// in [0, 1): the first of them, in id order, at which the running sum of
/// their weights (each rounded to f32, summed in f64) passes `u` times
/// their total, or the last of them where rounding leaves it short. This
/// is the sampler's draw by temperature alone, or by min-p alone. `None`
/// without candidates or with a +inf score (the sampler's own cases). The
/// order in which the total and the running sum are associated is the
/// implementation's, so two implementations draw alike except where
/// u · total lands within rounding of a running sum.
pub fn draw(logits: &[f32], t: f32, min_w: f64, u: f64) -> Option<u32> {
    let st = score_stats(logits, t);
    if st.count == 0 || st.pos_inf {
        return None;
    }
    let m = f64::from(st.max);
    let weights = || {
        logits.iter().enumerate().filter_map(move |(id, &l)| {
            let s = l / t;
            let w = (f64::from(s) - m).exp();
            (s > f32::NEG_INFINITY && w >= min_w).then(|| (id as u32, f64::from(w as f32)))
        })
    };
    let r = u * weights().map(|(_, w)| w).sum::<f64>();
    let mut cum = 0.0;
    let mut last = 0;
    for (id, w) in weights() {
        cum += w;
        if r < cum {
            return Some(id);
        }
        last = id;
    }
    Some(last)
}

/// Buckets of score below the max ([`bucket`]): 32 to a unit of score (a
/// weight ratio of e^(1/32), 3%), the last taking every score further down
/// (weights under e^-31.97, ~1e-14 of the top one).
pub const BUCKETS: usize = 1024;
const BUCKETS_PER_UNIT: f64 = 32.0;

/// The bucket of score `s` below the max score `max`: ⌊(max − s) · 32⌋ in
/// f64, at most [`BUCKETS`] − 1. A higher score never falls in a later
/// bucket, so the buckets in order are the candidates in score order,
/// coarsely: ranking by weight (the nucleus, a draw in score order) needs
/// to sort only the bucket where a running sum reaches its target.
pub fn bucket(max: f32, s: f32) -> usize {
    ((f64::from(max) - f64::from(s)) * BUCKETS_PER_UNIT).min((BUCKETS - 1) as f64) as usize
}

/// Which candidates a bucket pass counts: those whose weight
/// exp(s − max) (f64) is at least `min_w`, and with `last`, those at or
/// before it in score order (higher score, or the same score and an id no
/// higher): a nucleus that ends there.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Keep {
    pub min_w: f64,
    pub last: Option<(f32, u32)>,
}

impl Keep {
    /// Whether candidate score `s` (not NaN or −inf) of `id` is kept,
    /// given the max score; its weight exp(s − max) in f64 if so.
    pub fn weight(&self, max: f32, id: u32, s: f32) -> Option<f64> {
        let w = (f64::from(s) - f64::from(max)).exp();
        let before = self
            .last
            .is_none_or(|(ls, lid)| s > ls || (s == ls && id <= lid));
        (w >= self.min_w && before).then_some(w)
    }
}

/// The candidates of `logits` scaled by `1 / t` (`max`: their largest
/// score) that `keep` keeps, as the sums of their weights by [`bucket`]
/// (f64; with `rounded`, each weight rounded to f32 first, as a draw sums
/// them). The order of each sum is the implementation's.
pub fn score_buckets(logits: &[f32], t: f32, max: f32, keep: &Keep, rounded: bool) -> Vec<f64> {
    let mut sums = vec![0.0f64; BUCKETS];
    for (id, &l) in logits.iter().enumerate() {
        let s = l / t;
        if s > f32::NEG_INFINITY
            && let Some(w) = keep.weight(max, id as u32, s)
        {
            sums[bucket(max, s)] += if rounded { f64::from(w as f32) } else { w };
        }
    }
    sums
}

/// The candidates of `logits` scaled by `1 / t` that `keep` keeps in
/// bucket `b` (see [`bucket`]; `max`: the largest score), as (id, score) in
/// id order; `None` when there are more than `cap`.
pub fn bucket_members(
    logits: &[f32],
    t: f32,
    max: f32,
    keep: &Keep,
    b: usize,
    cap: usize,
) -> Option<Vec<(u32, f32)>> {
    let mut out = Vec::new();
    for (id, &l) in logits.iter().enumerate() {
        let s = l / t;
        if s > f32::NEG_INFINITY && bucket(max, s) == b && keep.weight(max, id as u32, s).is_some()
        {
            if out.len() == cap {
                return None;
            }
            out.push((id as u32, s));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_candidates_only() {
        let l = [1.0, f32::NAN, f32::NEG_INFINITY, 3.0, -2.0];
        let s = score_stats(&l, 0.5);
        assert_eq!((s.count, s.max, s.pos_inf), (3, 6.0, false));
        let want = 1.0 + (2.0f64 - 6.0).exp() + (-4.0f64 - 6.0).exp();
        assert!((s.total - want).abs() < 1e-15, "{} vs {want}", s.total);
        let s = score_stats(&[f32::NAN, f32::NEG_INFINITY], 1.0);
        assert_eq!((s.count, s.max, s.total), (0, f32::NEG_INFINITY, 0.0));
        assert!(score_stats(&[1.0, f32::INFINITY], 1.0).pos_inf);
    }

    #[test]
    fn draw_walks_the_weights_in_id_order_above_the_floor() {
        // Scores 0, 1, 1 at t = 1 (NaN and −inf are never drawn): weights
        // e^-1, 1, 1 of a total 2 + e^-1.
        let l = [0.0, f32::NAN, 1.0, f32::NEG_INFINITY, 1.0];
        let total = 2.0 + f64::from((-1.0f64).exp() as f32);
        let first = f64::from((-1.0f64).exp() as f32) / total;
        assert_eq!(draw(&l, 1.0, 0.0, 0.0), Some(0));
        assert_eq!(draw(&l, 1.0, 0.0, first * 0.999), Some(0));
        assert_eq!(draw(&l, 1.0, 0.0, first * 1.001), Some(2));
        assert_eq!(draw(&l, 1.0, 0.0, 0.99), Some(4));
        // A weight floor (min-p 0.5) leaves ids 2 and 4, half each.
        assert_eq!(draw(&l, 1.0, 0.5, 0.0), Some(2));
        assert_eq!(draw(&l, 1.0, 0.5, 0.49), Some(2));
        assert_eq!(draw(&l, 1.0, 0.5, 0.51), Some(4));
        assert_eq!(draw(&[f32::NAN, f32::NEG_INFINITY], 1.0, 0.0, 0.5), None);
        assert_eq!(draw(&[1.0, f32::INFINITY], 1.0, 0.0, 0.5), None);
    }

    #[test]
    fn buckets_follow_the_score_and_keep() {
        // Scores 2, 2 − 1/64, 2 − 1/16, 1, NaN, −inf, 2 at t = 1.
        let l = [
            2.0,
            2.0 - 1.0 / 64.0,
            2.0 - 1.0 / 16.0,
            1.0,
            f32::NAN,
            f32::NEG_INFINITY,
            2.0,
        ];
        assert_eq!([0, 1, 2, 3].map(|i| bucket(2.0, l[i])), [0, 0, 2, 32]);
        assert_eq!(bucket(2.0, -1e30), BUCKETS - 1);
        let all = Keep::default();
        let sums = score_buckets(&l, 1.0, 2.0, &all, false);
        let w = |s: f32| (f64::from(s) - 2.0).exp();
        assert_eq!(sums[0], 1.0 + w(l[1]) + 1.0);
        assert_eq!((sums[2], sums[32]), (w(l[2]), w(1.0)));
        assert_eq!(sums.iter().filter(|&&x| x != 0.0).count(), 3);
        let rounded = score_buckets(&l, 1.0, 2.0, &all, true);
        assert_eq!(rounded[32], f64::from(w(1.0) as f32));
        // A nucleus ending at (2, id 0) keeps id 0 only of the two 2s; a
        // weight floor of 0.5 drops the score 1.
        let nucleus = Keep {
            min_w: 0.5,
            last: Some((2.0, 0)),
        };
        assert_eq!(score_buckets(&l, 1.0, 2.0, &nucleus, false)[0], 1.0);
        assert_eq!(score_buckets(&l, 1.0, 2.0, &nucleus, false)[32], 0.0);
        assert_eq!(
            bucket_members(&l, 1.0, 2.0, &all, 0, 8),
            Some(vec![(0, 2.0), (1, l[1]), (6, 2.0)])
        );
        assert_eq!(bucket_members(&l, 1.0, 2.0, &all, 0, 2), None);
        assert_eq!(
            bucket_members(&l, 1.0, 2.0, &nucleus, 0, 8),
            Some(vec![(0, 2.0)])
        );
    }

    #[test]
    fn above_keeps_id_order_and_the_cap() {
        let l = [0.5, 2.0, f32::NAN, 1.0, f32::INFINITY, -3.0];
        assert_eq!(
            scores_above(&l, 1.0, 1.0, 8),
            Some(vec![(1, 2.0), (3, 1.0), (4, f32::INFINITY)])
        );
        assert_eq!(scores_above(&l, 1.0, 1.0, 3).map(|v| v.len()), Some(3));
        assert_eq!(scores_above(&l, 1.0, 1.0, 2), None);
        assert_eq!(scores_above(&l, 2.0, 0.25, 8).map(|v| v.len()), Some(4));
    }
}
