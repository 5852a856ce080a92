//! The RoPE part of config.json: theta and the scaling block, in either
//! spelling (5.x `rope_parameters` with theta inside; 4.x top-level
//! `rope_theta` and an optional `rope_scaling`), with each family's defaults.

use crate::config::Fields;
use crate::error::Result;
use crate::spec::{Arch, RopeScaling, RopeSpec};

pub(crate) fn read_rope(f: &Fields, arch: Arch) -> Result<RopeSpec> {
    let (params, params_key) = match f.get("rope_parameters") {
        Some(p) => (Some(p), "rope_parameters"),
        None => (f.get("rope_scaling"), "rope_scaling"),
    };
    let default_theta = match arch {
        Arch::GptOss => 150_000.0,
        _ => 10_000.0,
    };
    let top_theta = f.f64_opt("rope_theta")?;
    let Some(params) = params else {
        let theta = top_theta.unwrap_or(default_theta);
        return Ok(RopeSpec {
            theta,
            scaling: match arch {
                // GptOssConfig fills in the released YaRN block when absent.
                Arch::GptOss => RopeScaling::Yarn {
                    factor: 32.0,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                    original_max_positions: 4096.0,
                    truncate: false,
                    attention_factor: 0.1 * 32f64.ln() + 1.0,
                },
                _ => RopeScaling::None,
            },
        });
    };
    let map = params
        .as_object()
        .ok_or_else(|| f.err(params_key, "expected an object"))?;
    let prefix = format!("{params_key}.");
    let p = Fields::new(&prefix, map);
    let theta = p
        .f64_opt("rope_theta")?
        .or(top_theta)
        .unwrap_or(default_theta);
    // 4.x files written by old versions say `type`, newer ones `rope_type`.
    let kind = match p.str_opt("rope_type")? {
        Some(k) => k,
        None => p.str_opt("type")?.unwrap_or("default"),
    };
    let required = |key: &str| -> Result<f64> {
        p.f64_opt(key)?
            .ok_or_else(|| p.err(key, format!("required for rope_type {kind}")))
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: required("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: required("factor")?,
            low_freq_factor: required("low_freq_factor")?,
            high_freq_factor: required("high_freq_factor")?,
            original_max_positions: required("original_max_position_embeddings")?,
        },
        "yarn" => {
            let factor = required("factor")?;
            let mscale = p.f64_opt("mscale")?;
            let mscale_all_dim = p.f64_opt("mscale_all_dim")?;
            // transformers' get_mscale: 0.1·m·ln(s) + 1 for s > 1.
            let get_mscale = |m: f64| {
                if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * m * factor.ln() + 1.0
                }
            };
            let attention_factor = match (p.f64_opt("attention_factor")?, mscale, mscale_all_dim) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    get_mscale(m) / get_mscale(all)
                }
                _ => get_mscale(1.0),
            };
            RopeScaling::Yarn {
                factor,
                beta_fast: p
                    .f64_opt("beta_fast")?
                    .filter(|&b| b != 0.0)
                    .unwrap_or(32.0),
                beta_slow: p.f64_opt("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                original_max_positions: required("original_max_position_embeddings")?,
                truncate: p.bool_opt("truncate")?.unwrap_or(true),
                attention_factor,
            }
        }
        other => {
            return Err(p.err(
                "rope_type",
                format!("`{other}` is not supported for this architecture"),
            ));
        }
    };
    for (key, value) in map {
        if !p.read.borrow().contains(key) && !value.is_null() {
            return Err(p.err(key, "not understood by TurboSpark for this rope_type"));
        }
    }
    Ok(RopeSpec { theta, scaling })
}
