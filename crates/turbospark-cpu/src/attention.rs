//! Attention over the CPU KV store.
//!
//! The store is a ring of `capacity` slots; slot `p % capacity` holds the key
//! and value of position `p`, and `slot_pos` remembers which position each
//! slot holds, so the same code serves full layers (capacity ≥ context) and
//! sliding layers (capacity = window + chunk). A key is visible to a query at
//! position `q` when `k ≤ q` and, for a sliding span, `q − k < window`.
//!
//! Numerics follow transformers' eager attention: f32 scores `q·k · scale`,
//! a max-subtracted f32 softmax, then the probability-weighted sum of values.

use rayon::prelude::*;
use turbospark_backend::{AttnParams, KvSpec};
use turbospark_format::AttnSpan;

pub struct CpuKv {
    pub spec: KvSpec,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Position stored in each slot; -1 when empty.
    pub slot_pos: Vec<i64>,
}

impl CpuKv {
    pub fn new(spec: KvSpec) -> Self {
        CpuKv {
            spec,
            k: vec![0.0; spec.capacity * spec.kv_dim],
            v: vec![0.0; spec.capacity * spec.kv_dim],
            slot_pos: vec![-1; spec.capacity],
        }
    }

    pub fn write(&mut self, k: &[f32], v: &[f32], positions: &[u32]) {
        let d = self.spec.kv_dim;
        for (i, &p) in positions.iter().enumerate() {
            let slot = p as usize % self.spec.capacity;
            self.k[slot * d..(slot + 1) * d].copy_from_slice(&k[i * d..(i + 1) * d]);
            self.v[slot * d..(slot + 1) * d].copy_from_slice(&v[i * d..(i + 1) * d]);
            self.slot_pos[slot] = p as i64;
        }
    }
}

fn visible(span: AttnSpan, q: i64, k: i64) -> bool {
    k >= 0
        && k <= q
        && match span {
            AttnSpan::Full => true,
            AttnSpan::Sliding { window } => q - k < window as i64,
        }
}

/// `sinks`: one logit per query head that joins the softmax denominator
/// (and the max used for stability) but weighs no value.
pub fn attention(
    q: &[f32],
    kv: &CpuKv,
    positions: &[u32],
    p: &AttnParams,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    let q_width = p.num_heads * hd;
    let kv_dim = kv.spec.kv_dim;
    let group = p.num_heads / p.num_kv_heads;
    assert_eq!(q.len(), positions.len() * q_width);
    assert_eq!(out.len(), q.len());
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (row, head) = (idx / p.num_heads, idx % p.num_heads);
        let qpos = positions[row] as i64;
        let qv = &q[row * q_width + head * hd..row * q_width + (head + 1) * hd];
        let kv_off = (head / group) * hd;
        let mut scores: Vec<(usize, f32)> = Vec::with_capacity(kv.spec.capacity);
        let mut max = f32::NEG_INFINITY;
        for (slot, &kpos) in kv.slot_pos.iter().enumerate() {
            if !visible(p.span, qpos, kpos) {
                continue;
            }
            let kk = &kv.k[slot * kv_dim + kv_off..slot * kv_dim + kv_off + hd];
            let mut s = crate::simd::dot_f32(qv, kk) * p.scale;
            if let Some(cap) = p.softcap {
                s = crate::ops::softcap(s, cap);
            }
            max = max.max(s);
            scores.push((slot, s));
        }
        let sink = sinks.map(|s| s[head]);
        if let Some(s) = sink {
            max = max.max(s);
        }
        o.fill(0.0);
        let mut denom = sink.map_or(0.0, |s| (s - max).exp());
        for (slot, s) in &mut scores {
            *s = (*s - max).exp();
            denom += *s;
            let vv = &kv.v[*slot * kv_dim + kv_off..*slot * kv_dim + kv_off + hd];
            for (a, &b) in o.iter_mut().zip(vv) {
                *a += *s * b;
            }
        }
        let inv = 1.0 / denom;
        for a in o.iter_mut() {
            *a *= inv;
        }
    });
}
