//! Sampling a row held elsewhere (a GPU's) from its summaries
//! (`turbospark_backend::scores`) instead of the whole row.

use turbospark_backend::ScoreStats;
use turbospark_backend::scores::{self, Keep};

use super::select::{reaching_bucket, walk_sorted};
use super::{Candidate, Sampler, weight};

impl Sampler {
    /// [`Sampler::sample`] of a row held elsewhere (a GPU's), asking it for
    /// summaries first: the candidates' [`ScoreStats`], then those scoring
    /// above a floor that every token the filters can keep clears, at most
    /// [`ABOVE_CAP`] of them (top-k: a floor with between k and the cap
    /// above it, [`top_k_list`]; top-p: the weight (1 − top_p) · total / n,
    /// below which the nucleus never reaches, min-p then applying to the
    /// list); with temperature alone, or min-p alone, the row draws itself
    /// (`Scores::draw`).
    /// A top-p nucleus without top-k that the list cannot hold (a flat
    /// row's) is found from bucket sums instead ([`Sampler::nucleus_by_buckets`]).
    /// Everything else reads the whole row: penalties, +inf scores, top-k
    /// floors that let more than the cap through, buckets over the cap.
    /// The draws equal `sample`'s on the same row, except that a top-p cut
    /// without top-k, and a draw by temperature or min-p alone, use sums the
    /// backend associates its own way, which moves the cut or the draw
    /// only where a running sum lands within rounding of its target.
    pub fn sample_from(&mut self, row: &dyn Scores, history: &[u32]) -> u32 {
        let cfg = &self.cfg;
        let (k, top_p) = (cfg.top_k, cfg.top_p);
        if cfg.is_greedy() || (cfg.has_penalties() && !history.is_empty()) {
            return self.sample(&row.row(), history);
        }
        let t = cfg.temperature;
        let u = self.draw_u();
        if k == 0 && top_p >= 1.0 {
            // Temperature alone, or min-p without top-k or top-p: the row
            // draws (`scores::draw` is this sampler's draw over the
            // candidates min-p keeps, or all of them, in id order).
            let min_w = self.cfg.min_p_weight().unwrap_or(0.0);
            return match row.draw(t, min_w, u) {
                Some(id) => id,
                None => self.choose(&row.row(), history, u),
            };
        }
        let st = row.stats(t);
        let list = if st.count == 0 || st.pos_inf {
            None
        } else if k > 0 {
            top_k_list(row, t, st.max, k.min(st.count))
        } else {
            // Top-p (top-k is off, and top-p alone or with min-p is what is
            // left after the early return): the weight below which the
            // nucleus never reaches.
            let weight_floor = (1.0 - f64::from(top_p)) * st.total / st.count as f64;
            let floor = (weight_floor.ln() + f64::from(st.max) - 1e-3) as f32;
            if floor.is_finite() {
                row.above(t, floor, ABOVE_CAP)
            } else {
                None
            }
        };
        let drawn = list.and_then(|mut list| {
            // In id order, so that a list of every candidate is `sample`'s.
            list.sort_unstable_by_key(|&(id, _)| id);
            let whole = list.len() == st.count;
            self.candidates.clear();
            self.candidates
                .extend(list.iter().map(|&(id, score)| Candidate { id, score }));
            let total = (!whole && k == 0).then_some(st.total);
            self.filter_and_draw(u, total)
        });
        // A nucleus past the list (a flat row's): by buckets.
        let drawn = drawn.or_else(|| {
            (k == 0 && top_p < 1.0 && st.count > 0 && !st.pos_inf)
                .then(|| self.nucleus_by_buckets(row, &st, u))
                .flatten()
        });
        drawn.unwrap_or_else(|| self.choose(&row.row(), history, u))
    }

    /// Top-p (and min-p) without top-k from the row's bucket sums
    /// (`scores::score_buckets`) and the members of two buckets, as
    /// `filter_and_draw` ranks a long nucleus (`select::rank`): the
    /// nucleus ends where the running weight in score order reaches top_p
    /// of the row's total; the draw, over what it and min-p keep, where the
    /// running f32-rounded weight in score order passes u times theirs.
    /// `None` where a bucket holds more than [`ABOVE_CAP`] candidates.
    fn nucleus_by_buckets(&self, row: &dyn Scores, st: &ScoreStats, u: f64) -> Option<u32> {
        let cfg = &self.cfg;
        let (t, max) = (cfg.temperature, st.max);
        let top_p = f64::from(cfg.top_p);
        let all = Keep::default();
        let last = rank_held(row, t, max, &all, Some(st.total), |cum, total| {
            cum >= top_p * total
        })?;
        let keep = Keep {
            min_w: cfg.min_p_weight().unwrap_or(0.0),
            last: Some((last.score, last.id)),
        };
        rank_held(row, t, max, &keep, None, |cum, total| u * total < cum).map(|c| c.id)
    }
}

