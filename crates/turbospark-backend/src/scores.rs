//! What sampling needs of a row of logits, computed where the logits are:
//! the candidates' statistics, the candidates above a floor, and a draw by
//! temperature or min-p alone, so that a GPU sends back a few numbers instead of the
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
