//! Token choice on the device (kernels/sample.cu): greedy decoding reads
//! back one id per row instead of the logits, and sampling reads back the
//! summaries `turbospark_backend::scores` defines (statistics, the
//! candidates above a floor, weights by score bucket and a bucket's
//! members, a draw by temperature or min-p alone). It owns the launches
//! and the decoding of the kernels' outputs; the definitions of the
//! results are the host `turbospark_backend::argmax` and `scores`.

use cudarc::driver::CudaSlice;
use turbospark_backend::ScoreStats;
use turbospark_backend::scores::{self, Keep};

use crate::batch::TOKEN_RING;
use crate::kernels::{Arg, KeepArg};
use crate::{Cuda, CudaBatch, CudaTensor, DeviceBuf};

/// Threads per block, and the most blocks one row is split over.
const THREADS: u32 = 256;
const MAX_BLOCKS_PER_ROW: usize = 64;

pub fn argmax(be: &Cuda, t: &CudaTensor) -> Vec<u32> {
    if t.rows == 0 {
        return Vec::new();
    }
    if t.cols == 0 {
        return vec![0; t.rows];
    }
    let best = argmax_keys(be, be.ptr(&t.data), t.rows, t.cols);
    let keys = be
        .stream
        .clone_dtoh(&best.slice(..t.rows))
        .unwrap_or_else(|e| panic!("CUDA: reading back argmax: {e}"));
    keys.into_iter()
        .map(|k| if k == 0 { 0 } else { u32::MAX - k as u32 })
        .collect()
}

/// Queues `argmax_feed`: each row of `logits` chooses its batch row's next
/// token on the device, and the row's position moves one on.
pub fn argmax_into_batch(be: &Cuda, logits: &CudaTensor, b: &mut CudaBatch) {
    assert_eq!(
        logits.rows,
        b.rows(),
        "argmax_into_batch: {} rows of logits for a batch of {}",
        logits.rows,
        b.rows()
    );
    for p in &mut b.host_positions {
        *p += 1;
    }
    if logits.rows == 0 {
        return;
    }
    let ring = b.ring_dev(be);
    be.launch(
        &be.k.argmax_feed,
        (logits.rows as u32, blocks_per_row(logits.cols), 1),
        THREADS,
        &[
            Arg::Ptr(be.ptr(&b.argmax.0)),
            Arg::Ptr(be.ptr(&b.argmax.1)),
            Arg::Ptr(be.ptr(&logits.data)),
            Arg::U32(logits.cols as u32),
            Arg::Ptr(be.ptr(&b.tokens)),
            Arg::Ptr(be.ptr(&b.positions)),
            Arg::Ptr(ring),
            Arg::U32(TOKEN_RING as u32),
        ],
    );
    be.count_step(&b.steps);
}

/// Blocks of `argmax_rows` / `argmax_feed` a row of `cols` takes: about 8
/// values a thread, at least one block, at most MAX_BLOCKS_PER_ROW.
fn blocks_per_row(cols: usize) -> u32 {
    cols.div_ceil(THREADS as usize * 8)
        .clamp(1, MAX_BLOCKS_PER_ROW) as u32
}

/// argmax_rows's keys of `rows` rows of `cols` floats from address `x`
/// (queued, not read back).
fn argmax_keys(be: &Cuda, x: u64, rows: usize, cols: usize) -> DeviceBuf<u64> {
    // Zero = "no number seen" for every row.
    let best = be.zeros::<u64>(rows);
    be.launch(
        &be.k.argmax_rows,
        (rows as u32, blocks_per_row(cols), 1),
        THREADS,
        &[Arg::Ptr(be.ptr(&best)), Arg::Ptr(x), Arg::U32(cols as u32)],
    );
    best
}

/// Threads of the summary kernels (`SCORE_THREADS`).
const SCORE_THREADS: u32 = 256;

/// (blocks, ids a block) of the kernels whose blocks each take a
/// contiguous chunk of a row of `n` ids (`score_stats`, `score_buckets`,
/// `draw_weights`): about four ids a thread, at most one block an SM (and
/// at most 1,024: `draw_weights`' last block reads every block's part into
/// shared memory).
fn chunks(be: &Cuda, n: usize, threads: u32) -> (usize, usize) {
    let blocks = n
        .div_ceil(threads as usize * 4)
        .clamp(1, (be.sm_count as usize).min(1024));
    (blocks, n.div_ceil(blocks).max(1))
}

