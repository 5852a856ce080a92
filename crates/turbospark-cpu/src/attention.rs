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
//! A bf16 store ([`KvDtype::Bf16`]) rounds each key and value once, on
//! write (round to nearest even); reads widen them exactly, so attention
//! over it is the f32 arithmetic above on the rounded values.

use rayon::prelude::*;
use turbospark_backend::{AttnParams, KvDtype, KvSpec};
use turbospark_format::AttnSpan;

/// Key or value rows `[capacity, kv_dim]`, in the store's dtype.
pub enum KvRows {
    F32(Vec<f32>),
    /// bf16 bits.
    Bf16(Vec<u16>),
}

impl KvRows {
    fn new(dtype: KvDtype, n: usize) -> Self {
        match dtype {
            KvDtype::F32 => KvRows::F32(vec![0.0; n]),
            KvDtype::Bf16 => KvRows::Bf16(vec![0; n]),
        }
    }

    fn store(&mut self, at: usize, row: &[f32]) {
        match self {
            KvRows::F32(d) => d[at..at + row.len()].copy_from_slice(row),
            KvRows::Bf16(d) => {
                for (o, &x) in d[at..at + row.len()].iter_mut().zip(row) {
                    *o = half::bf16::from_f32(x).to_bits();
                }
            }
        }
    }

    /// `x · row[at..at + x.len()]`.
    fn dot(&self, x: &[f32], at: usize) -> f32 {
        match self {
            KvRows::F32(d) => crate::simd::dot_f32(x, &d[at..at + x.len()]),
            KvRows::Bf16(d) => crate::simd::dot_bf16(x, &d[at..at + x.len()]),
        }
    }

    /// `out += p · row[at..at + out.len()]`, each value widened first.
    fn add_scaled(&self, at: usize, p: f32, out: &mut [f32]) {
        let n = out.len();
        match self {
            KvRows::F32(d) => {
                for (a, &b) in out.iter_mut().zip(&d[at..at + n]) {
                    *a += p * b;
                }
            }
            KvRows::Bf16(d) => {
                for (a, &b) in out.iter_mut().zip(&d[at..at + n]) {
                    *a += p * half::bf16::from_bits(b).to_f32();
                }
            }
        }
    }

    /// Every stored value as f32 (tests, debugging).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            KvRows::F32(d) => d.clone(),
            KvRows::Bf16(d) => {
                let mut out = vec![0.0; d.len()];
                crate::simd::bf16_to_f32(d, &mut out);
                out
            }
        }
    }
}

pub struct CpuKv {
    pub spec: KvSpec,
    pub k: KvRows,
    pub v: KvRows,
    /// Position stored in each slot; -1 when empty.
    pub slot_pos: Vec<i64>,
}

impl CpuKv {
    pub fn new(spec: KvSpec) -> Self {
        let n = spec.capacity * spec.kv_dim;
        CpuKv {
            spec,
            k: KvRows::new(spec.dtype, n),
            v: KvRows::new(spec.dtype, n),
            slot_pos: vec![-1; spec.capacity],
        }
    }

    pub fn write(&mut self, k: &[f32], v: &[f32], positions: &[u32]) {
        let d = self.spec.kv_dim;
        for (i, &p) in positions.iter().enumerate() {
            let slot = p as usize % self.spec.capacity;
            self.k.store(slot * d, &k[i * d..(i + 1) * d]);
            self.v.store(slot * d, &v[i * d..(i + 1) * d]);
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
            let mut s = kv.k.dot(qv, slot * kv_dim + kv_off) * p.scale;
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
            kv.v.add_scaled(*slot * kv_dim + kv_off, *s, o);
        }
        let inv = 1.0 / denom;
        for a in o.iter_mut() {
            *a *= inv;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dtype: KvDtype) -> KvSpec {
        KvSpec {
            capacity: 4,
            kv_dim: 8,
            dtype,
        }
    }

    /// Values that are not bf16 values: rounding to nearest even moves
    /// each, truncation would move some the other way.
    fn rows(n: usize, salt: f32) -> Vec<f32> {
        (0..n * 8)
            .map(|i| (i as f32 * 0.731 + salt).sin() * 1.3 + 1e-3)
            .collect()
    }

    #[test]
    fn a_bf16_store_rounds_to_nearest_even_once() {
        let (k, v) = (rows(3, 0.1), rows(3, 0.7));
        let mut kv = CpuKv::new(spec(KvDtype::Bf16));
        kv.write(&k, &v, &[0, 1, 6]);
        let round = |x: &f32| half::bf16::from_f32(*x).to_f32();
        let want = |src: &[f32], rows: [usize; 3]| {
            let mut w = vec![0.0; 32];
            for (i, slot) in rows.into_iter().enumerate() {
                for d in 0..8 {
                    w[slot * 8 + d] = round(&src[i * 8 + d]);
                }
            }
            w
        };
        // Position 6 lands in slot 2 of the 4-slot ring.
        assert_eq!(kv.k.to_f32(), want(&k, [0, 1, 2]));
        assert_eq!(kv.v.to_f32(), want(&v, [0, 1, 2]));
        assert_eq!(kv.slot_pos, vec![0, 1, 6, -1]);
        assert_ne!(kv.k.to_f32()[..8], k[..8], "the values were rounded");
        // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7:
        // nearest even is 1; 1 + 3·2^-8 rounds up to 1 + 2^-6.
        let mut tie = CpuKv::new(spec(KvDtype::Bf16));
        let mut row = vec![0.0; 8];
        row[0] = 1.0 + 2f32.powi(-8);
        row[1] = 1.0 + 3.0 * 2f32.powi(-8);
        tie.write(&row, &row, &[3]);
        assert_eq!(tie.k.to_f32()[24..26], [1.0, 1.0 + 2f32.powi(-6)]);
    }

    /// Attention over a bf16 store is attention over an f32 store of the
    /// rounded values, to the bit.
    #[test]
    fn bf16_attention_is_f32_attention_on_the_rounded_values() {
        let p = AttnParams {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 4,
            scale: 0.5,
            span: AttnSpan::Sliding { window: 3 },
            softcap: Some(5.0),
        };
        let (k, v) = (rows(5, 0.3), rows(5, 1.9));
        let round = |x: &Vec<f32>| -> Vec<f32> {
            x.iter()
                .map(|&y| half::bf16::from_f32(y).to_f32())
                .collect()
        };
        let positions = [0, 1, 2, 3, 4];
        let mut b = CpuKv::new(spec(KvDtype::Bf16));
        let mut f = CpuKv::new(spec(KvDtype::F32));
        b.write(&k, &v, &positions);
        f.write(&round(&k), &round(&v), &positions);
        let q: Vec<f32> = (0..2 * 16).map(|i| (i as f32 * 0.37).cos()).collect();
        let (mut ob, mut of, mut raw) = (vec![0.0; 32], vec![0.0; 32], vec![0.0; 32]);
        let sinks = [0.5, -1.0, 0.0, 2.0];
        attention(&q, &b, &[3, 4], &p, Some(&sinks), &mut ob);
        attention(&q, &f, &[3, 4], &p, Some(&sinks), &mut of);
        assert_eq!(ob, of);
        // And not the unrounded store's.
        let mut exact = CpuKv::new(spec(KvDtype::F32));
        exact.write(&k, &v, &positions);
        attention(&q, &exact, &[3, 4], &p, Some(&sinks), &mut raw);
        assert_ne!(ob, raw);
    }
}
