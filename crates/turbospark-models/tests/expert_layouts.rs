//! Qwen3-MoE and Mixtral checkpoints store one tensor per expert (what the
//! fixtures hold, as real downloads do: `mlp.experts.E.gate_proj.weight`,
//! Mixtral's `block_sparse_moe.experts.E.w1.weight` …), while transformers
//! 5 keeps them fused in memory (`mlp.experts.gate_up_proj` `[E, 2W, H]`,
//! `down_proj` `[E, H, W]`) and `turbospark synth` writes that fused layout.
//! These tests fuse the fixtures and require the same match with
//! transformers, so both loading paths are proven.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use common::{assert_dir_matches, fixture_dir};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

/// One expert's tensor: (expert index, shape, bytes).
type Expert = (usize, Vec<usize>, Vec<u8>);

/// Copies fixture `name` into a temporary directory with every layer's
/// per-expert tensors (`{block}.experts.E.{gate|up|down}.weight`) replaced by
/// the fused `mlp.experts.gate_up_proj` / `mlp.experts.down_proj`.
fn fused_copy(name: &str, block: &str, parts: [&str; 3]) -> tempfile::TempDir {
    let src = fixture_dir(name);
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    // (layer prefix, part) → per-expert (index, shape, bytes).
    let mut experts: BTreeMap<(String, usize), Vec<Expert>> = BTreeMap::new();
    for (tname, view) in st.tensors() {
        assert_eq!(view.dtype(), Dtype::F32, "the MoE fixtures are float32");
        let marker = format!(".{block}.experts.");
        let Some((layer, rest)) = tname.split_once(&marker) else {
            let renamed = tname.replace(&format!(".{block}."), ".mlp.");
            out.insert(renamed, (view.shape().to_vec(), view.data().to_vec()));
            continue;
        };
        let (idx, part) = rest.split_once('.').unwrap();
        let part = part.trim_end_matches(".weight");
        let which = parts.iter().position(|p| *p == part).unwrap();
        experts
            .entry((layer.to_string(), which))
            .or_default()
            .push((
                idx.parse().unwrap(),
                view.shape().to_vec(),
                view.data().to_vec(),
            ));
    }
    let layers: Vec<String> = experts.keys().map(|(l, _)| l.clone()).collect();
    for layer in layers {
        let mut sorted = |which: usize| {
            let mut v = experts.remove(&(layer.clone(), which)).unwrap_or_default();
            v.sort_by_key(|(i, _, _)| *i);
            v
        };
        let (gate, up, down) = (sorted(0), sorted(1), sorted(2));
        if gate.is_empty() {
            continue;
        }
        let (e, [w, h]) = (gate.len(), [gate[0].1[0], gate[0].1[1]]);
        let mut gate_up = Vec::new();
        for (g, u) in gate.iter().zip(&up) {
            gate_up.extend_from_slice(&g.2);
            gate_up.extend_from_slice(&u.2);
        }
        let down_bytes: Vec<u8> = down.iter().flat_map(|d| d.2.clone()).collect();
        out.insert(
            format!("{layer}.mlp.experts.gate_up_proj"),
            (vec![e, 2 * w, h], gate_up),
        );
        out.insert(
            format!("{layer}.mlp.experts.down_proj"),
            (vec![e, h, w], down_bytes),
        );
    }
    let views: HashMap<String, TensorView> = out
        .iter()
        .map(|(n, (s, d))| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), d).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &tmp.path().join("model.safetensors")).unwrap();
    tmp
}

fn has(dir: &Path, tensor: &str) -> bool {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    SafeTensors::deserialize(&bytes)
        .unwrap()
        .names()
        .contains(&tensor)
}

#[test]
fn qwen3_moe_fused_experts() {
    let dir = fused_copy("qwen3-moe", "mlp", ["gate_proj", "up_proj", "down_proj"]);
    assert!(has(dir.path(), "model.layers.1.mlp.experts.gate_up_proj"));
    assert!(!has(
        dir.path(),
        "model.layers.1.mlp.experts.0.gate_proj.weight"
    ));
    assert_dir_matches(dir.path(), "qwen3-moe", 512);
}

#[test]
fn mixtral_fused_experts_under_mlp() {
    let dir = fused_copy("mixtral", "block_sparse_moe", ["w1", "w3", "w2"]);
    assert!(has(dir.path(), "model.layers.0.mlp.experts.down_proj"));
    assert!(has(dir.path(), "model.layers.0.mlp.gate.weight"));
    assert_dir_matches(dir.path(), "mixtral", 512);
}