/// `select::rank` over a row held elsewhere: the candidate `keep` keeps at
/// which the running weight in score order reaches, from the row's bucket
/// sums and the members of the bucket where it does. With a `total` (the
/// nucleus), unrounded weights; without, their f32 roundings and their sum
/// (a draw). `None` where that bucket holds more than [`ABOVE_CAP`].
fn rank_held(
    row: &dyn Scores,
    t: f32,
    max: f32,
    keep: &Keep,
    total: Option<f64>,
    reaches: impl Fn(f64, f64) -> bool,
) -> Option<Candidate> {
    let rounded = total.is_none();
    let sums = row.buckets(t, max, keep, rounded);
    let total = total.unwrap_or_else(|| sums.iter().sum());
    let (b, acc) = reaching_bucket(&sums, total, &reaches)?;
    let mut members: Vec<Candidate> = row
        .members(t, max, keep, b, ABOVE_CAP)?
        .into_iter()
        .map(|(id, score)| Candidate { id, score })
        .collect();
    let m = f64::from(max);
    let w = |c: &Candidate| {
        let w = weight(c.score, m);
        if rounded { f64::from(w as f32) } else { w }
    };
    walk_sorted(&mut members, acc, total, w, reaches).or_else(|| members.last().copied())
}

/// Probes [`top_k_list`] makes at most (each a device launch and readback).
const TOP_K_PROBES: usize = 16;

/// The candidates of `row` above a floor that at least `need` of them
/// clear, and no more than [`ABOVE_CAP`]: `max − d` for d = 4, widened by
/// doubling while too few are above (up to 64 below the max), then bisected
/// between too few and too many, [`TOP_K_PROBES`] probes at most. A row
/// whose k best hold a score just above a dense band of others needs the
/// bisection (more than the cap one step wider, fewer than k one narrower);
/// `None` where no probe lands between.
fn top_k_list(row: &dyn Scores, t: f32, max: f32, need: usize) -> Option<Vec<(u32, f32)>> {
    let (mut few, mut many) = (0.0f32, None::<f32>);
    let mut d = 4.0f32;
    for _ in 0..TOP_K_PROBES {
        match row.above(t, max - d, ABOVE_CAP) {
            Some(l) if l.len() >= need => return Some(l),
            Some(_) => few = d,
            None => many = Some(d),
        }
        d = match many {
            Some(m) => (few + m) / 2.0,
            None if d >= 64.0 => return None,
            None => d * 2.0,
        };
    }
    None
}

/// Most candidates [`Sampler::sample_from`] asks a row for at once.
pub const ABOVE_CAP: usize = 4096;

/// A row of logits held elsewhere (a GPU's) that answers for its
/// candidates (`turbospark_backend::scores` defines them) without being
/// read whole: [`Sampler::sample_from`].
pub trait Scores {
    /// `turbospark_backend::scores::score_stats` of the row.
    fn stats(&self, t: f32) -> ScoreStats;
    /// `turbospark_backend::scores::scores_above` of the row (any order).
    fn above(&self, t: f32, floor: f32, cap: usize) -> Option<Vec<(u32, f32)>>;
    /// `turbospark_backend::scores::score_buckets` of the row.
    fn buckets(&self, t: f32, max: f32, keep: &Keep, rounded: bool) -> Vec<f64>;
    /// `turbospark_backend::scores::bucket_members` of the row (any order).
    fn members(
        &self,
        t: f32,
        max: f32,
        keep: &Keep,
        bucket: usize,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>>;
    /// `turbospark_backend::scores::draw` from the row.
    fn draw(&self, t: f32, min_w: f64, u: f64) -> Option<u32>;
    /// The whole row.
    fn row(&self) -> Vec<f32>;
}

/// A row at hand answers from itself.
impl Scores for [f32] {
    fn stats(&self, t: f32) -> ScoreStats {
        scores::score_stats(self, t)
    }
    fn above(&self, t: f32, floor: f32, cap: usize) -> Option<Vec<(u32, f32)>> {
        scores::scores_above(self, t, floor, cap)
    }
    fn buckets(&self, t: f32, max: f32, keep: &Keep, rounded: bool) -> Vec<f64> {
        scores::score_buckets(self, t, max, keep, rounded)
    }
    fn members(
        &self,
        t: f32,
        max: f32,
        keep: &Keep,
        bucket: usize,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        scores::bucket_members(self, t, max, keep, bucket, cap)
    }
    fn draw(&self, t: f32, min_w: f64, u: f64) -> Option<u32> {
        scores::draw(self, t, min_w, u)
    }
    fn row(&self) -> Vec<f32> {
        self.to_vec()
    }
}
