//! Token choice and sampling on the device against the host definitions:
//! the device argmax against `turbospark_backend::argmax`, and the
//! summaries a sampler reads instead of a logits row (statistics, the
//! candidates above a floor, bucket sums and members, draws) against
//! `turbospark_backend::scores`, and through `Sampler::sample_from`
//! against the host sampler on the copied row.
//!
//! Without a CUDA device each test prints "skipped: no CUDA device" and
//! passes.

use turbospark_backend::Backend;
use turbospark_backend::scores::{self, Keep};
use turbospark_models::sampler::{Sampler, SamplerConfig};
use turbospark_models::session::BackendRow;

mod common;

use common::*;

/// Greedy choice on the device is the host's `argmax` on every row: random
/// rows of a real vocabulary's width, ties (the first wins), NaNs (never
/// win), all `-inf`, all NaN, and a row whose only maximum is the last id.
#[test]
fn argmax_on_the_device_is_the_host_argmax() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(22);
    let cols = 201_088;
    let mut rows: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(cols, 4.0)).collect();
    rows[1][70_000] = 9.0;
    rows[1][150_000] = 9.0;
    rows[1][3] = f32::NAN;
    rows.push(vec![f32::NEG_INFINITY; cols]);
    rows.push(vec![f32::NAN; cols]);
    let mut last = vec![-1.0; cols];
    last[cols - 1] = 0.0;
    rows.push(last);
    let data: Vec<f32> = rows.concat();
    let t = g.upload_tensor(&data, rows.len(), cols);
    let want: Vec<u32> = rows.iter().map(|r| turbospark_backend::argmax(r)).collect();
    assert_eq!(want[1], 70_000);
    assert_eq!(g.argmax(&t), want);
}

/// `argmax_into_batch` writes the host's `argmax` of each row as the batch
/// row's token (read back through `queue_tokens`/`take_tokens`) and moves
/// the host's copy of the positions on, launch after launch: its kernel
/// leaves its keys and tickets at zero for the next one (two launches on
/// different rows, the second's maxima below the first's).
#[test]
fn argmax_into_batch_is_the_host_argmax_launch_after_launch() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(31);
    let cols = 201_088;
    let mut b = g.batch(&[7, 8, 9], &[40, 41, 42]);
    for round in 0..2 {
        let scale = if round == 0 { 8.0 } else { 1.0 };
        let mut rows: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(cols, scale)).collect();
        rows[1][cols - 1] = 2.0 * scale;
        rows[2] = vec![f32::NAN; cols];
        let t = g.upload_tensor(&rows.concat(), 3, cols);
        g.argmax_into_batch(&t, &mut b);
        g.queue_tokens(&mut b);
        let want: Vec<u32> = rows.iter().map(|r| turbospark_backend::argmax(r)).collect();
        assert_eq!(g.take_tokens(&mut b), want, "launch {round}");
        assert_eq!(b.host_positions, [41 + round, 42 + round, 43 + round]);
    }
}

/// A read queued by `queue_tokens` finds the tokens as they were when it
/// was queued, however many choices were queued behind it before it is
/// taken (up to the ring's 7): the tokens `set_batch` gave when no choice
/// came between, then each of three choices, all taken at the end (the
/// device writes them into a ring of slots by position, which the host
/// reads). A read left behind 8 choices that have run says its token was
/// overwritten rather than return another step's.
#[test]
fn queued_reads_find_the_tokens_of_their_step() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(41);
    let cols = 5_000;
    let logits = |rng: &mut Rng| {
        let rows: Vec<Vec<f32>> = (0..2).map(|_| rng.vec(cols, 4.0)).collect();
        let want: Vec<u32> = rows.iter().map(|r| turbospark_backend::argmax(r)).collect();
        (g.upload_tensor(&rows.concat(), 2, cols), want)
    };
    let mut b = g.batch(&[5, 6], &[10, 20]);
    g.queue_tokens(&mut b);
    let mut want = vec![vec![5, 6]];
    for _ in 0..3 {
        let (t, w) = logits(&mut rng);
        g.argmax_into_batch(&t, &mut b);
        g.queue_tokens(&mut b);
        want.push(w);
    }
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&g.take_tokens(&mut b), w, "read {i}");
    }
    assert_eq!(b.host_positions, [13, 23]);

    // Set again: the ring's old slots (positions 11-13, 21-23) are stale.
    g.set_batch(&mut b, &[1, 2], &[30, 40]);
    let (t, w) = logits(&mut rng);
    g.argmax_into_batch(&t, &mut b);
    g.queue_tokens(&mut b);
    for _ in 0..7 {
        g.argmax_into_batch(&t, &mut b);
    }
    assert_eq!(g.take_tokens(&mut b), w, "a read with 7 choices behind it");
    g.queue_tokens(&mut b);
    for _ in 0..8 {
        g.argmax_into_batch(&t, &mut b);
    }
    // The read's event passes before the 8 choices run: a read back waits
    // for them, so the 8th has overwritten the slot when it is taken.
    g.argmax(&t);
    let lost = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.take_tokens(&mut b)))
        .expect_err("a read with 8 choices behind it");
    let msg = lost.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("position 38 was overwritten"), "{msg}");
}

