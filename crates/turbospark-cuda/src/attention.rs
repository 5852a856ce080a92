//! The KV store on the device and attention over it (kernels/attention.cu,
//! its splits merged by kernels/attention_combine.cu).
//!
//! The store is a ring of `capacity` slots with the CPU backend's semantics
//! (crates/turbospark-cpu/src/attention.rs): slot `p % capacity` holds the
//! key and value rows of position `p`, in the spec's [`KvDtype`] (every
//! kernel that touches the store comes in an f32 and a bf16 form,
//! kernels/kv_store.cuh), and `slot_pos` (i64, −1 = empty) remembers which
//! position each slot holds. This module owns the store and
//! the launch geometry (the slot range to scan, the split over it, and the
//! choice between the GQA kernel, which reads each KV row once for all the
//! query heads that share it, and the per-head one) of the split-KV
//! kernels, and sends prompt-sized calls (`Precision::Bf16`, head dims the
//! flash kernel has) to `crate::flash_attention`; writes into the store are
//! `crate::rope_kv`'s (one kernel with RoPE), except in a decode step's
//! fused kernel ([`rope_kv_attention`]: RoPE, the store write and
//! attention in one launch). It must not synchronise with the host.

use cudarc::driver::{CudaFunction, CudaSlice};
use turbospark_backend::{AttnParams, KvDtype, KvSpec, Result, RopeTable};
use turbospark_format::AttnSpan;

use crate::DeviceBuf;
use crate::flash_attention::{flash_attention, flash_supported};
use crate::kernels::{Arg, RopeFreqs};
use crate::memory::Purpose;
use crate::rope_kv::{Rotation, rope_kv_write};
use crate::weight::CudaWeight;
use crate::{Cuda, CudaBatch, CudaTensor, Precision};

/// Largest head_dim the attention kernel holds in registers.
pub const MAX_HEAD_DIM: usize = 256;
/// Fewest key slots one attention block scans.
const MIN_SLOTS_PER_SPLIT: usize = 32;
/// Fewest query rows that go to the tensor-core flash kernel (prefill);
/// fewer (decode) take the split-KV kernels, which compute in f32 on K/V
/// as stored.
const FLASH_MIN_ROWS: usize = 16;
/// Most splits of one (row, head): `ATT_MAX_SPLITS` in kernels/attention_combine.cu.
const MAX_SPLITS: usize = 256;
/// Warps the GQA kernel's splits aim for at least, per SM: each warp's
/// tiles are latency-bound (copy, score, softmax, values in turn), so the
/// SMs need many of them at once, and a decode step's kernel stages only
/// its first tile before waiting for the projection. 32 rather than 16
/// gives gpt-oss-20b at 2k positions one tile a split instead of two:
/// 415 -> 428 tok/s on the H200 (Llama-8B, already at one tile, unchanged;
/// 8 was slower for both).
const GQA_WARPS_PER_SM: usize = 32;
/// Threads of the combine kernel (`ATT_COMBINE_THREADS`): one a split.
const COMBINE_THREADS: u32 = 256;
const _: () = assert!(MAX_SPLITS <= COMBINE_THREADS as usize);

/// Tiles a window form stages at once (`W` of kernels/attention.cu's
/// `ATT_GQA_WINDOW`): 4 of 32 positions, gpt-oss's window of 128.
const WINDOW_TILES: usize = 4;

/// A GQA decode kernel (kernels/attention.cu), in its forms: the attention
/// alone, a decode step's fused kernel (`GqaStep`) and, where the shapes
/// have one, that step's window form for short sliding spans; its tile of
/// slots, and its warps a query head.
struct Gqa<'a> {
    plain: &'a CudaFunction,
    step: &'a CudaFunction,
    window: Option<&'a CudaFunction>,
    tile: usize,
    /// Warps a query head; 0 for the tensor-core forms (one warp a block).
    warps: usize,
}

