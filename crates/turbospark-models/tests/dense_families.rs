//! Llama, Mistral, Qwen2 and Qwen3 against transformers' logits (fixtures
//! from `tools/reference/make_fixtures.py`), and proof that each family
//! feature is exercised: switching it off breaks the match.

mod common;

use common::{assert_matches, assert_mutation_caught};
use turbospark_format::{AttnSpan, RopeScaling};

#[test]
fn llama3_rope_scaling_past_original_context() {
    assert_matches("llama3-rope", 512);
}

#[test]
fn llama3_rope_in_small_prefill_chunks() {
    // Same fixture fed 5 tokens at a time: chunked prefill must not change
    // the result.
    assert_matches("llama3-rope", 5);
}

#[test]
fn llama3_without_rope_scaling_is_caught() {
    assert_mutation_caught("llama3-rope", |s| s.rope.scaling = RopeScaling::None);
}

#[test]
fn llama_tied_bf16_with_biases() {
    assert_matches("llama-tied-bf16", 512);
}

#[test]
fn llama_without_o_and_mlp_biases_is_caught() {
    assert_mutation_caught("llama-tied-bf16", |s| {
        s.o_bias = false;
        s.mlp_bias = false;
    });
}

#[test]
fn mistral_sliding_window() {
    assert_matches("mistral-window", 512);
}

#[test]
fn mistral_sliding_window_ring_in_chunks() {
    // Chunks of 3 make the ring (window + 3 slots) wrap many times.
    assert_matches("mistral-window", 3);
}

#[test]
fn mistral_without_window_is_caught() {
    assert_mutation_caught("mistral-window", |s| {
        s.layer_spans.iter_mut().for_each(|l| *l = AttnSpan::Full)
    });
}

#[test]
fn qwen2_qkv_biases_tied() {
    assert_matches("qwen2-bias", 512);
}

#[test]
fn qwen2_without_qkv_biases_is_caught() {
    assert_mutation_caught("qwen2-bias", |s| s.qkv_bias = false);
}

#[test]
fn qwen3_qk_norm_and_free_head_dim() {
    assert_matches("qwen3-qknorm", 512);
}

#[test]
fn qwen3_without_qk_norm_is_caught() {
    assert_mutation_caught("qwen3-qknorm", |s| s.qk_norm = false);
}