/// One-row batches made one after another at the same positions, each
/// dropped with a choice queued behind its last read, read their own
/// tokens: the ring a dropped batch gives back (to the next one-row batch,
/// so that an eager decode allocates none a token) holds that batch's
/// slots for the same positions, and may still be written when handed on.
/// The rows are long (128 MB, tens of µs a choice) so that the device is
/// still choosing when the host asks: a read that took a slot whose tag
/// matches without waiting for its own choice finds the last batch's token
/// there (seen failing so on the H200).
#[test]
fn a_one_row_batch_reads_its_own_tokens_in_a_ring_handed_on() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(43);
    let cols = 1 << 25;
    let mut seen = Vec::new();
    for round in 0..3 {
        let row = rng.vec(cols, 4.0);
        let want = turbospark_backend::argmax(&row);
        let t = g.upload_tensor(&row, 1, cols);
        let mut b = g.batch(&[1], &[50]);
        for _ in 0..2 {
            g.argmax_into_batch(&t, &mut b);
            g.queue_tokens(&mut b);
        }
        assert_eq!(g.take_tokens(&mut b), [want], "batch {round}");
        seen.push(want);
    }
    seen.dedup();
    assert_eq!(seen.len(), 3, "each batch chose another token: {seen:?}");
}

/// The sampling summaries of the device are the host's
/// (`turbospark_backend::scores`) on rows of gpt-oss's vocabulary (peaked,
/// with NaN and −inf holes, with a +inf, all −inf): candidate counts, maxima
/// and +inf flags exactly, totals to 1e-12 (their sums run in another
/// order), the candidates above a floor as the same set of (id, score),
/// the cap honoured, draws by temperature alone and above min-p weights
/// the same ids at 64 values of u (the host's `None` for the +inf and all
/// −inf rows), bucket sums to 1e-12 and bucket members as the same sets;
/// and a sampler fed from the device draws what one fed the copied row
/// draws, for temperature alone, top-p (on a noisy row without peaks by
/// buckets), top-k and min-p.
#[test]
fn sampling_summaries_equal_the_hosts() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(27);
    let cols = 201_088;
    let peaked: Vec<f32> = rng
        .vec(cols, 3.0)
        .iter()
        .enumerate()
        .map(|(i, &l)| l + if i % 4_001 == 0 { 14.0 } else { 0.0 })
        .collect();
    let mut holes = peaked.clone();
    for i in (5..cols).step_by(13) {
        holes[i] = if i % 2 == 0 {
            f32::NAN
        } else {
            f32::NEG_INFINITY
        };
    }
    let mut infinite = peaked.clone();
    infinite[123_456] = f32::INFINITY;
    // A random model's row: no peaks, so top-p's nucleus is thousands.
    let noise = rng.vec(cols, 2.0);
    let rows = [
        peaked,
        holes,
        infinite,
        vec![f32::NEG_INFINITY; cols],
        noise,
    ];
    let t = g.upload_tensor(&rows.concat(), rows.len(), cols);
    for (r, host) in rows.iter().enumerate() {
        for temp in [0.7f32, 1.3] {
            let (want, got) = (scores::score_stats(host, temp), g.score_stats(&t, r, temp));
            let what = format!("row {r} at t = {temp}");
            assert_eq!(
                (got.count, got.max.to_bits(), got.pos_inf),
                (want.count, want.max.to_bits(), want.pos_inf),
                "{what}: count, max, +inf"
            );
            if want.count > 0 && !want.pos_inf {
                let rel = (got.total - want.total).abs() / want.total;
                assert!(
                    rel <= 1e-12,
                    "{what}: total {} vs {}",
                    got.total,
                    want.total
                );
            }
            // Draws by temperature alone and above min-p weights at
            // spread-out u (the same unless u · total lands within
            // rounding of a running sum).
            for min_w in [0.0, 0.05, 1.0] {
                for i in 0..64 {
                    let u = (f64::from(i) + 0.37) / 64.0;
                    assert_eq!(
                        g.draw(&t, r, temp, min_w, u),
                        scores::draw(host, temp, min_w, u),
                        "{what}: draw at u = {u} above weight {min_w}"
                    );
                }
            }
            if want.count == 0 || want.pos_inf {
                continue;
            }
            // Bucket sums and members, for every candidate, above a weight
            // and up to a nucleus's last (the 200th id's score and id).
            let (last_s, last_id) = (host[200] / temp, 200);
            for keep in [
                Keep::default(),
                Keep {
                    min_w: 0.05,
                    last: None,
                },
                Keep {
                    min_w: 0.0,
                    last: Some((last_s, last_id)),
                },
            ] {
                for rounded in [false, true] {
                    let want_sums = scores::score_buckets(host, temp, want.max, &keep, rounded);
                    let got_sums = g.score_buckets(&t, r, temp, want.max, &keep, rounded);
                    for (b, (got, want)) in got_sums.iter().zip(&want_sums).enumerate() {
                        assert!(
                            (got - want).abs() <= 1e-12 * want.abs(),
                            "{what}: bucket {b} of {keep:?} (rounded {rounded}): {got} vs {want}"
                        );
                    }
                }
                let b = scores::bucket(want.max, last_s);
                for cap in [4096, 3] {
                    let want_list = scores::bucket_members(host, temp, want.max, &keep, b, cap);
                    let got_list =
                        g.bucket_members(&t, r, temp, want.max, &keep, b, cap)
                            .map(|mut v| {
                                v.sort_unstable_by_key(|&(id, _)| id);
                                v
                            });
                    assert_eq!(
                        got_list, want_list,
                        "{what}: bucket {b} of {keep:?}, cap {cap}"
                    );
                }
            }
            for (floor, cap) in [
                (want.max - 2.0, 4096),
                (want.max - 9.0, 50_000),
                (want.max - 9.0, 10),
            ] {
                let want = scores::scores_above(host, temp, floor, cap);
                let got = g.scores_above(&t, r, temp, floor, cap).map(|mut v| {
                    v.sort_unstable_by_key(|&(id, _)| id);
                    v
                });
                let bits = |v: Option<Vec<(u32, f32)>>| {
                    v.map(|v| {
                        v.into_iter()
                            .map(|(i, s)| (i, s.to_bits()))
                            .collect::<Vec<_>>()
                    })
                };
                assert_eq!(bits(got), bits(want), "{what}: above {floor} (cap {cap})");
            }
        }
    }
    let configs = [
        SamplerConfig {
            temperature: 0.8,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.8,
            top_p: 0.9,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.8,
            top_p: 0.7,
            min_p: 0.5,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 1.1,
            top_k: 40,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.7,
            min_p: 0.05,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.9,
            top_k: 64,
            top_p: 0.95,
            min_p: 0.02,
            ..SamplerConfig::default()
        },
    ];
    for (r, host) in rows
        .iter()
        .enumerate()
        .filter(|(r, _)| [0, 1, 4].contains(r))
    {
        for cfg in &configs {
            let (mut on_device, mut on_host) =
                (Sampler::new(cfg.clone()), Sampler::new(cfg.clone()));
            let row = BackendRow {
                be: &*g,
                logits: &t,
                row: r,
            };
            for step in 0..30 {
                assert_eq!(
                    on_device.sample_from(&row, &[]),
                    on_host.sample(host, &[]),
                    "row {r}, {cfg:?}, draw {step}"
                );
            }
        }
    }
}
