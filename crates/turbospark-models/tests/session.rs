//! The session's two ways of reading the last token: `feed` (the logits)
//! and `feed_argmax` (only the chosen id, taken where the logits are), and
//! its decode-step bookkeeping on a backend that cannot record graphs.

use turbospark_backend::argmax;
use turbospark_cpu::Cpu;
use turbospark_models::{LoadOptions, Session, load_model_with, read_spec};
use turbospark_testkit::{fixtures_root, reference};

/// Greedy decoding through `feed_argmax` picks, step by step, the argmax of
/// the logits `feed` returns for the same tokens (prefill in chunks of 5,
/// then 12 decode steps), and the CPU never records a decode step.
#[test]
fn feed_argmax_is_the_argmax_of_feed() {
    let dir = fixtures_root().join("gpt-oss-mxfp4");
    let r = reference(&dir);
    let spec = read_spec(&dir).unwrap();
    let model = load_model_with(&Cpu, &dir, spec, LoadOptions::default(), &|_, _| {}).unwrap();
    let ctx = r.tokens.len() + 16;
    let mut by_logits = Session::new(&Cpu, model.as_ref(), ctx, 5);
    let mut by_id = Session::new(&Cpu, model.as_ref(), ctx, 5);
    let mut want = argmax(&by_logits.feed(&r.tokens, false).unwrap());
    let mut got = by_id.feed_argmax(&r.tokens).unwrap();
    for step in 0..12 {
        assert_eq!(got, want, "step {step}");
        want = argmax(&by_logits.feed(&[want], false).unwrap());
        got = by_id.feed_argmax(&[got]).unwrap();
    }
    assert_eq!(by_id.tokens(), by_logits.tokens());
    assert_eq!(by_id.position(), r.tokens.len() + 12);
    assert!(!by_id.decode_recorded(), "the CPU has nothing to record");
}

/// An empty feed and a token outside the vocabulary are errors, not panics,
/// on both paths, and leave the session as it was.
#[test]
fn feed_argmax_refuses_bad_input_like_feed() {
    let dir = fixtures_root().join("llama3-rope");
    let spec = read_spec(&dir).unwrap();
    let vocab = spec.vocab_size as u32;
    let model = load_model_with(&Cpu, &dir, spec, LoadOptions::default(), &|_, _| {}).unwrap();
    let mut s = Session::new(&Cpu, model.as_ref(), 8, 4);
    assert!(s.feed_argmax(&[]).is_err());
    assert!(s.feed_argmax(&[vocab]).is_err());
    assert!(s.feed(&[vocab], false).is_err());
    assert_eq!(s.position(), 0);
    assert!(
        s.feed_argmax(&[1; 9]).is_err(),
        "9 tokens in a context of 8"
    );
    assert_eq!(s.position(), 0);
}
