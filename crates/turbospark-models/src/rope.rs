//! RoPE frequency tables, computed once at load from the [`RopeSpec`] exactly
//! as transformers' `ROPE_INIT_FUNCTIONS` compute `inv_freq` and the
//! attention factor. Kept in f64 until the final rounding to f32.

use std::f64::consts::PI;

use turbospark_backend::RopeTable;
use turbospark_format::{RopeScaling, RopeSpec};

pub fn rope_table(rope: &RopeSpec, head_dim: usize) -> RopeTable {
    let d = head_dim as f64;
    let base: Vec<f64> = (0..head_dim / 2)
        .map(|i| 1.0 / rope.theta.powf((2 * i) as f64 / d))
        .collect();
    let inv_freq: Vec<f64> = match &rope.scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_positions,
        } => {
            // Long wavelengths (low frequencies) are slowed by `factor`, short
            // ones kept, and the band between is interpolated smoothly.
            let low_wavelen = original_max_positions / low_freq_factor;
            let high_wavelen = original_max_positions / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (original_max_positions / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_max_positions,
            truncate,
            ..
        } => {
            // The pair index at which a frequency turns `rotations` times
            // over the original context.
            let correction_dim = |rotations: f64| {
                d * (original_max_positions / (rotations * 2.0 * PI)).ln() / (2.0 * rope.theta.ln())
            };
            let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
            if *truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
            if low == high {
                high += 0.001;
            }
            // Pairs below `low` keep their frequency (extrapolate), pairs
            // above `high` are slowed by `factor` (interpolate), a linear
            // ramp between.
            base.iter()
                .enumerate()
                .map(|(i, &f)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    (f / factor) * (1.0 - keep) + f * keep
                })
                .collect()
        }
    };
    let attention_factor = match rope.scaling {
        RopeScaling::Yarn {
            attention_factor, ..
        } => attention_factor,
        _ => 1.0,
    };
    RopeTable {
        inv_freq: inv_freq.into_iter().map(|f| f as f32).collect(),
        attention_factor: attention_factor as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_table_is_theta_power() {
        let t = rope_table(
            &RopeSpec {
                theta: 10_000.0,
                scaling: RopeScaling::None,
            },
            8,
        );
        let expected = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in t.inv_freq.iter().zip(expected) {
            assert!((a - b).abs() < 1e-7, "{a} vs {b}");
        }
    }

    #[test]
    fn llama3_keeps_high_slows_low_and_blends_the_middle() {
        let spec = RopeSpec {
            theta: 10_000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_positions: 64.0,
            },
        };
        let plain = rope_table(
            &RopeSpec {
                theta: 10_000.0,
                scaling: RopeScaling::None,
            },
            16,
        );
        let t = rope_table(&spec, 16);
        // wavelen(i) = 2π·10000^(i/8): i=0 → 6.28 (< 16: kept),
        // i=7 → 2π·3162 (> 64: divided by 8).
        assert_eq!(t.inv_freq[0], plain.inv_freq[0]);
        assert!((t.inv_freq[7] - plain.inv_freq[7] / 8.0).abs() < 1e-9);
        // i=2: wavelen 62.8 lies between 16 and 64: blended.
        let f = plain.inv_freq[2] as f64;
        let smooth = (64.0 / (2.0 * PI / f) - 1.0) / 3.0;
        let blended = ((1.0 - smooth) * f / 8.0 + smooth * f) as f32;
        assert!((t.inv_freq[2] - blended).abs() < 1e-9);
    }
}
