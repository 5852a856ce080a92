//! gpt-oss against transformers' logits, in both weight layouts (plain float
//! experts; MXFP4 experts as released, where transformers' reference ran on
//! its own decoding of the same packed bytes), and proof that each feature
//! is used: zeroed sinks, the window phase swapped, biases after RoPE, and
//! YaRN without its ramp must each break the match.

mod common;

use common::mutant::Mistake;
use common::{assert_matches, assert_mistake_caught, assert_mutation_caught};
use turbospark_format::{AttnSpan, RopeScaling};

const BF16: &str = "gpt-oss-bf16";
const MXFP4: &str = "gpt-oss-mxfp4";

#[test]
fn float_layout_matches_transformers() {
    assert_matches(BF16, 512);
}

#[test]
fn mxfp4_layout_matches_transformers() {
    assert_matches(MXFP4, 512);
}

#[test]
fn ring_wraps_with_small_prefill_chunks() {
    // The sliding layers keep window + 4 rows; 80 tokens wrap them often.
    assert_matches(BF16, 4);
    assert_matches(MXFP4, 7);
}

#[test]
fn zeroed_sinks_are_caught() {
    assert_mistake_caught(BF16, Mistake::ZeroSinks);
}

#[test]
fn biases_after_rope_are_caught() {
    assert_mistake_caught(BF16, Mistake::BiasAfterRope);
}

#[test]
fn swapped_window_phase_is_caught() {
    assert_mutation_caught(BF16, |s| {
        let window = s
            .layer_spans
            .iter()
            .find_map(|l| match l {
                AttnSpan::Sliding { window } => Some(*window),
                AttnSpan::Full => None,
            })
            .unwrap();
        for l in &mut s.layer_spans {
            *l = match l {
                AttnSpan::Full => AttnSpan::Sliding { window },
                AttnSpan::Sliding { .. } => AttnSpan::Full,
            };
        }
    });
}

#[test]
fn yarn_without_its_ramp_is_caught() {
    // Correction dims far below pair 0 make the ramp zero everywhere: every
    // pair keeps its original frequency, while the attention factor stays.
    assert_mutation_caught(MXFP4, |s| {
        if let RopeScaling::Yarn {
            beta_fast,
            beta_slow,
            ..
        } = &mut s.rope.scaling
        {
            *beta_fast = 1e30;
            *beta_slow = 1e30;
        } else {
            panic!("fixture has no YaRN");
        }
    });
}
