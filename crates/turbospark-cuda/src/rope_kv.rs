//! RoPE and the KV store write (kernels/rope_kv.cu): one kernel serves
//! `rope` (rotate one tensor), `kv_write` (store rows of k and v) and their
//! fusion `rope_kv_write` (rotate q and k, store the rotated k and v: one
//! launch where the unfused path takes three), each launched with the parts
//! it needs, so the three agree bit for bit. The store itself (layout, slot
//! semantics) is [`crate::attention`]'s. This module checks shapes and
//! launches; it must not synchronise with the host (positions are read on
//! the device, and the launch geometry depends only on the row count and
//! widths, so a recorded graph serves any later positions).

use turbospark_backend::RopeTable;

use crate::attention::CudaKv;
use crate::kernels::{Arg, BLOCK, RopeFreqs, grid_for};
use crate::{Cuda, CudaBatch, CudaTensor};

/// What rotates: pairs `0..pairs` of each `head_dim`-wide head by the
/// table's frequencies, cos and sin scaled by `factor`.
pub(crate) struct Rotation {
    head_dim: usize,
    pub pairs: usize,
    pub freqs: Box<RopeFreqs>,
    pub factor: f32,
}

impl Rotation {
    pub(crate) fn new(head_dim: usize, rope: &RopeTable) -> Self {
        // Pairs beyond the table stay as they are, as on the CPU.
        let pairs = rope.inv_freq.len().min(head_dim / 2);
        let mut freqs = Box::new(RopeFreqs([0.0; 256]));
        assert!(
            pairs <= freqs.0.len(),
            "rope: more than {} frequencies",
            freqs.0.len()
        );
        freqs.0[..pairs].copy_from_slice(&rope.inv_freq[..pairs]);
        Rotation {
            head_dim,
            pairs,
            freqs,
            factor: rope.attention_factor,
        }
    }

    /// Nothing rotates: rows of `width` are copied as one head.
    fn none(width: usize) -> Self {
        Rotation {
            head_dim: width,
            pairs: 0,
            freqs: Box::new(RopeFreqs([0.0; 256])),
            factor: 1.0,
        }
    }
}

/// One launch over the batch's rows: `q` (device address, width) rotated
/// in place; `kv` (k address, v address, store) rows of the store's width
/// written at slots `position % capacity`, k rotated in place first.
fn launch(
    be: &Cuda,
    batch: &CudaBatch,
    rot: Rotation,
    q: Option<(u64, usize)>,
    kv: Option<(u64, u64, &mut CudaKv)>,
) {
    let hd = rot.head_dim;
    let (q_ptr, q_width) = q.unwrap_or((0, 0));
    let q_units = q_width / hd * rot.pairs;
    let kv_units = kv.as_ref().map_or(0, |(_, _, s)| {
        assert!(
            s.spec.kv_dim.is_multiple_of(hd),
            "rope_kv_write: KV rows of {} are not heads of {hd}",
            s.spec.kv_dim
        );
        s.spec.kv_dim / hd * (hd - hd / 2)
    });
    let n = (batch.rows() * (q_units + kv_units)) as u64;
    if n == 0 {
        return;
    }
    // With no store, either form of the kernel (nothing is stored).
    let (f, k, v, kc, vc, slot_pos, kv_width, capacity) = match kv {
        Some((k, v, s)) => (
            s.pick(&be.k.rope_kv_write, &be.k.rope_kv_write_bf16kv),
            k,
            v,
            be.ptr(&s.k),
            be.ptr(&s.v),
            be.ptr(&s.slot_pos),
            s.spec.kv_dim,
            s.spec.capacity,
        ),
        None => (&be.k.rope_kv_write, 0, 0, 0, 0, 0, 0, 0),
    };
    be.launch(
        f,
        grid_for(n),
        BLOCK,
        &[
            Arg::Ptr(q_ptr),
            Arg::Ptr(k),
            Arg::Ptr(v),
            Arg::Ptr(kc),
            Arg::Ptr(vc),
            Arg::Ptr(slot_pos),
            Arg::Ptr(be.ptr(&batch.positions)),
            Arg::Freqs(rot.freqs),
            Arg::F32(rot.factor),
            Arg::U32(batch.rows() as u32),
            Arg::U32(q_width as u32),
            Arg::U32(kv_width as u32),
            Arg::U32(hd as u32),
            Arg::U32(rot.pairs as u32),
            Arg::U32(capacity as u32),
        ],
    );
}

pub fn rope(be: &Cuda, x: &mut CudaTensor, head_dim: usize, batch: &CudaBatch, rope: &RopeTable) {
    assert_eq!(batch.rows(), x.rows, "rope: one position per row");
    let rot = Rotation::new(head_dim, rope);
    if head_dim == 0 {
        return;
    }
    launch(be, batch, rot, Some((be.ptr(&x.data), x.cols)), None);
}

/// Checks that `k` and `v` are `[rows, kv_dim]` for the batch and store.
fn check_kv(what: &str, kv: &CudaKv, k: &CudaTensor, v: &CudaTensor, batch: &CudaBatch) {
    let (n, d) = (batch.rows(), kv.spec.kv_dim);
    assert_eq!((k.rows, k.cols), (n, d), "{what}: k is not [{n}, {d}]");
    assert_eq!((v.rows, v.cols), (n, d), "{what}: v is not [{n}, {d}]");
}

pub fn kv_write(be: &Cuda, kv: &mut CudaKv, k: &CudaTensor, v: &CudaTensor, batch: &CudaBatch) {
    check_kv("kv_write", kv, k, v, batch);
    let d = kv.spec.kv_dim;
    if d == 0 || kv.spec.capacity == 0 {
        return;
    }
    // k is only read: nothing rotates (pairs = 0).
    let (kp, vp) = (be.ptr(&k.data), be.ptr(&v.data));
    launch(be, batch, Rotation::none(d), None, Some((kp, vp, kv)));
}

/// `rope(q)`, `rope(k)`, `kv_write(k, v)` in one launch.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write(
    be: &Cuda,
    q: &mut CudaTensor,
    k: &mut CudaTensor,
    v: &CudaTensor,
    kv: &mut CudaKv,
    head_dim: usize,
    batch: &CudaBatch,
    rope: &RopeTable,
) {
    assert_eq!(batch.rows(), q.rows, "rope_kv_write: one position per row");
    check_kv("rope_kv_write", kv, k, v, batch);
    assert!(head_dim > 0, "rope_kv_write: head_dim 0");
    let rot = Rotation::new(head_dim, rope);
    let (kp, vp) = (be.ptr(&k.data), be.ptr(&v.data));
    launch(
        be,
        batch,
        rot,
        Some((be.ptr(&q.data), q.cols)),
        Some((kp, vp, kv)),
    );
}
