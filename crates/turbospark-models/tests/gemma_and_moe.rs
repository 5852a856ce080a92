//! Gemma 2, Gemma 3, Qwen3-MoE and Mixtral against transformers' logits, and
//! proof that their distinguishing terms are used: the soft-caps, the
//! `(1 + w)` norm, the two RoPE bases, and the top-k normalisation.

mod common;

use common::{assert_matches, assert_mutation_caught};
use turbospark_format::Routing;

#[test]
fn gemma2_matches_transformers() {
    assert_matches("gemma2", 512);
}

#[test]
fn gemma2_ring_in_small_chunks() {
    assert_matches("gemma2", 3);
}

#[test]
fn gemma2_without_attention_softcap_is_caught() {
    assert_mutation_caught("gemma2", |s| s.attn_softcap = None);
}

#[test]
fn gemma2_without_final_softcap_is_caught() {
    assert_mutation_caught("gemma2", |s| s.final_softcap = None);
}

#[test]
fn gemma2_norm_without_one_plus_w_is_caught() {
    assert_mutation_caught("gemma2", |s| s.norm_offset = 0.0);
}

#[test]
fn gemma3_matches_transformers() {
    assert_matches("gemma3", 512);
}

#[test]
fn gemma3_ring_in_small_chunks() {
    assert_matches("gemma3", 5);
}

#[test]
fn gemma3_with_rope_bases_swapped_is_caught() {
    assert_mutation_caught("gemma3", |s| {
        let local = s.rope_local.take().unwrap();
        s.rope_local = Some(std::mem::replace(&mut s.rope, local));
    });
}

#[test]
fn gemma3_with_one_rope_base_is_caught() {
    assert_mutation_caught("gemma3", |s| s.rope_local = None);
}

#[test]
fn qwen3_moe_matches_transformers() {
    assert_matches("qwen3-moe", 512);
}

#[test]
fn qwen3_moe_without_top_k_renormalisation_is_caught() {
    assert_mutation_caught("qwen3-moe", |s| {
        let moe = s.moe.as_mut().unwrap();
        assert_eq!(moe.routing, Routing::SoftmaxTopK { renormalize: true });
        moe.routing = Routing::SoftmaxTopK { renormalize: false };
    });
}

#[test]
fn mixtral_matches_transformers() {
    assert_matches("mixtral", 512);
}

#[test]
fn mixtral_with_unnormalised_weights_is_caught() {
    assert_mutation_caught("mixtral", |s| {
        s.moe.as_mut().unwrap().routing = Routing::SoftmaxTopK { renormalize: false }
    });
}
