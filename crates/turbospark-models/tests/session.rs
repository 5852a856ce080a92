//! The session's ways of reading the last token: `feed` (the logits),
//! `feed_argmax` (only the chosen id, taken where the logits are) and
//! `decode_greedy` (the host a step ahead), and its decode-step bookkeeping
//! on a backend that cannot record graphs.

use turbospark_backend::{KvDtype, argmax};
use turbospark_cpu::Cpu;
use turbospark_models::{CausalLm, GreedyEnd, LoadOptions, Session, load_model_with, read_spec};
use turbospark_testkit::{fixtures_root, greedy_ahead, greedy_by_steps, measure, reference, run};

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
    let mut by_logits = Session::new(&Cpu, model.as_ref(), ctx, 5).unwrap();
    let mut by_id = Session::new(&Cpu, model.as_ref(), ctx, 5).unwrap();
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
    let mut s = Session::new(&Cpu, model.as_ref(), 8, 4).unwrap();
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

/// A session asked for a bf16 KV cache keeps one: on the CPU (whose
/// default is f32) its logits differ from the f32 cache's, and stay within
/// the bf16 store's rounding of transformers' (measured on the GPU's twin
/// of this store: median 1.1e-2 of the logits' std, p90 1.7e-2, argmax
/// 100% on this fixture).
#[test]
fn a_bf16_kv_session_rounds_its_store() {
    let dir = fixtures_root().join("llama3-rope");
    let r = reference(&dir);
    let load = || (read_spec(&dir).unwrap(), LoadOptions::default());
    let f32_kv = run(&Cpu, &dir, &r, load(), 5, Some(KvDtype::F32));
    let bf16_kv = run(&Cpu, &dir, &r, load(), 5, Some(KvDtype::Bf16));
    assert_ne!(f32_kv.logits, bf16_kv.logits, "the store was not bf16");
    let c = measure(&bf16_kv, &r.as_run(), r.vocab);
    let (median, p90) = (c.quantile(0.5), c.quantile(0.9));
    assert!(median <= 3e-2 && p90 <= 5e-2, "median {median}, p90 {p90}");
    assert_eq!(c.argmax_mismatches, 0);
    // The f32 cache is the reference's numbers.
    let exact = measure(&f32_kv, &r.as_run(), r.vocab);
    assert!(exact.worst_rel_err <= 1e-3, "{}", exact.worst_rel_err);
}

fn gpt_oss() -> (Box<dyn CausalLm<Cpu>>, Vec<u32>) {
    let dir = fixtures_root().join("gpt-oss-mxfp4");
    let r = reference(&dir);
    let spec = read_spec(&dir).unwrap();
    let model = load_model_with(&Cpu, &dir, spec, LoadOptions::default(), &|_, _| {}).unwrap();
    (model, r.tokens)
}

/// `decode_greedy` sees the choices a loop of `feed_argmax` makes and
/// leaves the same tokens and position, `steps` feeds in all.
#[test]
fn decode_greedy_chooses_what_feed_argmax_does() {
    let (model, prompt) = gpt_oss();
    let ctx = prompt.len() + 16;
    let mut by_step = Session::new(&Cpu, model.as_ref(), ctx, 5).unwrap();
    let mut ahead = Session::new(&Cpu, model.as_ref(), ctx, 5).unwrap();
    let first = by_step.feed_argmax(&prompt).unwrap();
    let want = greedy_by_steps(&mut by_step, first, 12);
    assert_eq!(ahead.feed_argmax(&prompt).unwrap(), first);
    let (got, end) = greedy_ahead(&mut ahead, first, 12);
    assert_eq!(end, GreedyEnd::Steps);
    assert_eq!(got, want);
    assert_eq!(ahead.tokens(), by_step.tokens());
    assert_eq!(ahead.position(), prompt.len() + 12);
}

/// A refused choice is not fed: the step queued for it is taken back, and
/// the session goes on (past the 8-wide window of the fixture's sliding
/// layers, whose ring the taken-back step wrote) exactly as one that never
/// queued it.
#[test]
fn decode_greedy_takes_back_the_step_of_a_refused_token() {
    let (model, prompt) = gpt_oss();
    let ctx = prompt.len() + 32;
    let mut plain = Session::new(&Cpu, model.as_ref(), ctx, 5).unwrap();
    let mut ahead = Session::new(&Cpu, model.as_ref(), ctx, 5).unwrap();
    let first = plain.feed_argmax(&prompt).unwrap();
    ahead.feed_argmax(&prompt).unwrap();
    let mut seen = Vec::new();
    let end = ahead
        .decode_greedy(first, 20, |t| {
            seen.push(t);
            seen.len() < 5
        })
        .unwrap();
    assert_eq!(end, GreedyEnd::Refused);
    // Fed: the first token and the four choices kept.
    assert_eq!(ahead.position(), prompt.len() + 5);
    // One at a time, as `ahead` fed them (a chunk sums in another order).
    for &t in [first].iter().chain(&seen[..4]) {
        plain.feed(&[t], false).unwrap();
    }
    assert_eq!(ahead.tokens(), plain.tokens());
    // Another token where the refused one was, then ten more.
    let other = (seen[4] + 1) % 256;
    let mut next = [other];
    for step in 0..11 {
        let want = plain.feed(&next, false).unwrap();
        assert_eq!(ahead.feed(&next, false).unwrap(), want, "step {step}");
        next = [argmax(&want)];
    }
}

/// Where the cache fills first, `decode_greedy` says so after the last
/// choice it could feed, and `keep` saw that choice.
#[test]
fn decode_greedy_stops_at_a_full_context() {
    let (model, prompt) = gpt_oss();
    let mut s = Session::new(&Cpu, model.as_ref(), prompt.len() + 3, 5).unwrap();
    let first = s.feed_argmax(&prompt).unwrap();
    let mut seen = 0;
    let end = s
        .decode_greedy(first, 10, |_| {
            seen += 1;
            true
        })
        .unwrap();
    assert_eq!(end, GreedyEnd::ContextFull);
    assert_eq!((seen, s.position()), (3, prompt.len() + 3));
    // No room for even the first token: an error, nothing fed.
    assert!(s.decode_greedy(first, 1, |_| true).is_err());
    assert_eq!(s.position(), prompt.len() + 3);
}
