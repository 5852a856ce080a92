//! `Backend::empty`'s contract, checked on every fixture: the CPU backend
//! with `empty` tensors full of NaN still matches transformers, so every
//! operation that the families hand an `empty` tensor writes all of it
//! before anything reads it. The CUDA backend relies on this: its `empty`
//! tensors are not zeroed (no memset nodes in a recorded decode step).

mod common;

use common::assert_matches_with_nan_empty;

#[test]
fn every_family_writes_its_empty_tensors_before_reading_them() {
    for name in [
        "gemma2",
        "gemma3",
        "gpt-oss-bf16",
        "gpt-oss-mxfp4",
        "llama-tied-bf16",
        "llama3-rope",
        "mistral-window",
        "mixtral",
        "qwen2-bias",
        "qwen3-moe",
        "qwen3-qknorm",
    ] {
        assert_matches_with_nan_empty(name);
    }
}