impl Gqa<'_> {
    /// Threads of a block serving `group` query heads (the window form's
    /// too: it exists only beside split forms of its own kind, one warp a
    /// head or the tensor-core one warp a block).
    fn threads(&self, group: usize) -> u32 {
        match self.warps {
            0 => 32,
            w => (32 * group * w) as u32,
        }
    }
}

/// The GQA decode kernel for `head_dim` and `group` query heads per KV
/// head over a store of `dtype`, if one holds them (kernels/attention.cu:
/// head_dim whole 16-byte chunks of the store, i.e. a multiple of 4 for
/// f32 and of 8 for bf16, up to 64 with 16 heads a group, 128 with 8, 256
/// with 4), the one with the least shared memory; its tile is
/// `min(32, 4096 / (32 · ceil(hd / 32)))` slots (`GQA_TILE_VALUES`). Over a
/// bf16 store with head_dim exactly 64 or 128 and up to 8 heads a group,
/// the tensor-core forms (kernels/attention_mma.cuh) unless
/// `Cuda::set_mma_attention(false)`.
fn gqa_kernel(be: &Cuda, head_dim: usize, group: usize, dtype: KvDtype) -> Option<Gqa<'_>> {
    if !(head_dim * dtype.bytes()).is_multiple_of(16) {
        return None;
    }
    let k = &be.k;
    let window = |f| be.window_attention.then_some(f);
    // (hd, G, P, ...) as kernels/attention.cu's `ATT_GQA_KERNEL(name, J, G,
    // P)` lines: P warps a query head (two from head_dim 128 with four heads
    // a group; the window forms are hd 64's, one warp a head).
    let forms = match dtype {
        KvDtype::F32 => [
            (
                64,
                8,
                1,
                &k.attn_gqa_hd64_g8,
                &k.attn_gqa_hd64_g8_step,
                None,
            ),
            (
                64,
                16,
                1,
                &k.attn_gqa_hd64_g16,
                &k.attn_gqa_hd64_g16_step,
                None,
            ),
            (
                128,
                4,
                2,
                &k.attn_gqa_hd128_g4,
                &k.attn_gqa_hd128_g4_step,
                None,
            ),
            (
                128,
                8,
                1,
                &k.attn_gqa_hd128_g8,
                &k.attn_gqa_hd128_g8_step,
                None,
            ),
            (
                256,
                4,
                2,
                &k.attn_gqa_hd256_g4,
                &k.attn_gqa_hd256_g4_step,
                None,
            ),
        ],
        KvDtype::Bf16 => [
            (
                64,
                8,
                1,
                &k.attn_gqa_hd64_g8_bf16kv,
                &k.attn_gqa_hd64_g8_bf16kv_step,
                window(&k.attn_gqa_hd64_g8_bf16kv_window),
            ),
            (
                64,
                16,
                1,
                &k.attn_gqa_hd64_g16_bf16kv,
                &k.attn_gqa_hd64_g16_bf16kv_step,
                window(&k.attn_gqa_hd64_g16_bf16kv_window),
            ),
            (
                128,
                4,
                2,
                &k.attn_gqa_hd128_g4_bf16kv,
                &k.attn_gqa_hd128_g4_bf16kv_step,
                None,
            ),
            (
                128,
                8,
                1,
                &k.attn_gqa_hd128_g8_bf16kv,
                &k.attn_gqa_hd128_g8_bf16kv_step,
                None,
            ),
            (
                256,
                4,
                2,
                &k.attn_gqa_hd256_g4_bf16kv,
                &k.attn_gqa_hd256_g4_bf16kv_step,
                None,
            ),
        ],
    };
    let gqa = forms
        .into_iter()
        .find(|&(hd, g, ..)| head_dim <= hd && group <= g)
        .map(|(hd, _, warps, plain, step, window)| Gqa {
            plain,
            step,
            window,
            tile: (4096 / hd).min(32),
            warps,
        })?;
    // The tensor-core forms (head_dim exactly theirs, a bf16 store): the
    // same tiles, one warp a block.
    let mma = [
        (
            64,
            8,
            &k.attn_gqa_hd64_g8_bf16kv_mma,
            &k.attn_gqa_hd64_g8_bf16kv_mma_step,
            Some(&k.attn_gqa_hd64_g8_bf16kv_mma_window),
        ),
        (
            128,
            4,
            &k.attn_gqa_hd128_g4_bf16kv_mma,
            &k.attn_gqa_hd128_g4_bf16kv_mma_step,
            None,
        ),
        (
            128,
            8,
            &k.attn_gqa_hd128_g8_bf16kv_mma,
            &k.attn_gqa_hd128_g8_bf16kv_mma_step,
            None,
        ),
    ]
    .into_iter()
    .filter(|_| be.mma_attention && dtype == KvDtype::Bf16)
    .find(|&(hd, g, ..)| head_dim == hd && group <= g);
    Some(match mma {
        Some((_, _, plain, step, window)) => Gqa {
            plain,
            step,
            warps: 0,
            window: gqa.window.and(window),
            ..gqa
        },
        None => gqa,
    })
}

