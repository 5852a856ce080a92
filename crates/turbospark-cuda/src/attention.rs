//! The KV store on the device and attention over it (kernels/attention.cu).
//!
//! The store is a ring of `capacity` slots with the CPU backend's semantics
//! (crates/turbospark-cpu/src/attention.rs): slot `p % capacity` holds the
//! f32 key and value rows of position `p`, and `slot_pos` (i64, −1 = empty)
//! remembers which position each slot holds. This module owns the store and
//! the launch geometry (the slot range to scan, the split over it, and the
//! choice between the GQA kernel, which reads each KV row once for all the
//! query heads that share it, and the per-head one) of the split-KV
//! kernels, and sends prompt-sized calls (`Precision::Bf16`, head dims the
//! flash kernel has) to `crate::flash_attention`; writes into the store are
//! `crate::rope_kv`'s (one kernel with RoPE). It must not synchronise with
//! the host.

use cudarc::driver::CudaSlice;
use turbospark_backend::{AttnParams, KvSpec};
use turbospark_format::AttnSpan;

use crate::flash_attention::{flash_attention, flash_supported};
use crate::kernels::Arg;
use crate::weight::CudaWeight;
use crate::{Cuda, CudaBatch, CudaTensor, Precision};

/// Largest head_dim the attention kernel holds in registers.
pub const MAX_HEAD_DIM: usize = 256;
/// Fewest key slots one attention block scans.
const MIN_SLOTS_PER_SPLIT: usize = 32;
/// Fewest query rows that go to the tensor-core flash kernel (prefill);
/// fewer (decode) take the split-KV kernels, which read f32 K/V exactly.
const FLASH_MIN_ROWS: usize = 16;
/// Most splits of one (row, head): `ATT_MAX_SPLITS` in kernels/attention.cu.
const MAX_SPLITS: usize = 256;
/// Warps the GQA kernel's splits aim for at least, per SM: each warp's
/// tiles are latency-bound (copy, score, softmax, values in turn), so the
/// SMs need many of them at once.
const GQA_WARPS_PER_SM: usize = 16;
/// Threads of the combine kernel (`ATT_COMBINE_THREADS`): one a split.
const COMBINE_THREADS: u32 = 256;
const _: () = assert!(MAX_SPLITS <= COMBINE_THREADS as usize);

/// The GQA decode kernel for `head_dim` and `group` query heads per KV
/// head, if one holds them (kernels/attention.cu: head_dim a multiple of 4,
/// up to 64 with 16 heads a group, 128 with 8, 256 with 4), the one with the
/// least shared memory, and its tile: `min(32, 4096 / (32 · ceil(hd / 32)))`
/// slots (`GQA_TILE_VALUES`).
fn gqa_kernel(
    be: &Cuda,
    head_dim: usize,
    group: usize,
) -> Option<(&cudarc::driver::CudaFunction, usize)> {
    if !head_dim.is_multiple_of(4) {
        return None;
    }
    let k = &be.k;
    [
        (64, 8, &k.attn_gqa_hd64_g8),
        (64, 16, &k.attn_gqa_hd64_g16),
        (128, 4, &k.attn_gqa_hd128_g4),
        (128, 8, &k.attn_gqa_hd128_g8),
        (256, 4, &k.attn_gqa_hd256_g4),
    ]
    .into_iter()
    .find(|&(hd, g, _)| head_dim <= hd && group <= g)
    .map(|(hd, _, f)| (f, (4096 / hd).min(32)))
}

/// Slots per split of the GQA kernel for `range` slots and `units` (row,
/// KV head) pairs of `group` warps (one a query head): as many whole tiles
/// a block as still give at least [`GQA_WARPS_PER_SM`] warps an SM, and at
/// most [`MAX_SPLITS`] splits.
fn gqa_per_split(range: usize, units: usize, group: usize, tile: usize, sm_count: usize) -> usize {
    let tiles = range.div_ceil(tile).max(1);
    let blocks = (GQA_WARPS_PER_SM * sm_count).div_ceil(units * group);
    let mut per_split = (tiles / blocks.max(1)).max(1) * tile;
    while range.div_ceil(per_split) > MAX_SPLITS {
        per_split += tile;
    }
    per_split
}

pub struct CudaKv {
    pub spec: KvSpec,
    /// `[capacity, kv_dim]` f32.
    pub k: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
    /// Position stored in each slot; −1 when empty.
    pub slot_pos: CudaSlice<i64>,
}

impl CudaKv {
    pub(crate) fn new(be: &Cuda, spec: KvSpec) -> Self {
        let n = spec.capacity * spec.kv_dim;
        CudaKv {
            spec,
            k: be.zeros(n),
            v: be.zeros(n),
            slot_pos: be.upload_slice(&vec![-1i64; spec.capacity]),
        }
    }

