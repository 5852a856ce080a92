//! Tensor-core flash attention for prefill (kernels/flash_attention.cu):
//! many query rows over the ring KV store of [`crate::attention`], with the
//! same semantics as its split-KV kernels (visibility, GQA, scale, softcap
//! before the mask, sinks in the denominator only).
//!
//! One block computes 64 query rows of one head with bf16 `mma.sync`
//! operands and f32 accumulation: the documented precision trade of the
//! prefill path (bf16 rounds q, k, the probabilities and v to 8
//! significant bits; outputs differ from the f32 split-KV kernels by about
//! 2.5e-3 of their rms per element). Over a bf16 store the kernel copies
//! its tiles with cp.async into two stages of dynamic shared memory
//! ([`bf16_store_shared`], opted into when the backend starts); over an f32
//! store it converts them through registers. Supported head dims are
//! those of [`flash_supported`]; callers use the split-KV kernels for the
//! others and for decode.
//!
//! This module owns the launch of the flash kernels; it must not decide
//! when flash attention is used (the caller does), must not read positions
//! on the host or synchronise with it (the launch geometry depends only on
//! the row count and head count, so a recorded graph stays valid for any
//! later positions), and must not own the KV store.

use turbospark_backend::{AttnParams, KvDtype};

use crate::attention::{AttnArgs, CudaKv, attn_args};
use crate::kernels::Arg;
use crate::weight::CudaWeight;
use crate::{Cuda, CudaBatch, CudaTensor};

/// Query rows per block (4 warps × 16 rows); must match `FA_ROWS` in
/// kernels/flash_attention.cu.
const ROWS_PER_BLOCK: usize = 64;
/// Threads per block; must match `FA_THREADS`.
const THREADS: u32 = 128;

/// Key slots a tile of the kernel for `head_dim` holds (the `TILE` of its
/// `FLASH_ATTN` line).
fn tile(head_dim: usize) -> usize {
    if head_dim > 128 { 32 } else { 64 }
}

/// Dynamic shared memory of the bf16 store's kernel for `head_dim`
/// (`flash_attn_bf16`'s two stages of `STAGE` bf16: a K and a V tile of
/// rows of `head_dim + 8`). The f32 store's kernels take none.
pub(crate) fn bf16_store_shared(head_dim: usize) -> u32 {
    (2 * 2 * tile(head_dim) * (head_dim + 8) * 2) as u32
}

/// Whether the flash kernel handles `head_dim` (a kernel is instantiated
/// for each of these).
pub fn flash_supported(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128 | 256)
}

/// Attention of the rows of `q` (`[n, heads·head_dim]`), at the batch's
/// positions (read on the device), over `kv`, into `out` (same shape as
/// `q`). Panics when `p.head_dim` is not [`flash_supported`].
pub fn flash_attention(
    be: &Cuda,
    q: &CudaTensor,
    kv: &CudaKv,
    batch: &CudaBatch,
    p: &AttnParams,
    sinks: Option<&CudaWeight>,
    out: &mut CudaTensor,
) {
    let (n, hd, heads) = (batch.rows(), p.head_dim, p.num_heads);
    let positions = be.ptr(&batch.positions);
    assert!(
        flash_supported(hd),
        "flash_attention: head_dim {hd} is not supported (64, 128, 256)"
    );
    assert!(
        heads <= 65_535,
        "flash_attention: {heads} heads (grid y is at most 65535)"
    );
    let Some(AttnArgs { window, sinks }) = attn_args(be, q, kv, n, p, sinks, out) else {
        return;
    };
    let (sink_ptr, sink_dt) = sinks;
    let k = &be.k;
    let f = match hd {
        64 => kv.pick(&k.flash_attn_hd64, &k.flash_attn_hd64_bf16kv),
        128 => kv.pick(&k.flash_attn_hd128, &k.flash_attn_hd128_bf16kv),
        _ => kv.pick(&k.flash_attn_hd256, &k.flash_attn_hd256_bf16kv),
    };
    let shared = match kv.spec.dtype {
        KvDtype::F32 => 0,
        KvDtype::Bf16 => {
            // The tiles are copied in 16-byte chunks of the rows.
            assert!(
                kv.spec.kv_dim.is_multiple_of(8),
                "flash_attention: bf16 KV rows of {} values are not whole 16-byte chunks",
                kv.spec.kv_dim
            );
            bf16_store_shared(hd)
        }
    };
    be.launch_shared(
        f,
        (n.div_ceil(ROWS_PER_BLOCK) as u32, heads as u32, 1),
        THREADS,
        shared,
        &[
            Arg::Ptr(be.ptr(&out.data)),
            Arg::Ptr(be.ptr(&q.data)),
            Arg::Ptr(be.ptr(&kv.k)),
            Arg::Ptr(be.ptr(&kv.v)),
            Arg::Ptr(be.ptr(&kv.slot_pos)),
            Arg::Ptr(positions),
            Arg::Ptr(sink_ptr),
            Arg::I32(sink_dt),
            Arg::U32(n as u32),
            Arg::U32(heads as u32),
            Arg::U32((heads / p.num_kv_heads) as u32),
            Arg::U32(kv.spec.kv_dim as u32),
            Arg::U32(kv.spec.capacity as u32),
            Arg::F32(p.scale),
            Arg::F32(p.softcap.unwrap_or(0.0)),
            Arg::I64(window),
        ],
    );
}
