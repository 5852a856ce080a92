//! The sampler's passes over a vocabulary of candidates: building them,
//! top-k, the nucleus, ranks by weight and sums of weights; parallel over chunks in an
//! order that does not depend on the thread count (so neither do the
//! draws). The pipeline that uses them is `super`'s.

use rayon::prelude::*;

use super::{Candidate, by_score_desc, weight};

/// Fills `cand` with the scaled logits `l / t` that can be drawn (not NaN,
/// not −inf), in id order; returns whether any is +inf. A vocabulary with
/// nothing dropped (the usual row) is scaled in parallel, chunk by chunk;
/// either way the list is the same.
pub(super) fn candidates(logits: &[f32], t: f32, cand: &mut Vec<Candidate>) -> bool {
    let keep = |l: f32| l / t > f32::NEG_INFINITY;
    let fill = |(i, (out, ch)): (usize, (&mut [Candidate], &[f32]))| {
        let mut pos_inf = false;
        for (j, (c, &l)) in out.iter_mut().zip(ch).enumerate() {
            *c = Candidate {
                id: (i * CHUNK + j) as u32,
                score: l / t,
            };
            pos_inf |= c.score == f32::INFINITY;
        }
        pos_inf
    };
    if logits.len() > CHUNK && logits.par_iter().all(|&l| keep(l)) {
        cand.resize(logits.len(), Candidate { id: 0, score: 0.0 });
        return cand
            .par_chunks_mut(CHUNK)
            .zip(logits.par_chunks(CHUNK))
            .enumerate()
            .map(fill)
            .reduce(|| false, |a, b| a || b);
    }
    cand.clear();
    let mut pos_inf = false;
    for (id, &l) in logits.iter().enumerate() {
        if keep(l) {
            let score = l / t;
            pos_inf |= score == f32::INFINITY;
            cand.push(Candidate {
                id: id as u32,
                score,
            });
        }
    }
    pos_inf
}

/// Keeps the `k` best of `cand` (k < its length), sorted. A long list is
/// cut chunk by chunk first (each chunk's k best, in parallel: the k best
/// overall are among them), then once over what is left.
pub(super) fn top_k(cand: &mut Vec<Candidate>, k: usize) {
    if cand.len() > CHUNK && k < CHUNK {
        cand.par_chunks_mut(CHUNK).for_each(|ch| {
            if ch.len() > k {
                ch.select_nth_unstable_by(k - 1, by_score_desc);
            }
        });
        // Each chunk's first min(k, len) now hold its best: packed in front.
        let mut front = 0;
        for start in (0..cand.len()).step_by(CHUNK) {
            let n = k.min(cand.len() - start);
            cand.copy_within(start..start + n, front);
            front += n;
        }
        cand.truncate(front);
    }
    if k < cand.len() {
        cand.select_nth_unstable_by(k - 1, by_score_desc);
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_score_desc);
}

/// Keeps the nucleus of `cand`: its smallest prefix, highest score first,
/// whose weights reach `top_p` of the total weight; at least one, and all
/// of them when rounding keeps the sum short of it. With `given`, the total
/// of a row of which `cand` holds only the highest-scoring candidates:
/// `None` (nothing kept) when the nucleus reaches past them. Otherwise
/// whether the nucleus is left sorted: always when `sorted` (after top-k),
/// else when it is short; a long one (a flat row's: most of the
/// vocabulary) is left in no order, and [`rank`] draws from it.
/// When `cand` is not sorted yet (top-k is off: the whole vocabulary), the
/// total is summed in id order ([`chunked_sum`]) and the nucleus is found
/// by [`rank`], not by sorting the vocabulary (a sort of 201,088
/// candidates costs ~8 ms a token, far more than a GPU decode step).
pub(super) fn nucleus(
    cand: &mut Vec<Candidate>,
    top_p: f64,
    sorted: bool,
    parts: &mut Vec<f64>,
    given: Option<f64>,
) -> Option<bool> {
    let max = max_score(cand, sorted);
    let w = |c: &Candidate| weight(c.score, max);
    let total = given.unwrap_or_else(|| chunked_sum(cand, w, parts));
    let target = top_p * total;
    let reaches = |cum: f64| cum >= target;
    if sorted {
        let mut cum = 0.0;
        let end = cand.iter().position(|c| {
            cum += w(c);
            reaches(cum)
        });
        return match (end, given) {
            (Some(i), _) => {
                cand.truncate(i + 1);
                Some(true)
            }
            (None, None) => Some(true),
            (None, Some(_)) => None,
        };
    }
    // The search runs over the candidates scoring at least a floor first,
    // moved to the front: they are a prefix of the sorted order (ties
    // included), so the nucleus is either among them or found when the
    // search goes on over every candidate, whatever the floor. The floor
    // is where the nucleus should end: every candidate it holds weighs at
    // least (1 − top_p) · total / n, since the lighter ones together weigh
    // less than (1 − top_p) · total (its log, less 1e-3 for `exp`'s
    // rounding). On a peaked distribution that leaves a few hundred of a
    // vocabulary to search.
    let floor = ((1.0 - top_p) * total / cand.len() as f64).ln() + max - 1e-3;
    let mut front = 0;
    for j in 0..cand.len() {
        if f64::from(cand[j].score) >= floor {
            cand.swap(front, j);
            front += 1;
        }
    }
    let end = match rank(&mut cand[..front], w, reaches, parts) {
        Some(i) => Some(i),
        None => rank(cand, w, reaches, parts),
    };
    match (end, given) {
        (Some(i), _) => cand.truncate(i + 1),
        (None, None) => {}
        (None, Some(_)) => return None,
    }
    let short = cand.len() <= SORT_BELOW;
    if short {
        cand.sort_unstable_by(by_score_desc);
    }
    Some(short)
}

