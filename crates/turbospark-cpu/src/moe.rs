//! Mixture-of-experts on the CPU: routing, then experts grouped by expert
//! (each expert's tokens are gathered and run as one batched linear, so
//! prefill reuses the GEMM path), then a weighted scatter-add.
//!
//! Summation order, which changes results in floating point: each row's sum
//! starts at zero and experts are visited in ascending index, so every row
//! adds its selected experts in ascending expert index, as transformers'
//! loop does; the finished sum is then added to what `out` holds (the
//! residual stream). Each expert's output includes its down bias before it
//! is weighted.

use turbospark_backend::{Experts, MoeParams};
use turbospark_format::{ExpertAct, Routing};

use crate::linear::linear_rows;
use crate::weight::CpuWeight;

/// The selected (expert, weight) pairs of one row, ascending by expert.
pub fn route(logits: &[f32], top_k: usize, routing: Routing) -> Vec<(usize, f32)> {
    // Top-k by value; ties go to the lower index (as torch.topk on CPU).
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(top_k);
    let softmax = |vals: &mut [f32]| {
        let max = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for v in vals.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in vals.iter_mut() {
            *v /= sum;
        }
    };
    let weights: Vec<f32> = match routing {
        Routing::TopKSoftmax => {
            let mut sel: Vec<f32> = order.iter().map(|&e| logits[e]).collect();
            softmax(&mut sel);
            sel
        }
        Routing::SoftmaxTopK { renormalize } => {
            let mut all = logits.to_vec();
            softmax(&mut all);
            let mut sel: Vec<f32> = order.iter().map(|&e| all[e]).collect();
            if renormalize {
                let sum: f32 = sel.iter().sum();
                sel.iter_mut().for_each(|w| *w /= sum);
            }
            sel
        }
    };
    let mut pairs: Vec<(usize, f32)> = order.into_iter().zip(weights).collect();
    pairs.sort_by_key(|&(e, _)| e);
    pairs
}

/// `gate_up` row → activated row of `width` values.
fn activate(gate_up: &[f32], width: usize, act: ExpertAct, out: &mut [f32]) {
    match act {
        ExpertAct::SwiGlu => {
            let (gate, up) = gate_up.split_at(width);
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = crate::ops::silu(g) * u;
            }
        }
        ExpertAct::ClampedSwiGlu { alpha, limit } => {
            for (o, pair) in out.iter_mut().zip(gate_up.chunks_exact(2)) {
                let gate = pair[0].min(limit);
                let up = pair[1].clamp(-limit, limit);
                let glu = gate / (1.0 + (-gate * alpha).exp());
                *o = (up + 1.0) * glu;
            }
        }
    }
}

fn bias_row(w: Option<&CpuWeight>, expert: usize, len: usize) -> Option<Vec<f32>> {
    w.map(|b| {
        let mut v = vec![0.0; len];
        b.read_f32(expert * len, &mut v);
        v
    })
}

pub fn moe(
    x: &[f32],
    hidden: usize,
    logits: &[f32],
    ex: &Experts<'_, CpuWeight>,
    p: &MoeParams,
    out: &mut [f32],
) {
    let w = p.width;
    let routes: Vec<Vec<(usize, f32)>> = logits
        .chunks_exact(p.num_experts)
        .map(|row| route(row, p.top_k, p.routing))
        .collect();
    // Each row's experts summed from zero, then added to what `out` holds.
    let mut sum = vec![0.0; out.len()];
    for e in 0..p.num_experts {
        let users: Vec<(usize, f32)> = routes
            .iter()
            .enumerate()
            .filter_map(|(t, r)| r.iter().find(|&&(ee, _)| ee == e).map(|&(_, wt)| (t, wt)))
            .collect();
        if users.is_empty() {
            continue;
        }
        let m = users.len();
        let mut xe = Vec::with_capacity(m * hidden);
        for &(t, _) in &users {
            xe.extend_from_slice(&x[t * hidden..(t + 1) * hidden]);
        }
        let mut gu = vec![0.0; m * 2 * w];
        let gu_bias = bias_row(ex.gate_up_bias, e, 2 * w);
        linear_rows(
            &xe,
            m,
            ex.gate_up,
            e * 2 * w,
            2 * w,
            gu_bias.as_deref(),
            &mut gu,
        );
        let mut act = vec![0.0; m * w];
        for (a, g) in act.chunks_exact_mut(w).zip(gu.chunks_exact(2 * w)) {
            activate(g, w, p.act, a);
        }
        let mut y = vec![0.0; m * hidden];
        let down_bias = bias_row(ex.down_bias, e, hidden);
        linear_rows(
            &act,
            m,
            ex.down,
            e * hidden,
            hidden,
            down_bias.as_deref(),
            &mut y,
        );
        for (i, &(t, wt)) in users.iter().enumerate() {
            for (o, &v) in sum[t * hidden..(t + 1) * hidden]
                .iter_mut()
                .zip(&y[i * hidden..(i + 1) * hidden])
            {
                *o += v * wt;
            }
        }
    }
    for (o, s) in out.iter_mut().zip(sum) {
        *o += s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_modes_select_and_weight_as_transformers() {
        let logits = [1.0, 3.0, 2.0, 0.5];
        // Top-2 = experts 1, 2; softmax over (3, 2).
        let r = route(&logits, 2, Routing::TopKSoftmax);
        let e = 1.0f32.exp();
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((r[0].1 - e / (e + 1.0)).abs() < 1e-6);
        // Softmax over all, top-2, no renormalisation.
        let r = route(&logits, 2, Routing::SoftmaxTopK { renormalize: false });
        let z: f32 = logits.iter().map(|v| v.exp()).sum();
        assert!((r[0].1 - 3.0f32.exp() / z).abs() < 1e-6);
        let r = route(&logits, 2, Routing::SoftmaxTopK { renormalize: true });
        assert!((r[0].1 + r[1].1 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn clamped_swiglu_clamps_gate_above_and_up_both_ways() {
        let mut out = [0.0; 2];
        // (gate, up) pairs: (10 → 7, −9 → −7) and (−10 stays, 0.5).
        activate(
            &[10.0, -9.0, -10.0, 0.5],
            2,
            ExpertAct::ClampedSwiGlu {
                alpha: 1.702,
                limit: 7.0,
            },
            &mut out,
        );
        let glu = |g: f32| g / (1.0 + (-g * 1.702).exp());
        assert!((out[0] - (-7.0 + 1.0) * glu(7.0)).abs() < 1e-5);
        assert!((out[1] - 1.5 * glu(-10.0)).abs() < 1e-6);
    }
}
