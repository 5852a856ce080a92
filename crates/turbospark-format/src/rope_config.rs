//! The RoPE part of config.json: theta and the scaling block, in either
//! spelling (5.x `rope_parameters` with theta inside; 4.x top-level
//! `rope_theta` and an optional `rope_scaling`), with each family's defaults.
//! Gemma 3 has two: 5.x nests one block per layer type
//! (`rope_parameters.full_attention` / `.sliding_attention`); 4.x gives the
//! local base as `rope_local_base_freq` and scales only the global one.

use serde_json::Value;

use crate::config::Fields;
use crate::error::Result;
use crate::spec::{Arch, RopeScaling, RopeSpec};

/// (global RoPE, local RoPE of sliding layers when it differs).
pub(crate) fn read_rope(f: &Fields, arch: Arch) -> Result<(RopeSpec, Option<RopeSpec>)> {
    let default_theta = match arch {
        Arch::GptOss => 150_000.0,
        Arch::Gemma3 | Arch::Mixtral | Arch::Qwen3Moe => 1_000_000.0,
        _ => 10_000.0,
    };
    let top_theta = f.f64_opt("rope_theta")?.unwrap_or(default_theta);
    let block = match f.get("rope_parameters") {
        Some(p) => Some((p, "rope_parameters")),
        None => f.get("rope_scaling").map(|p| (p, "rope_scaling")),
    };
    if arch == Arch::Gemma3 {
        let local_theta = f.f64_opt("rope_local_base_freq")?.unwrap_or(10_000.0);
        let plain = |theta| RopeSpec {
            theta,
            scaling: RopeScaling::None,
        };
        let nested = block.and_then(|(p, _)| p.get("full_attention")).is_some();
        return match block {
            Some((p, key)) if nested => Ok((
                parse_block(
                    f,
                    p.get("full_attention"),
                    &format!("{key}.full_attention"),
                    top_theta,
                    arch,
                )?,
                Some(parse_block(
                    f,
                    p.get("sliding_attention"),
                    &format!("{key}.sliding_attention"),
                    local_theta,
                    arch,
                )?),
            )),
            Some((p, key)) => Ok((
                parse_block(f, Some(p), key, top_theta, arch)?,
                Some(plain(local_theta)),
            )),
            None => Ok((plain(top_theta), Some(plain(local_theta)))),
        };
    }
    let global = match block {
        Some((p, key)) => parse_block(f, Some(p), key, top_theta, arch)?,
        None if arch == Arch::GptOss => RopeSpec {
            theta: top_theta,
            scaling: released_gpt_oss_yarn(),
        },
        None => RopeSpec {
            theta: top_theta,
            scaling: RopeScaling::None,
        },
    };
    Ok((global, None))
}

/// GptOssConfig fills in the released YaRN block when none is given.
fn released_gpt_oss_yarn() -> RopeScaling {
    RopeScaling::Yarn {
        factor: 32.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        original_max_positions: 4096.0,
        truncate: false,
        attention_factor: 0.1 * 32f64.ln() + 1.0,
    }
}

/// One rope block (`{rope_type, rope_theta?, factor, ...}`); a missing
/// block is plain RoPE at `theta`.
fn parse_block(
    f: &Fields,
    block: Option<&Value>,
    key: &str,
    theta: f64,
    arch: Arch,
) -> Result<RopeSpec> {
    let Some(block) = block.filter(|b| !b.is_null()) else {
        return Ok(RopeSpec {
            theta,
            scaling: RopeScaling::None,
        });
    };
    let map = block
        .as_object()
        .ok_or_else(|| f.err(key, "expected an object"))?;
    let prefix = format!("{key}.");
    let p = Fields::new(&prefix, map);
    let theta = p.f64_opt("rope_theta")?.unwrap_or(theta);
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
        "yarn" => yarn(
            &p,
            required("factor")?,
            required("original_max_position_embeddings")?,
        )?,
        other => {
            return Err(p.err(
                "rope_type",
                format!("`{other}` is not supported for {}", arch.name()),
            ));
        }
    };
    for (k, value) in map {
        if !p.read.borrow().contains(k) && !value.is_null() {
            return Err(p.err(k, "not understood by TurboSpark for this rope_type"));
        }
    }
    Ok(RopeSpec { theta, scaling })
}

/// transformers' `_compute_yarn_parameters` inputs, with its defaults.
fn yarn(p: &Fields, factor: f64, original: f64) -> Result<RopeScaling> {
    // get_mscale: 0.1·m·ln(s) + 1 for s > 1.
    let get_mscale = |m: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    let mscale = p.f64_opt("mscale")?;
    let mscale_all_dim = p.f64_opt("mscale_all_dim")?;
    let attention_factor = match (p.f64_opt("attention_factor")?, mscale, mscale_all_dim) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => get_mscale(m) / get_mscale(all),
        _ => get_mscale(1.0),
    };
    Ok(RopeScaling::Yarn {
        factor,
        // `beta_fast or 32`: zero falls back too, as in Python.
        beta_fast: p
            .f64_opt("beta_fast")?
            .filter(|&b| b != 0.0)
            .unwrap_or(32.0),
        beta_slow: p.f64_opt("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
        original_max_positions: original,
        truncate: p.bool_opt("truncate")?.unwrap_or(true),
        attention_factor,
    })
}