/// Lists up to this long are sorted by [`rank`] (and by [`nucleus`]);
/// longer ones are halved.
const SORT_BELOW: usize = 2048;

/// Where the running sum of `w` over `cand` in score order (highest first,
/// then lowest id) first `reaches` (a test that stays true once true):
/// rearranges `cand` so that `cand[..=i]` are the candidates up to and
/// including that one, in no particular order, and returns i; `None` when
/// the whole sum does not reach. Instead of sorting, it halves the range
/// still searched: the better half is selected (`select_nth_unstable`)
/// and summed, and the search goes on in it or, past its sum, in the
/// other; under [`SORT_BELOW`] candidates what is left is sorted and
/// walked. O(n) for a range of n. The sum is associated differently from
/// a walk down the sorted list, so a boundary can move only where the
/// running sum lands within rounding of the target.
pub(super) fn rank(
    cand: &mut [Candidate],
    w: impl Fn(&Candidate) -> f64 + Sync,
    reaches: impl Fn(f64) -> bool,
    parts: &mut Vec<f64>,
) -> Option<usize> {
    // Everything before `lo` precedes the searched range in score order
    // and weighs `acc`; everything from `hi` on follows it.
    let (mut lo, mut hi, mut acc) = (0, cand.len(), 0.0f64);
    while hi - lo > SORT_BELOW {
        let half = (hi - lo) / 2;
        cand[lo..hi].select_nth_unstable_by(half, by_score_desc);
        let better = chunked_sum(&cand[lo..lo + half], &w, parts);
        if reaches(acc + better) {
            hi = lo + half;
        } else {
            acc += better;
            lo += half;
        }
    }
    cand[lo..hi].sort_unstable_by(by_score_desc);
    (lo..hi).find(|&i| {
        acc += w(&cand[i]);
        reaches(acc)
    })
}

/// The highest score of `cand` (non-empty; the first when `sorted`).
pub(super) fn max_score(cand: &[Candidate], sorted: bool) -> f64 {
    f64::from(if sorted {
        cand[0].score
    } else {
        cand.iter()
            .map(|c| c.score)
            .fold(f32::NEG_INFINITY, f32::max)
    })
}

/// Candidates a chunk of the parallel passes ([`candidates`], [`top_k`],
/// [`chunked_sum`], the weighing before the draw).
pub(super) const CHUNK: usize = 8192;

/// Σ f(c) over `cand`: each CHUNK-long piece summed in order, then the
/// pieces' sums in order, so that the result does not depend on the thread
/// count (pieces run in parallel where there are several; a list of one
/// chunk or less is a plain left-to-right sum). `f` is an `exp` per
/// candidate: over a vocabulary that is most of a sampled token's host time.
pub(super) fn chunked_sum(
    cand: &[Candidate],
    f: impl Fn(&Candidate) -> f64 + Sync,
    parts: &mut Vec<f64>,
) -> f64 {
    let part = |ch: &[Candidate]| ch.iter().map(&f).sum::<f64>();
    if cand.len() > CHUNK {
        cand.par_chunks(CHUNK).map(part).collect_into_vec(parts);
    } else {
        parts.clear();
        parts.push(part(cand));
    }
    parts.iter().sum()
}
