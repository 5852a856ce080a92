//! Which one-row GEMVs take a streamed kernel (a shared-memory ring of
//! bulk copies filled before the PDL wait: kernels/stream.cuh with
//! gemv_dense.cu's bf16/f16 kernels and gemv_grouped_stream.cu's int8 one),
//! their geometry, and their launch. The other GEMV launches are
//! `super`'s; this module must not launch anything else.

use turbospark_backend::Quant;

use super::{GEMV_WARPS_PER_BLOCK, GLU_SEGS_SILU, GemvJob, GemvSegs};
use crate::Cuda;
use crate::kernels::Arg;
use crate::weight::{Dense, WeightData};

/// Threads of a streamed GEMV block: `GS_WARPS` = 8 consumer warps and
/// the producer's (kernels/stream.cuh).
const STREAM_THREADS: u32 = 32 * 9;
/// Values of each row a stage of a streamed GEMV's ring holds: 4 KB of
/// bf16 a bulk copy. Each copy costs the copy engine a fixed ~110 cycles
/// (H200: 1 KB copies streamed at half the rate), so copies are as long as
/// a ring of a few stages allows. A multiple of 256, so each lane's sum
/// runs in the order of the other dense kernels.
const STREAM_KC: u32 = 2048;
/// Stages of the ring (`GS_MAX_STAGES` at most): 96 KB a block, two in
/// flight while one is read (measured on the H200 against 5 × 16 KB and
/// 4 × 16 KB: 210 against 200 and 205 tok/s on Llama-8B bf16).
const STREAM_STAGES: u32 = 3;
/// The fewest stages a block must take for the ring to pay: filling and
/// draining it costs what it saves at the boundary on shorter launches
/// (H200: Llama-8B's o projection, 8 stages a block, ran 13.4 µs streamed
/// against 12.4; its q/k/v, 12 stages, 17.3 against 19.2).
const STREAM_MIN_STAGES: u32 = 12;
/// The most weight bytes a streamed bf16/f16 launch reads: a launch this
/// long gains nothing from an earlier start, and the other kernel reads
/// faster (Llama-8B's lm_head at 4.28 TB/s, against 3.85 for the ring's
/// best). The int8 ring has no such cap: see [`qx_stream`].
const STREAM_MAX_BYTES: u64 = 512 << 20;
/// The most dynamic shared memory a streamed bf16/f16 GEMV block takes
/// (set on its kernels when they load; the int8 one has
/// [`QX_STREAM_MAX_SHARED`]): a ring, x and the row sums, with room for the
/// next kernel's block beside it on the SM (sized for 228 KB, 1 KB of it
/// reserved a block; the 164 KB split of `kernels::CARVEOUT_PERCENT`
/// leaves ~50 KB beside it, where the 132 KB one left less than one
/// tensor-core attention block's ~20).
pub(crate) const STREAM_MAX_SHARED: u32 = 113 * 1024;

/// What both streamed kernels need of a launch: streaming on, one row of x
/// and one job (no experts), its matrices (codes and scales; dense ones
/// have no scales, address 0) 16-byte aligned for the bulk copies, and no
/// activation other than a dense MLP's gate/up pairs.
fn one_row_ring(be: &Cuda, t: &GemvSegs, j: &GemvJob) -> bool {
    let n = t.count as usize;
    let aligned = t.w[..n].iter().chain(&t.scales[..n]).all(|&p| p % 16 == 0);
    let glu_ok = t.glu == 0 || t.glu >= GLU_SEGS_SILU;
    be.stream_gemv && aligned && glu_ok && j.nx == 1 && j.jobs == 1 && j.experts == 0
}

