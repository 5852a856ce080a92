//! The sampler's passes over a vocabulary of candidates: building them,
//! top-k, the nucleus, ranks by weight and sums of weights; parallel over chunks in an
//! order that does not depend on the thread count (so neither do the
//! draws). The pipeline that uses them is `super`'s.

use rayon::prelude::*;
use turbospark_backend::scores;

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
/// nucleus is found by [`rank`], not by sorting the vocabulary (a sort of
/// 201,088 candidates costs ~8 ms a token, far more than a GPU decode
/// step).
pub(super) fn nucleus(
    cand: &mut Vec<Candidate>,
    top_p: f64,
    sorted: bool,
    given: Option<f64>,
) -> Option<bool> {
    let max = max_score(cand, sorted);
    let w = |c: &Candidate| weight(c.score, max);
    let reaches = |cum: f64, total: f64| cum >= top_p * total;
    let last = if sorted {
        let total = given.unwrap_or_else(|| cand.iter().map(w).sum());
        let mut cum = 0.0;
        cand.iter().copied().find(|c| {
            cum += w(c);
            reaches(cum, total)
        })
    } else {
        rank(cand, max, w, given, reaches)
    };
    match (last, given) {
        // Those at or before it in score order (a prefix when sorted).
        (Some(last), _) => cand.retain(|c| by_score_desc(c, &last).is_le()),
        (None, None) => {}
        (None, Some(_)) => return None,
    }
    let short = sorted || cand.len() <= SORT_BELOW;
    if !sorted && short {
        cand.sort_unstable_by(by_score_desc);
    }
    Some(short)
}

/// Lists up to this long are sorted by [`rank`] (and by [`nucleus`]);
/// longer ones are bucketed first.
const SORT_BELOW: usize = 2048;

/// The candidate at which the running sum of `w` over `cand` in score
/// order (highest first, then lowest id) first `reaches` its target, given
/// the total (`total`, or Σ w over `cand`); `None` when the whole sum does
/// not reach. `max` is the highest score; `cand` may be reordered (a short
/// list is sorted). Instead of a sort, the candidates are bucketed by how
/// far below the max they score (`scores::bucket`, as a backend holding
/// the row buckets them: a bucket's scores all rank below the previous
/// bucket's): the sums of the buckets (chunk by chunk in
/// parallel, the chunks' in order; also the total) show in which bucket
/// the sum reaches, and only that bucket's candidates are gathered, sorted
/// and walked. One weight a candidate, O(n) for n candidates spread over
/// the buckets; a row of equal scores is one bucket, sorted. The sums are
/// associated differently from a walk down the sorted list, so the result
/// can move only where the running sum lands within rounding of the target
/// (where the bucket's walk falls short of its sum, its last candidate is
/// taken).
pub(super) fn rank(
    cand: &mut [Candidate],
    max: f64,
    w: impl Fn(&Candidate) -> f64 + Sync,
    total: Option<f64>,
    reaches: impl Fn(f64, f64) -> bool,
) -> Option<Candidate> {
    if cand.len() <= SORT_BELOW {
        let total = total.unwrap_or_else(|| cand.iter().map(&w).sum());
        return walk_sorted(cand, 0.0, total, &w, &reaches);
    }
    // `max` is an f32 score widened: narrowing it back is exact.
    let bucket = |c: &Candidate| scores::bucket(max as f32, c.score);
    let sums = cand
        .par_chunks(CHUNK)
        .map(|ch| {
            let mut h = vec![0.0f64; scores::BUCKETS];
            for c in ch {
                h[bucket(c)] += w(c);
            }
            h
        })
        .collect::<Vec<_>>()
        .into_iter()
        .reduce(|mut a, b| {
            a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
            a
        })?;
    let total = total.unwrap_or_else(|| sums.iter().sum());
    let (b, acc) = reaching_bucket(&sums, total, &reaches)?;
    let mut members: Vec<Candidate> = cand
        .par_iter()
        .filter(|c| bucket(c) == b)
        .copied()
        .collect();
    walk_sorted(&mut members, acc, total, &w, &reaches).or_else(|| members.last().copied())
}

/// The bucket where the running sum of `sums` (bucket order) first
/// reaches its target given `total`, and the sum of the buckets before it.
pub(super) fn reaching_bucket(
    sums: &[f64],
    total: f64,
    reaches: impl Fn(f64, f64) -> bool,
) -> Option<(usize, f64)> {
    let mut acc = 0.0f64;
    for (b, s) in sums.iter().enumerate() {
        if reaches(acc + s, total) {
            return Some((b, acc));
        }
        acc += s;
    }
    None
}

/// Sorts `list` (a bucket's candidates, or a whole short list) and walks
/// it from `acc`: the candidate where the running sum reaches. (Where it
/// does not, but the bucket's sum did, rounding left the walk short: the
/// callers take the bucket's last.)
pub(super) fn walk_sorted(
    list: &mut [Candidate],
    mut acc: f64,
    total: f64,
    w: impl Fn(&Candidate) -> f64,
    reaches: impl Fn(f64, f64) -> bool,
) -> Option<Candidate> {
    list.sort_unstable_by(by_score_desc);
    list.iter().copied().find(|c| {
        acc += w(c);
        reaches(acc, total)
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
