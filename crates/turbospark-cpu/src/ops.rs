//! Row-wise element operations of the CPU backend: embedding lookup, RMSNorm,
//! SwiGLU, residual add, RoPE. All arithmetic in f32, in the order
//! transformers uses (noted per function).

use rayon::prelude::*;
use turbospark_backend::RopeTable;
use turbospark_format::Activation;

use crate::weight::CpuWeight;

pub fn embed(table: &CpuWeight, tokens: &[u32], out: &mut [f32]) {
    let d = table.cols();
    for (row, &t) in out.chunks_exact_mut(d).zip(tokens) {
        table.read_f32(t as usize * d, row);
    }
}

/// transformers' RMSNorm: `x * rsqrt(mean(x²) + eps)`, then `* w`, in f32.
/// Applied to each `w.len()`-wide group of every row.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    out.par_chunks_mut(d.max(256) / d * d)
        .zip(x.par_chunks(d.max(256) / d * d))
        .for_each(|(o, x)| {
            for (o, x) in o.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                let ms = x.iter().map(|v| v * v).sum::<f32>() / d as f32;
                let r = 1.0 / (ms + eps).sqrt();
                for ((o, &xv), &wv) in o.iter_mut().zip(x).zip(w) {
                    *o = wv * (xv * r);
                }
            }
        });
}

pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `silu(g) = g / (1 + e^-g)`.
#[inline]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// PyTorch's `gelu(approximate="tanh")`:
/// `0.5 · g · (1 + tanh(√(2/π) · (g + 0.044715 · g³)))`.
#[inline]
pub fn gelu_tanh(g: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g)).tanh())
}

/// `cap · tanh(x / cap)`.
#[inline]
pub fn softcap(x: f32, cap: f32) -> f32 {
    cap * (x / cap).tanh()
}

/// `act(g) * u`.
pub fn glu(gate: &[f32], up: &[f32], act: Activation, out: &mut [f32]) {
    let f = match act {
        Activation::Silu => silu,
        Activation::GeluTanh => gelu_tanh,
    };
    out.par_chunks_mut(4096)
        .zip(gate.par_chunks(4096).zip(up.par_chunks(4096)))
        .for_each(|(o, (g, u))| {
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = f(g) * u;
            }
        });
}

/// transformers' `rotate_half` RoPE: for pair `i` of a head (elements `i` and
/// `i + d/2`), angle = position · inv_freq[i] computed in f32, and
/// cos/sin are multiplied by the attention factor before use.
pub fn rope(x: &mut [f32], width: usize, head_dim: usize, positions: &[u32], rope: &RopeTable) {
    let half = head_dim / 2;
    x.par_chunks_mut(width)
        .zip(positions)
        .for_each(|(row, &pos)| {
            let mut cs = Vec::with_capacity(half);
            for &f in &rope.inv_freq {
                let angle = pos as f32 * f;
                cs.push((
                    angle.cos() * rope.attention_factor,
                    angle.sin() * rope.attention_factor,
                ));
            }
            for head in row.chunks_exact_mut(head_dim) {
                let (a, b) = head.split_at_mut(half);
                for ((x1, x2), &(c, s)) in a.iter_mut().zip(b.iter_mut()).zip(&cs) {
                    let (u, v) = (*x1, *x2);
                    *x1 = u * c - v * s;
                    *x2 = v * c + u * s;
                }
            }
        });
}