/// The device address of row `row` of `t`.
fn row_ptr(be: &Cuda, t: &CudaTensor, row: usize) -> u64 {
    assert!(row < t.rows, "sampling row {row} of {}", t.rows);
    be.ptr(&t.data) + (row * t.cols * std::mem::size_of::<f32>()) as u64
}

/// `turbospark_backend::scores::score_stats` of row `row` of `t`: one block
/// an SM takes a contiguous chunk each; the blocks' (count, max, +inf,
/// Σ exp(s − block max)) are combined here in block order, each block's
/// sum rescaled to the row's max (f64).
pub fn score_stats(be: &Cuda, t: &CudaTensor, row: usize, temp: f32) -> ScoreStats {
    let n = t.cols;
    let (blocks, chunk) = chunks(be, n, SCORE_THREADS);
    let part = be.scratch::<f64>(4 * blocks);
    be.launch(
        &be.k.score_stats,
        (blocks as u32, 1, 1),
        SCORE_THREADS,
        &[
            Arg::Ptr(be.ptr(&part)),
            Arg::Ptr(row_ptr(be, t, row)),
            Arg::U32(n as u32),
            Arg::F32(temp),
            Arg::U32(chunk as u32),
        ],
    );
    let p = be
        .stream
        .clone_dtoh(&part.slice(..4 * blocks))
        .unwrap_or_else(|e| panic!("CUDA: reading back score statistics: {e}"));
    let blocks: Vec<&[f64]> = p.chunks_exact(4).filter(|b| b[0] > 0.0).collect();
    let count = blocks.iter().map(|b| b[0] as usize).sum();
    let max = blocks
        .iter()
        .map(|b| b[1] as f32)
        .fold(f32::NEG_INFINITY, f32::max);
    let pos_inf = blocks.iter().any(|b| b[2] != 0.0);
    let total = if count == 0 || pos_inf {
        0.0
    } else {
        let m = f64::from(max);
        blocks.iter().map(|b| b[3] * (b[1] - m).exp()).sum()
    };
    ScoreStats {
        count,
        max,
        pos_inf,
        total,
    }
}

/// `turbospark_backend::scores::scores_above` of row `row` of `t` (in no
/// particular order): one readback of the count and up to `cap` pairs.
pub fn scores_above(
    be: &Cuda,
    t: &CudaTensor,
    row: usize,
    temp: f32,
    floor: f32,
    cap: usize,
) -> Option<Vec<(u32, f32)>> {
    assert!(floor.is_finite(), "scores_above: floor {floor}");
    let n = t.cols;
    let out = be.zeros::<u32>(1 + 2 * cap);
    be.launch(
        &be.k.scores_above,
        (list_blocks(be, n), 1, 1),
        SCORE_THREADS,
        &[
            Arg::Ptr(be.ptr(&out)),
            Arg::Ptr(row_ptr(be, t, row)),
            Arg::U32(n as u32),
            Arg::F32(temp),
            Arg::F32(floor),
            Arg::U32(cap as u32),
        ],
    );
    read_list(be, &out, cap)
}

/// Blocks of the listing kernels for a row of `n`: a thread an id, at most
/// four blocks an SM (grid-stride beyond).
fn list_blocks(be: &Cuda, n: usize) -> u32 {
    n.div_ceil(SCORE_THREADS as usize)
        .clamp(1, 4 * be.sm_count as usize) as u32
}

/// The list a listing kernel wrote (`take_slot`): `None` when its count
/// passed `cap`.
fn read_list(be: &Cuda, out: &CudaSlice<u32>, cap: usize) -> Option<Vec<(u32, f32)>> {
    let host = be
        .stream
        .clone_dtoh(&out.slice(..1 + 2 * cap))
        .unwrap_or_else(|e| panic!("CUDA: reading back candidates: {e}"));
    let count = host[0] as usize;
    (count <= cap).then(|| {
        host[1..1 + 2 * count]
            .chunks_exact(2)
            .map(|p| (p[0], f32::from_bits(p[1])))
            .collect()
    })
}

/// kernels/sample.cu's buckets (`turbospark_backend::scores::BUCKETS`).
const BUCKETS: usize = scores::BUCKETS;
/// Threads of `score_buckets` (`BUCKET_THREADS`).
const BUCKET_THREADS: u32 = 128;

fn keep_arg(keep: &Keep) -> Arg {
    let (has_last, (last_s, last_id)) = match keep.last {
        Some(l) => (1, l),
        None => (0, (0.0, 0)),
    };
    Arg::Keep(KeepArg {
        min_w: keep.min_w,
        has_last,
        last_s,
        last_id,
    })
}