/// Slots per split of the GQA kernel for `range` slots and `units` (row,
/// KV head) pairs of `group` query heads: as many whole tiles a block as
/// still give at least [`GQA_WARPS_PER_SM`] heads an SM (warps, counted one
/// a head: the forms with two a head were measured at the same splits), and
/// at most [`MAX_SPLITS`] splits.
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
    /// `[capacity, kv_dim]` values of `spec.dtype`, as bytes.
    pub k: CudaSlice<u8>,
    pub v: CudaSlice<u8>,
    /// Position stored in each slot; −1 when empty.
    pub slot_pos: CudaSlice<i64>,
}

impl CudaKv {
    pub(crate) fn new(be: &Cuda, spec: KvSpec) -> Result<Self> {
        let bytes = spec.capacity * spec.kv_dim * spec.dtype.bytes();
        let what = || {
            format!(
                "a layer's KV cache ({} positions of {} {:?} keys and values)",
                spec.capacity, spec.kv_dim, spec.dtype
            )
        };
        let purpose = Purpose {
            what: &what,
            hint: match spec.dtype {
                KvDtype::F32 => turbospark_backend::KV_F32_HINT,
                KvDtype::Bf16 => turbospark_backend::KV_HINT,
            },
        };
        Ok(CudaKv {
            spec,
            k: be.try_zeros(bytes, &purpose)?,
            v: be.try_zeros(bytes, &purpose)?,
            slot_pos: be.try_upload(&vec![-1i64; spec.capacity], &purpose)?,
        })
    }

    /// The kernel of `f32` for an f32 store, else of `bf16`.
    pub(crate) fn pick<'a>(
        &self,
        f32: &'a CudaFunction,
        bf16: &'a CudaFunction,
    ) -> &'a CudaFunction {
        match self.spec.dtype {
            KvDtype::F32 => f32,
            KvDtype::Bf16 => bf16,
        }
    }

    /// (K, V, slot positions) copied to the host, K and V widened to f32
    /// (tests, debugging).
    pub fn to_host(&self, be: &Cuda) -> (Vec<f32>, Vec<f32>, Vec<i64>) {
        let n = self.spec.capacity * self.spec.kv_dim * self.spec.dtype.bytes();
        let get = |s: &CudaSlice<u8>| -> Vec<f32> {
            if n == 0 {
                return Vec::new();
            }
            let bytes = be
                .stream
                .clone_dtoh(&s.slice(..n))
                .unwrap_or_else(|e| panic!("CUDA: {e}"));
            match self.spec.dtype {
                KvDtype::F32 => bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                KvDtype::Bf16 => bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            }
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

/// The split-KV launch of one call: the GQA kernel (if one holds the
/// shapes), the slots scanned, cut into `splits` of `per_split`.
struct Splits<'a> {
    gqa: Option<Gqa<'a>>,
    lo: usize,
    hi: usize,
    per_split: usize,
    splits: usize,
}

fn splits<'a>(be: &'a Cuda, kv: &CudaKv, batch: &CudaBatch, p: &AttnParams) -> Splits<'a> {
    let n = batch.rows();
    // A recording must serve every later position: scan the whole ring
    // (each row's kernel blocks skip what its own position cannot see).
    let (lo, hi) = if be.recording() {
        (0, kv.spec.capacity)
    } else {
        slot_range(&batch.host_positions, kv.spec.capacity, p.span)
    };
    let group = p.num_heads / p.num_kv_heads;
    let gqa = gqa_kernel(be, p.head_dim, group, kv.spec.dtype);
    let range = hi - lo;
    let per_split = match &gqa {
        Some(k) => gqa_per_split(
            range,
            n * p.num_kv_heads,
            group,
            k.tile,
            be.sm_count as usize,
        ),
        None => {
            // About eight blocks an SM.
            let want = (8 * be.sm_count as usize).div_ceil(n * p.num_heads);
            let splits = want.clamp(1, range.div_ceil(MIN_SLOTS_PER_SPLIT).clamp(1, MAX_SPLITS));
            range.div_ceil(splits).max(1)
        }
    };
    Splits {
        gqa,
        lo,
        hi,
        per_split,
        splits: range.div_ceil(per_split).max(1),
    }
}