    /// (K, V, slot positions) copied to the host (tests, debugging).
    pub fn to_host(&self, be: &Cuda) -> (Vec<f32>, Vec<f32>, Vec<i64>) {
        let n = self.spec.capacity * self.spec.kv_dim;
        let get = |s: &CudaSlice<f32>| -> Vec<f32> {
            if n == 0 {
                return Vec::new();
            }
            be.stream
                .clone_dtoh(&s.slice(..n))
                .unwrap_or_else(|e| panic!("CUDA: {e}"))
        };
        let pos = be
            .stream
            .clone_dtoh(&self.slot_pos.slice(..self.spec.capacity))
            .unwrap_or_else(|e| panic!("CUDA: {e}"));
        (get(&self.k), get(&self.v), pos)
    }
}

/// The slots that can hold a key visible to some query: while no position
/// of the queries has wrapped the ring, position p sits in slot p, so only
/// slots up to the largest query position (and, for a sliding span, from
/// the smallest query's window start) need scanning; anything else there is
/// a stale position beyond every query and invisible anyway. (The kernel
/// narrows this further per query row, from the positions it reads.)
fn slot_range(positions: &[u32], capacity: usize, span: AttnSpan) -> (usize, usize) {
    let max = positions.iter().copied().max().unwrap_or(0) as usize;
    let min = positions.iter().copied().min().unwrap_or(0) as usize;
    if max >= capacity {
        return (0, capacity);
    }
    let lo = match span {
        AttnSpan::Full => 0,
        AttnSpan::Sliding { window } => (min + 1).saturating_sub(window),
    };
    (lo, max + 1)
}

/// What both attention kernels read besides the tensors: the window
/// (0 = full span) and the sinks as (device address, dtype code; 0 = none).
pub(crate) struct AttnArgs {
    pub window: i64,
    pub sinks: (u64, i32),
}

/// Checks the shapes of one attention call (`n` query rows) and resolves
/// its [`AttnArgs`]; `None` when there is nothing to compute.
pub(crate) fn attn_args(
    be: &Cuda,
    q: &CudaTensor,
    kv: &CudaKv,
    n: usize,
    p: &AttnParams,
    sinks: Option<&CudaWeight>,
    out: &CudaTensor,
) -> Option<AttnArgs> {
    let (hd, heads) = (p.head_dim, p.num_heads);
    assert_eq!(
        (q.rows, q.cols),
        (n, heads * hd),
        "attention: q is not [{n}, {heads}·{hd}]"
    );
    assert_eq!(
        (out.rows, out.cols),
        (q.rows, q.cols),
        "attention: out differs from q"
    );
    assert!(
        p.num_kv_heads > 0 && heads % p.num_kv_heads == 0,
        "attention: {heads} heads over {} KV heads",
        p.num_kv_heads
    );
    assert!(
        p.num_kv_heads * hd <= kv.spec.kv_dim,
        "attention: KV rows are too narrow"
    );
    if n == 0 || heads == 0 {
        return None;
    }
    let window = match p.span {
        AttnSpan::Full => 0,
        AttnSpan::Sliding { window } => {
            assert!(window > 0, "attention: a sliding window of 0");
            window as i64
        }
    };
    let sinks = match sinks {
        Some(s) => {
            assert_eq!(
                s.numel(),
                heads,
                "attention: {} sinks for {heads} heads",
                s.numel()
            );
            s.dense_ptr(be, "sinks")
        }
        None => (0, 0),
    };
    Some(AttnArgs { window, sinks })
}

