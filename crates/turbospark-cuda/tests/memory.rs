//! A GPU that runs out of memory: a KV cache or a model too large for it
//! is an error that says how much was asked, what is free and what to
//! change (`BackendError::OutOfMemory`), never a bare panic; a forward
//! call that runs out unwinds with that error as its payload (the CLI
//! reports it as an error); and the backend goes on working after each:
//! the next allocation that fits succeeds and a fixture still matches
//! transformers.
//!
//! Without a CUDA device each test prints "skipped: no CUDA device" and
//! passes.

mod common;

use turbospark_backend::{Backend, BackendError, KvDtype, KvSpec};
use turbospark_cuda::{Cuda, CudaKv, Precision};
use turbospark_models::{LoadOptions, Session, load_model_with, read_spec};
use turbospark_testkit::{Run, all_fixtures, compare_fixture, measure, reference};

/// A KV store of `bytes` for each of K and V (f32 values, one position).
fn store(bytes: usize) -> KvSpec {
    KvSpec {
        capacity: 1,
        kv_dim: bytes / 4,
        dtype: KvDtype::F32,
    }
}

/// Fills the GPU with KV stores, halving the size each time one does not
/// fit, until not even 512 bytes more do: what the returned stores hold is
/// then all the memory there is.
fn fill(be: &Cuda) -> Vec<CudaKv> {
    let mut held = Vec::new();
    let mut bytes = 1usize << 30;
    while bytes >= 512 {
        match be.kv_alloc(store(bytes)) {
            Ok(kv) => held.push(kv),
            Err(BackendError::OutOfMemory { .. }) => bytes /= 2,
            Err(e) => panic!("filling the GPU: {e}"),
        }
    }
    held
}

/// The fixture the load test uses, and the F32 bound every fixture meets
/// (fixtures_on_gpu.rs): max |Δlogit| / std of transformers' logits.
const F32_WORST: f32 = 1e-3;

#[test]
fn a_kv_cache_too_large_is_an_error_that_says_so() {
    let Some(be) = common::gpu() else { return };
    // 2^24 positions of 2^14 f32 values: 1 TiB for K alone.
    let spec = KvSpec {
        capacity: 1 << 24,
        kv_dim: 1 << 14,
        dtype: KvDtype::F32,
    };
    let err = be.kv_alloc(spec).err().expect("a 1 TiB KV cache allocated");
    let msg = err.to_string();
    match err {
        BackendError::OutOfMemory {
            device,
            need,
            free: Some((free, total)),
            ..
        } => {
            assert_eq!(device, "GPU");
            assert_eq!(need, 1 << 40);
            assert!(
                free <= total && total < 1 << 40,
                "free {free}, total {total}"
            );
        }
        e => panic!("not an out-of-memory error with the GPU's memory: {e}"),
    }
    assert!(
        msg.starts_with("out of GPU memory: a layer's KV cache (16777216 positions of 16384 F32")
            && msg.contains("1024.00 GiB more")
            && msg.contains("--context")
            && msg.contains("--kv-cache-dtype bf16"),
        "{msg}"
    );
    // The next allocation that fits succeeds.
    assert!(be.kv_alloc(store(1 << 20)).is_ok());
}

#[test]
fn a_model_that_does_not_fit_is_an_error_naming_a_tensor() {
    let Some(mut be) = common::gpu() else { return };
    be.set_precision(Precision::F32);
    let dir = &all_fixtures()[0];
    let spec = read_spec(dir).unwrap();
    let held = fill(&be);
    let err = load_model_with(&*be, dir, spec, LoadOptions::default(), &|_, _| {})
        .err()
        .expect("a model loaded on a full GPU");
    let msg = err.to_string();
    assert!(
        msg.starts_with("out of GPU memory: tensor `") && msg.contains("--quant"),
        "{msg}"
    );
    // Freed, the same model loads and still matches transformers.
    drop(held);
    let c = compare_fixture(&*be, dir, 512);
    assert!(
        c.worst_rel_err <= F32_WORST,
        "{}: max|Δ|/std {} after an out-of-memory load",
        dir.display(),
        c.worst_rel_err
    );
}

#[test]
fn a_forward_call_out_of_memory_unwinds_with_the_error() {
    let Some(mut be) = common::gpu() else { return };
    be.set_precision(Precision::F32);
    let dir = &all_fixtures()[0];
    let spec = read_spec(dir).unwrap();
    let model = load_model_with(&*be, dir, spec, LoadOptions::default(), &|_, _| {}).unwrap();
    let r = reference(dir);
    let ctx = r.tokens.len() + 1;
    let mut session = Session::new(&*be, model.as_ref(), ctx, 512).unwrap();
    let held = fill(&be);
    let prefill = std::panic::AssertUnwindSafe(|| session.feed(&r.tokens, true));
    let payload = std::panic::catch_unwind(prefill).expect_err("a prefill ran on a full GPU");
    let err = payload
        .downcast::<BackendError>()
        .expect("the payload is not the backend's error");
    let msg = err.to_string();
    assert!(
        matches!(*err, BackendError::OutOfMemory { .. })
            && msg.contains("a forward call's buffers did not fit"),
        "{msg}"
    );
    // Freed, a new session of the same model matches transformers.
    drop((session, held));
    let mut session = Session::new(&*be, model.as_ref(), ctx, 512).unwrap();
    let logits = session.feed(&r.tokens, true).unwrap();
    let ours = Run {
        logits,
        greedy: Vec::new(),
    };
    let c = measure(&ours, &r.as_run(), r.vocab);
    assert!(
        c.worst_rel_err <= F32_WORST,
        "max|Δ|/std {}",
        c.worst_rel_err
    );
}