/// `turbospark_backend::scores::score_buckets` of row `row` of `t`: one
/// block an SM, each a contiguous chunk summed into histograms of its own;
/// the last block to finish sums them in block order (`score_buckets`);
/// one readback of the sums.
pub fn score_buckets(
    be: &Cuda,
    t: &CudaTensor,
    row: usize,
    temp: f32,
    max: f32,
    keep: &Keep,
    rounded: bool,
) -> Vec<f64> {
    let n = t.cols;
    let (blocks, chunk) = chunks(be, n, BUCKET_THREADS);
    let out = be.scratch::<f64>(BUCKETS);
    let done = be.zeros::<u32>(1);
    let part = be.scratch::<f64>(blocks * BUCKETS);
    be.launch(
        &be.k.score_buckets,
        (blocks as u32, 1, 1),
        BUCKET_THREADS,
        &[
            Arg::Ptr(be.ptr(&out)),
            Arg::Ptr(be.ptr(&done)),
            Arg::Ptr(be.ptr(&part)),
            Arg::Ptr(row_ptr(be, t, row)),
            Arg::U32(n as u32),
            Arg::F32(temp),
            Arg::F32(max),
            keep_arg(keep),
            Arg::U32(u32::from(rounded)),
            Arg::U32(chunk as u32),
        ],
    );
    be.stream
        .clone_dtoh(&out.slice(..BUCKETS))
        .unwrap_or_else(|e| panic!("CUDA: reading back bucket sums: {e}"))
}

/// `turbospark_backend::scores::bucket_members` of row `row` of `t` (in no
/// particular order): one readback of the count and up to `cap` pairs.
#[allow(clippy::too_many_arguments)]
pub fn bucket_members(
    be: &Cuda,
    t: &CudaTensor,
    row: usize,
    temp: f32,
    max: f32,
    keep: &Keep,
    bucket: usize,
    cap: usize,
) -> Option<Vec<(u32, f32)>> {
    let out = be.zeros::<u32>(1 + 2 * cap);
    be.launch(
        &be.k.bucket_members,
        (list_blocks(be, t.cols), 1, 1),
        SCORE_THREADS,
        &[
            Arg::Ptr(be.ptr(&out)),
            Arg::Ptr(row_ptr(be, t, row)),
            Arg::U32(t.cols as u32),
            Arg::F32(temp),
            Arg::F32(max),
            keep_arg(keep),
            Arg::U32(bucket as u32),
            Arg::U32(cap as u32),
        ],
    );
    read_list(be, &out, cap)
}

/// kernels/sample.cu's "no id": the host samples the row itself.
const DRAW_NONE: u32 = u32::MAX;

/// `turbospark_backend::scores::draw` from row `row` of `t`: the row's
/// argmax key gives the max score, one block an SM sums its chunk's
/// weights, and the last block to finish finds the id (`draw_weights`);
/// one readback of that id. `None` where the kernel
/// leaves it to the host (no candidate, a +inf score, a walk that
/// rounding left short).
pub fn draw(be: &Cuda, t: &CudaTensor, row: usize, temp: f32, min_w: f64, u: f64) -> Option<u32> {
    let n = t.cols;
    let x = row_ptr(be, t, row);
    let best = argmax_keys(be, x, 1, n);
    let (blocks, chunk) = chunks(be, n, SCORE_THREADS);
    // [the id, the count of blocks done]
    let out = be.zeros::<u32>(2);
    let part = be.scratch::<f64>(blocks);
    be.launch(
        &be.k.draw_weights,
        (blocks as u32, 1, 1),
        SCORE_THREADS,
        &[
            Arg::Ptr(be.ptr(&out)),
            Arg::Ptr(be.ptr(&out) + 4),
            Arg::Ptr(be.ptr(&part)),
            Arg::Ptr(be.ptr(&best)),
            Arg::Ptr(x),
            Arg::U32(n as u32),
            Arg::F32(temp),
            // Double parameters, passed as their bits.
            Arg::U64(min_w.to_bits()),
            Arg::U64(u.to_bits()),
            Arg::U32(chunk as u32),
        ],
    );
    let id = be
        .stream
        .clone_dtoh(&out.slice(..1))
        .unwrap_or_else(|e| panic!("CUDA: reading back a draw: {e}"))[0];
    (id != DRAW_NONE).then_some(id)
}