/// The dynamic shared memory of a streamed GEMV launch (kernels/gemv_dense.cu's
/// `gemv_*_stream`, one block an SM), or None where the launch does not
/// take one: those kernels serve one row of x and one job of bf16/f16
/// weights (no experts, 16-byte aligned rows), with at least
/// [`STREAM_MIN_STAGES`] stages a block and at most [`STREAM_MAX_BYTES`],
/// where ring, x and sums fit, and only while `TURBOSPARK_CUDA_STREAM` is
/// not `0`. (Llama-8B's down projection, 14,336 values a row, does not fit:
/// its x takes 57 KB. A wide ring for it, one block of 153 or 185 KB an SM
/// with the int8 kernel's cap, measured 429.4 -> 426.9 tok/s on 16 layers
/// of bf16 (H200, thirty-second session), though that launch runs at 3.0
/// TB/s against the streamed gate/up's 4.06: the q/k/v launch after it
/// loses its ring fill beside it.)
fn stream_shared(be: &Cuda, w: &WeightData, t: &GemvSegs, j: &GemvJob, rows: u32) -> Option<u32> {
    let dense16 = matches!(
        w,
        WeightData::Dense {
            dtype: Dense::Bf16 | Dense::F16,
            ..
        }
    );
    if !(one_row_ring(be, t, j) && dense16 && j.k.is_multiple_of(8)) {
        return None;
    }
    let per_block = rows.div_ceil(be.sm_count);
    let stages = per_block.div_ceil(8) * j.k.div_ceil(STREAM_KC);
    if stages < STREAM_MIN_STAGES || u64::from(rows) * u64::from(j.k) * 2 > STREAM_MAX_BYTES {
        return None;
    }
    let ring = STREAM_STAGES * 8 * STREAM_KC * 2;
    // x (k f32), then a block's row sums (pairs for a glu launch).
    let shared = ring + 4 * j.k + 4 * (per_block + 1);
    (shared <= STREAM_MAX_SHARED).then_some(shared)
}

/// Most bytes a stage of a streamed int8 GEMV holds: 8 of its 4,096-value
/// rows, 2 of its 14,336-value ones.
const QX_STREAM_TILE: u32 = 36 * 1024;
/// The most dynamic shared memory a streamed int8 GEMV block takes (less
/// where the GPU allows less: `Cuda::qx_stream_shared`): a ring of four
/// stages, not the three of [`STREAM_MAX_SHARED`], within the 164 KB
/// L1/shared split that every decode kernel asks for
/// (`kernels::CARVEOUT_PERCENT`; with static memory and the 1 KB a block
/// reserves, 161 KB). Its copies are what its launches wait for (left
/// without their sums, the streamed gate/up took 35.6 µs of its 37.9), so
/// deeper is faster while the split holds it: H200, Llama-8B int8,
/// alternated, the driver choosing each kernel's split: 290.6, 289.8 tok/s
/// at 113 KB, 296.0 at 160 KB, 297.3, 296.3 at 200 KB (five and six
/// stages). Under one split a ring past it brings the split switches back:
/// H100, forty-seventh session, at 60%: 299.0-299.3 at 200 KB, 300.7-300.9
/// at 158 KB (and at 50%, 132 KB, 297.2-297.7 with a 126 KB ring of three
/// stages against 298.5-299.3 at 200 KB).
pub(crate) const QX_STREAM_MAX_SHARED: u32 = 158 * 1024;
/// `GS_MAX_STAGES` in kernels/stream.cuh.
const STREAM_MAX_STAGES: u32 = 16;

/// A streamed int8 GEMV launch's geometry: whole rows a stage, stages of
/// its ring, dynamic shared memory.
struct QxStream {
    rows: u32,
    stages: u32,
    shared: u32,
}