/// The arguments the split kernels share (`ATT_GQA_ARGS` without `splits`);
/// the partials' device addresses (0 for the window form, which has none).
#[allow(clippy::too_many_arguments)]
fn split_args(
    be: &Cuda,
    (part_o, part_ml): (u64, u64),
    q: &CudaTensor,
    kv: &CudaKv,
    batch: &CudaBatch,
    p: &AttnParams,
    window: i64,
    sp: &Splits,
) -> Vec<Arg> {
    vec![
        Arg::Ptr(part_o),
        Arg::Ptr(part_ml),
        Arg::Ptr(be.ptr(&q.data)),
        Arg::Ptr(be.ptr(&kv.k)),
        Arg::Ptr(be.ptr(&kv.v)),
        Arg::Ptr(be.ptr(&kv.slot_pos)),
        Arg::Ptr(be.ptr(&batch.positions)),
        Arg::U32(p.num_heads as u32),
        Arg::U32((p.num_heads / p.num_kv_heads) as u32),
        Arg::U32(p.head_dim as u32),
        Arg::U32(kv.spec.kv_dim as u32),
        Arg::F32(p.scale),
        Arg::F32(p.softcap.unwrap_or(0.0)),
        Arg::I64(window),
        Arg::U32(sp.lo as u32),
        Arg::U32(sp.hi as u32),
        Arg::U32(sp.per_split as u32),
        Arg::U32(kv.spec.capacity as u32),
    ]
}

/// Per-split partial outputs and (m, l) of `rows` query rows.
fn partials(
    be: &Cuda,
    rows: usize,
    p: &AttnParams,
    sp: &Splits,
) -> (DeviceBuf<f32>, DeviceBuf<f32>) {
    let rh = rows * p.num_heads;
    (
        be.scratch::<f32>(rh * sp.splits * p.head_dim),
        be.scratch::<f32>(rh * sp.splits * 2),
    )
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
    let (n, hd) = (batch.rows(), p.head_dim);
    assert!(
        hd > 0 && hd <= MAX_HEAD_DIM,
        "attention: head_dim {hd} (at most {MAX_HEAD_DIM})"
    );
    if n >= FLASH_MIN_ROWS && flash_supported(hd) && be.precision() == Precision::Bf16 {
        return flash_attention(be, q, kv, batch, p, sinks, out);
    }
    if let Some(args) = attn_args(be, q, kv, n, p, sinks, out) {
        split_attention(be, q, kv, batch, p, args, None, out);
    }
}