pub fn attention(
    be: &Cuda,
    q: &CudaTensor,
    kv: &CudaKv,
    batch: &CudaBatch,
    p: &AttnParams,
    sinks: Option<&CudaWeight>,
    out: &mut CudaTensor,
) {
    let (n, hd, heads) = (batch.rows(), p.head_dim, p.num_heads);
    assert!(
        hd > 0 && hd <= MAX_HEAD_DIM,
        "attention: head_dim {hd} (at most {MAX_HEAD_DIM})"
    );
    if n >= FLASH_MIN_ROWS && flash_supported(hd) && be.precision() == Precision::Bf16 {
        return flash_attention(be, q, kv, batch, p, sinks, out);
    }
    let Some(AttnArgs { window, sinks }) = attn_args(be, q, kv, n, p, sinks, out) else {
        return;
    };
    // A recording must serve every later position: scan the whole ring
    // (each row's kernel blocks skip what its own position cannot see).
    let (lo, hi) = if be.recording() {
        (0, kv.spec.capacity)
    } else {
        slot_range(&batch.host_positions, kv.spec.capacity, p.span)
    };
    let rh = n * heads;
    let group = heads / p.num_kv_heads;
    let gqa = gqa_kernel(be, hd, group);
    let range = hi - lo;
    let per_split = match gqa {
        Some((_, tile)) => {
            gqa_per_split(range, n * p.num_kv_heads, group, tile, be.sm_count as usize)
        }
        None => {
            // About eight blocks an SM.
            let want = (8 * be.sm_count as usize).div_ceil(rh);
            let splits = want.clamp(1, range.div_ceil(MIN_SLOTS_PER_SPLIT).clamp(1, MAX_SPLITS));
            range.div_ceil(splits).max(1)
        }
    };
    let splits = range.div_ceil(per_split).max(1);

    let part_o = be.scratch::<f32>(rh * splits * hd);
    let part_ml = be.scratch::<f32>(rh * splits * 2);
    let mut args = vec![
        Arg::Ptr(be.ptr(&part_o)),
        Arg::Ptr(be.ptr(&part_ml)),
        Arg::Ptr(be.ptr(&q.data)),
        Arg::Ptr(be.ptr(&kv.k)),
        Arg::Ptr(be.ptr(&kv.v)),
        Arg::Ptr(be.ptr(&kv.slot_pos)),
        Arg::Ptr(be.ptr(&batch.positions)),
        Arg::U32(heads as u32),
        Arg::U32(group as u32),
        Arg::U32(hd as u32),
        Arg::U32(kv.spec.kv_dim as u32),
        Arg::F32(p.scale),
        Arg::F32(p.softcap.unwrap_or(0.0)),
        Arg::I64(window),
        Arg::U32(lo as u32),
        Arg::U32(hi as u32),
        Arg::U32(per_split as u32),
        Arg::U32(kv.spec.capacity as u32),
    ];
    match gqa {
        // One block a split, one warp a query head.
        Some((f, _)) => {
            args.push(Arg::U32(splits as u32));
            let grid = ((n * p.num_kv_heads) as u32, splits as u32, 1);
            be.launch(f, grid, 32 * group as u32, &args);
        }
        None => be.launch(
            &be.k.attn_partial,
            (rh as u32, splits as u32, 1),
            128,
            &args,
        ),
    }
    let (sink_ptr, sink_dt) = sinks;
    be.launch(
        &be.k.attn_combine,
        (rh as u32, 1, 1),
        COMBINE_THREADS,
        &[
            Arg::Ptr(be.ptr(&out.data)),
            Arg::Ptr(be.ptr(&part_o)),
            Arg::Ptr(be.ptr(&part_ml)),
            Arg::Ptr(sink_ptr),
            Arg::I32(sink_dt),
            Arg::U32(heads as u32),
            Arg::U32(hd as u32),
            Arg::U32(splits as u32),
            Arg::Ptr(be.ptr(&batch.positions)),
            Arg::I64(window),
            Arg::U32(lo as u32),
            Arg::U32(hi as u32),
            Arg::U32(per_split as u32),
            Arg::U32(kv.spec.capacity as u32),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_range_covers_every_visible_key() {
        // Before the ring wraps: slots 0..=max, from the window start.
        assert_eq!(slot_range(&[5, 6, 7], 16, AttnSpan::Full), (0, 8));
        assert_eq!(
            slot_range(&[5, 6, 7], 16, AttnSpan::Sliding { window: 3 }),
            (3, 8)
        );
        assert_eq!(
            slot_range(&[1], 16, AttnSpan::Sliding { window: 3 }),
            (0, 2)
        );
        // Once a query position reaches the capacity, the whole ring.
        assert_eq!(
            slot_range(&[15, 16], 16, AttnSpan::Sliding { window: 4 }),
            (0, 16)
        );
    }

    #[test]
    fn gqa_splits_are_whole_tiles_and_fill_the_sms() {
        // Llama-3-8B decode at 2176 slots: 8 KV heads of 4 warps, tiles of
        // 32, 132 SMs. 2112 warps want 66 blocks a KV head; 68 tiles make
        // that one tile a split (68 splits, 2176 warps).
        assert_eq!(gqa_per_split(2176, 8, 4, 32, 132), 32);
        // gpt-oss (8 heads a group): 33 blocks a KV head, two tiles each.
        assert_eq!(gqa_per_split(2176, 8, 8, 32, 132), 64);
        // A long context takes several tiles a split: 32768 / 32 = 1024
        // tiles over 66 blocks, 15 each.
        assert_eq!(gqa_per_split(32768, 8, 4, 32, 132), 15 * 32);
        // Splits are capped at MAX_SPLITS.
        let per = gqa_per_split(1 << 20, 1, 1, 32, 132);
        assert!((1usize << 20).div_ceil(per) <= MAX_SPLITS);
        assert_eq!(per % 32, 0);
        // Fewer slots than a tile: one split.
        assert_eq!(gqa_per_split(5, 1, 4, 32, 132), 32);
    }
}