/// The geometry of a streamed int8 GEMV (kernels/gemv_grouped_stream.cu:
/// one block an SM), or None where the launch does not take one: those
/// kernels serve the integer-activation path (`qx`) of int8 weights on one
/// row of x and one job (no experts), rows of a multiple of 256 values
/// (whole 16-byte copies of codes and scales) in 16-byte aligned matrices,
/// with at least two stages of the ring fitting beside x in the block's
/// shared memory (`Cuda::qx_stream_shared`, see [`qx_ring`]), and only
/// while `TURBOSPARK_CUDA_STREAM` is not `0`. However long: unlike the
/// bf16 ring, the int8 one has no [`STREAM_MAX_BYTES`] (its 558 MB lm_head
/// on Llama-8B, H200, alternated in one call: 354.1, 353.6 tok/s on the
/// `_qx` kernel, which spanned 192 µs in place, 2.9 TB/s, against 357.6,
/// 359.0 streamed).
/// Int4 keeps the `_qx` kernels: streamed, it measured slower (H200,
/// Llama-8B: 313 against 385 tok/s; BENCHMARKS.md, twelfth session).
fn qx_stream(
    be: &Cuda,
    w: &WeightData,
    t: &GemvSegs,
    j: &GemvJob,
    rows: u32,
    qx: bool,
) -> Option<QxStream> {
    let WeightData::Quantized {
        quant: Quant::Int8, ..
    } = w
    else {
        return None;
    };
    // Whole 16-byte copies of a row's scales: k / 32 >> shift of them.
    let shift = t.scale_shift;
    if !(one_row_ring(be, t, j) && qx && j.k.is_multiple_of(256 << shift)) {
        return None;
    }
    qx_ring(
        j.k,
        shift,
        rows,
        be.sm_count,
        t.glu != 0,
        be.qx_stream_shared,
    )
}

/// A streamed int8 row's bytes: its codes (a byte a value) and f16 scales
/// (one a 32 << `shift` values).
fn qx_row_bytes(k: u32, shift: u32) -> u32 {
    k + ((k / 32) >> shift) * 2
}

/// The ring of a streamed int8 GEMV of `rows` rows of `k` values (glu
/// pairs or not) over `sms` blocks, in at most `cap` bytes of shared
/// memory: whole rows a stage (glu pairs need two at least), as many
/// stages as fit beside x and the row sums (at most `GS_MAX_STAGES`, and no
/// more than the block's rows fill), two at least.
fn qx_ring(k: u32, shift: u32, rows: u32, sms: u32, glu: bool, cap: u32) -> Option<QxStream> {
    let (groups, row) = (k / 32, qx_row_bytes(k, shift));
    let r = [8, 4, 2, 1]
        .into_iter()
        .find(|&r| r * row <= QX_STREAM_TILE)
        .filter(|&r| !glu || r >= 2)?;
    let per_block = rows.div_ceil(sms) + 2;
    // x's codes and steps, then each row's parts: a set of up to
    // `QS_ROWS` = 4 rows takes 8 / (r / set) warps.
    let parts = GEMV_WARPS_PER_BLOCK / (r / r.min(4));
    let fixed = k + groups * 4 + 4 * per_block * parts;
    let stages = (cap.checked_sub(fixed)? / (r * row))
        .min(STREAM_MAX_STAGES)
        .min(per_block.div_ceil(r));
    (stages >= 2).then_some(QxStream {
        rows: r,
        stages,
        shared: stages * r * row + fixed,
    })
}