/// The split-KV kernels on `q`, then `attn_combine` into `out`: the GQA
/// kernel (its step form when `step` is given: one query row, a GQA
/// kernel's shapes) or the per-head one, one block a split.
#[allow(clippy::too_many_arguments)]
fn split_attention(
    be: &Cuda,
    q: &CudaTensor,
    kv: &CudaKv,
    batch: &CudaBatch,
    p: &AttnParams,
    AttnArgs { window, sinks }: AttnArgs,
    step: Option<GqaStep>,
    out: &mut CudaTensor,
) {
    let n = batch.rows();
    let sp = splits(be, kv, batch, p);
    let (part_o, part_ml) = partials(be, n, p, &sp);
    let parts = (be.ptr(&part_o), be.ptr(&part_ml));
    let mut args = split_args(be, parts, q, kv, batch, p, window, &sp);
    match (&sp.gqa, step) {
        // One block a split, one or two warps a query head.
        (Some(k), step) => {
            args.push(Arg::U32(sp.splits as u32));
            let f = match step {
                Some(st) => {
                    args.push(Arg::Step(Box::new(st)));
                    k.step
                }
                None => k.plain,
            };
            let grid = ((n * p.num_kv_heads) as u32, sp.splits as u32, 1);
            be.launch(f, grid, k.threads(p.num_heads / p.num_kv_heads), &args);
        }
        (None, None) => be.launch(
            kv.pick(&be.k.attn_partial, &be.k.attn_partial_bf16kv),
            ((n * p.num_heads) as u32, sp.splits as u32, 1),
            128,
            &args,
        ),
        (None, Some(_)) => unreachable!("attention: a step form without a GQA kernel"),
    }
    let parts = (&part_o, &part_ml);
    combine(be, out, parts, sinks, batch, kv, p, window, &sp);
}

/// Merges the splits' partials into `out` (`attn_combine`).
#[allow(clippy::too_many_arguments)]
fn combine(
    be: &Cuda,
    out: &mut CudaTensor,
    (part_o, part_ml): (&DeviceBuf<f32>, &DeviceBuf<f32>),
    (sink_ptr, sink_dt): (u64, i32),
    batch: &CudaBatch,
    kv: &CudaKv,
    p: &AttnParams,
    window: i64,
    sp: &Splits,
) {
    be.launch(
        &be.k.attn_combine,
        ((batch.rows() * p.num_heads) as u32, 1, 1),
        COMBINE_THREADS,
        &[
            Arg::Ptr(be.ptr(&out.data)),
            Arg::Ptr(be.ptr(part_o)),
            Arg::Ptr(be.ptr(part_ml)),
            Arg::Ptr(sink_ptr),
            Arg::I32(sink_dt),
            Arg::U32(p.num_heads as u32),
            Arg::U32(p.head_dim as u32),
            Arg::U32(sp.splits as u32),
            Arg::Ptr(be.ptr(&batch.positions)),
            Arg::I64(window),
            Arg::U32(sp.lo as u32),
            Arg::U32(sp.hi as u32),
            Arg::U32(sp.per_split as u32),
            Arg::U32(kv.spec.capacity as u32),
            Arg::I32(be.int4_linears().into()),
        ],
    );
}

/// `struct GqaStep` of kernels/attention.cu: what a decode step's fused
/// kernel does besides attention (device addresses).
#[repr(C)]
pub struct GqaStep {
    k: u64,
    v: u64,
    kc: u64,
    vc: u64,
    slot_pos: u64,
    out: u64,
    sinks: u64,
    factor: f32,
    pairs: u32,
    sinks_dt: i32,
    freqs: RopeFreqs,
}

