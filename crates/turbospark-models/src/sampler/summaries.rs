//! Sampling a row held elsewhere (a GPU's) from its summaries
//! (`turbospark_backend::scores`) instead of the whole row.

use turbospark_backend::{ScoreStats, scores};

use super::{Candidate, Sampler};

impl Sampler {
    /// [`Sampler::sample`] of a row held elsewhere (a GPU's), asking it for
    /// summaries first: the candidates' [`ScoreStats`], then those scoring
    /// above a floor that every token the filters can keep clears (top-k:
    /// max − 4, − 8, ... − 64 until k are above; top-p: the weight
    /// (1 − top_p) · total / n, below which the nucleus never reaches;
    /// min-p: its threshold), at most [`ABOVE_CAP`] of them. Everything
    /// else reads the whole row: penalties, temperature alone, +inf scores,
    /// a floor that lets more than the cap through, a nucleus longer than
    /// the list. The draws equal `sample`'s on the same row, except that a
    /// top-p cut without top-k uses the row's total as the backend sums it,
    /// which moves the cut only where the cumulative weight lands within
    /// rounding of top_p · total.
    pub fn sample_from(&mut self, row: &dyn Scores, history: &[u32]) -> u32 {
        let cfg = &self.cfg;
        let (k, top_p, min_p) = (cfg.top_k, cfg.top_p, cfg.min_p);
        let min_p_on = min_p > 0.0 && min_p.is_finite();
        if cfg.is_greedy()
            || (cfg.has_penalties() && !history.is_empty())
            || (k == 0 && top_p >= 1.0 && !min_p_on)
        {
            return self.sample(&row.row(), history);
        }
        let t = cfg.temperature;
        let u = self.draw_u();
        let st = row.stats(t);
        let list = if st.count == 0 || st.pos_inf {
            None
        } else if k > 0 {
            // Wider until k are above; more than the cap stays more.
            let mut found = None;
            for d in [4.0, 8.0, 16.0, 32.0, 64.0] {
                match row.above(t, st.max - d, ABOVE_CAP) {
                    Some(l) if l.len() >= k.min(st.count) => {
                        found = Some(l);
                        break;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            found
        } else {
            let weight_floor = if top_p < 1.0 {
                (1.0 - f64::from(top_p)) * st.total / st.count as f64
            } else {
                f64::from(min_p).min(1.0)
            };
            let floor = (weight_floor.ln() + f64::from(st.max) - 1e-3) as f32;
            if floor.is_finite() {
                row.above(t, floor, ABOVE_CAP)
            } else {
                None
            }
        };
        let Some(mut list) = list else {
            return self.choose(&row.row(), history, u);
        };
        // In id order, so that a list of every candidate is `sample`'s.
        list.sort_unstable_by_key(|&(id, _)| id);
        let whole = list.len() == st.count;
        self.candidates.clear();
        self.candidates
            .extend(list.iter().map(|&(id, score)| Candidate { id, score }));
        let total = (!whole && k == 0).then_some(st.total);
        match self.filter_and_draw(u, total) {
            Some(id) => id,
            None => self.choose(&row.row(), history, u),
        }
    }
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
    fn row(&self) -> Vec<f32> {
        self.to_vec()
    }
}