/// Launches the streamed kernel for this GEMV (`table`, `j`: its segments
/// and job; `rows`: its rows, segments padded; `qx`: whether it takes the
/// integer-activation path) if one serves it, saying whether it did. Both
/// kernels take (segments, x, bias dtype, k) and two numbers of their ring:
/// the dense one values a row a stage and stages, the int8 one whole rows a
/// stage and stages.
pub(super) fn launch(
    be: &Cuda,
    w: &WeightData,
    table: &GemvSegs,
    j: &GemvJob,
    rows: u32,
    qx: bool,
    bias_dt: i32,
) -> bool {
    let (f, shared, ring) = if let Some(shared) = stream_shared(be, w, table, j, rows) {
        let f = match w {
            WeightData::Dense {
                dtype: Dense::F16, ..
            } => &be.k.gemv_f16_stream,
            _ => &be.k.gemv_bf16_stream,
        };
        (f, shared, [STREAM_KC, STREAM_STAGES])
    } else if let Some(st) = qx_stream(be, w, table, j, rows, qx) {
        (&be.k.gemv_q8_stream, st.shared, [st.rows, st.stages])
    } else {
        return false;
    };
    be.launch_shared(
        f,
        (1, be.sm_count, 1),
        STREAM_THREADS,
        shared,
        &[
            Arg::Segs(Box::new(*table)),
            Arg::Ptr(j.x),
            Arg::I32(bias_dt),
            Arg::U32(j.k),
            Arg::U32(ring[0]),
            Arg::U32(ring[1]),
        ],
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-8B's int8 launches on an H200 (132 SMs) at the int8 cap
    /// (158 KB): 8 rows of 4,096 values a stage (34 KB) four deep, 2 of
    /// 14,336 (30 KB) four deep; the 113 KB cap of the bf16 ring would give
    /// three of each.
    #[test]
    fn the_int8_ring_takes_four_stages_of_whole_rows() {
        let cap = QX_STREAM_MAX_SHARED;
        let ring = |k, rows, glu| {
            let q = qx_ring(k, 0, rows, 132, glu, cap).unwrap();
            assert!(q.shared <= cap);
            (q.rows, q.stages)
        };
        assert_eq!(qx_row_bytes(4096, 0), 4352);
        // 128-value scales (shift 2): the same rings, a quarter the scales.
        assert_eq!(qx_row_bytes(4096, 2), 4160);
        let q = qx_ring(4096, 2, 6144, 132, false, cap).unwrap();
        assert_eq!((q.rows, q.stages), (8, 4));
        assert_eq!(ring(4096, 6144, false), (8, 4)); // q/k/v
        assert_eq!(ring(4096, 4096, false), (8, 4)); // o
        assert_eq!(ring(4096, 28_672, true), (8, 4)); // gate/up pairs
        assert_eq!(ring(14_336, 4096, false), (2, 4)); // down
        let at_113 = |k, rows| {
            qx_ring(k, 0, rows, 132, false, STREAM_MAX_SHARED)
                .unwrap()
                .stages
        };
        assert_eq!((at_113(4096, 6144), at_113(14_336, 4096)), (3, 3));
        // A block's share of a short launch caps the stages: 300 rows over
        // 132 blocks is 5 rows a block, one stage of 8; two at least.
        assert!(qx_ring(4096, 0, 300, 132, false, cap).is_none());
        assert_eq!(ring(4096, 2000, false), (8, 3));
        // Nothing fits under x and the sums.
        assert!(qx_ring(4096, 0, 6144, 132, false, 20 * 1024).is_none());
    }

    /// Both rings' caps, with the 2 KB of static shared memory a streamed
    /// kernel may have (`Cuda::new`) and the 1 KB an SM reserves a block,
    /// fit the L1/shared split that `kernels::CARVEOUT_PERCENT` asks for on
    /// sm_90 (the driver takes the first of its configurations at or past
    /// that share of 228 KB): a block past the split would make its SM
    /// switch splits around the launch, the switches the one preference is
    /// there to remove.
    #[test]
    fn the_rings_fit_the_preferred_split() {
        const SM90_SPLITS_KB: [u32; 10] = [0, 8, 16, 32, 64, 100, 132, 164, 196, 228];
        let asked = 228 * 1024 * crate::kernels::CARVEOUT_PERCENT as u32 / 100;
        let split = SM90_SPLITS_KB
            .iter()
            .map(|kb| kb * 1024)
            .find(|&s| s >= asked)
            .unwrap();
        for cap in [QX_STREAM_MAX_SHARED, STREAM_MAX_SHARED] {
            assert!(
                cap + 2048 + 1024 <= split,
                "{cap} B past the {split} B split"
            );
        }
    }
}