/// `rope_kv_write(q, k, v)`, then `attention(q)`: on one query row whose
/// heads a GQA kernel holds (every decode step of the families here), the
/// GQA kernel's step form rotates q and k itself and stores k and v
/// (kernels/attention.cu, `GqaStep`) before `attn_combine` merges its
/// splits, leaving `q` and `k` as they came (not rotated): one launch
/// fewer. A sliding span whose window (or ring) fits the kernel's window
/// form ([`WINDOW_TILES`] tiles) takes that form instead: one block a KV
/// head over the window's positions, normalised in the kernel, with no
/// `attn_combine` (two launches fewer). Otherwise the two operations.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_attention(
    be: &Cuda,
    (q, k, v): (&mut CudaTensor, &mut CudaTensor, &CudaTensor),
    kv: &mut CudaKv,
    batch: &CudaBatch,
    rope: &RopeTable,
    p: &AttnParams,
    sinks: Option<&CudaWeight>,
    out: &mut CudaTensor,
) {
    let fused = batch.rows() == 1
        && kv.spec.capacity > 0
        && p.num_kv_heads > 0
        && gqa_kernel(be, p.head_dim, p.num_heads / p.num_kv_heads, kv.spec.dtype).is_some();
    if !fused {
        rope_kv_write(be, q, k, v, kv, p.head_dim, batch, rope);
        return attention(be, q, kv, batch, p, sinks, out);
    }
    assert!(
        (k.rows, k.cols) == (1, kv.spec.kv_dim) && (v.rows, v.cols) == (1, kv.spec.kv_dim),
        "rope_kv_attention: k and v are not [1, {}]",
        kv.spec.kv_dim
    );
    let Some(args) = attn_args(be, q, kv, 1, p, sinks, out) else {
        return;
    };
    let rot = Rotation::new(p.head_dim, rope);
    let step = GqaStep {
        k: be.ptr(&k.data),
        v: be.ptr(&v.data),
        kc: be.ptr(&kv.k),
        vc: be.ptr(&kv.v),
        slot_pos: be.ptr(&kv.slot_pos),
        out: be.ptr(&out.data),
        sinks: args.sinks.0,
        factor: rot.factor,
        pairs: rot.pairs as u32,
        sinks_dt: args.sinks.1,
        freqs: *rot.freqs,
    };
    match window_form(be, kv, p) {
        Some((f, threads)) => {
            // One block a KV head; no partials (the output is the step's).
            let sp = Splits {
                gqa: None,
                lo: 0,
                hi: kv.spec.capacity,
                per_split: kv.spec.capacity,
                splits: 1,
            };
            let mut a = split_args(be, (0, 0), q, kv, batch, p, args.window, &sp);
            a.extend([Arg::U32(1), Arg::Step(Box::new(step))]);
            be.launch(f, (p.num_kv_heads as u32, 1, 1), threads, &a);
        }
        None => split_attention(be, q, kv, batch, p, args, Some(step), out),
    }
}

/// The window form of the step's GQA kernel, and its block's threads, where the span
/// is sliding and its window's positions (at most the ring's capacity)
/// fit the form's staged tiles.
fn window_form<'a>(be: &'a Cuda, kv: &CudaKv, p: &AttnParams) -> Option<(&'a CudaFunction, u32)> {
    let AttnSpan::Sliding { window } = p.span else {
        return None;
    };
    let group = p.num_heads / p.num_kv_heads;
    let k = gqa_kernel(be, p.head_dim, group, kv.spec.dtype)?;
    let f = k.window?;
    (window.min(kv.spec.capacity) <= WINDOW_TILES * k.tile).then_some((f, k.threads(group)))
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
        // 32, 132 SMs. 4224 warps want 132 blocks a KV head; 68 tiles make
        // that one tile a split (68 splits, 2176 warps).
        assert_eq!(gqa_per_split(2176, 8, 4, 32, 132), 32);
        // gpt-oss (8 heads a group): 66 blocks a KV head, one tile each.
        assert_eq!(gqa_per_split(2176, 8, 8, 32, 132), 32);
        // A long context takes several tiles a split: 32768 / 32 = 1024
        // tiles over 132 blocks, 7 each.
        assert_eq!(gqa_per_split(32768, 8, 4, 32, 132), 7 * 32);
        // Splits are capped at MAX_SPLITS.
        let per = gqa_per_split(1 << 20, 1, 1, 32, 132);
        assert!((1usize << 20).div_ceil(per) <= MAX_SPLITS);
        assert_eq!(per % 32, 0);
        // Fewer slots than a tile: one split.
        assert_eq!(gqa_per_split(5, 1, 4, 32, 132), 32);
    }
}
