//! The KV store and attention over it, CUDA backend against the CPU
//! reference (`turbospark_cpu::Cpu`): the store's ring and dtype rule, RoPE
//! with the store write, split-KV attention (full and sliding spans, GQA,
//! sinks, softcap), each also replayed from a recorded graph at new
//! positions. Every test runs over both store dtypes (`KvDtype`): the
//! CPU's bf16 store is the reference for the GPU's. A decode step's fused
//! kernel has its own file, `parity_step.rs`, and the prompt-sized flash
//! kernel `flash_attention.rs`.
//!
//! Tolerances: `common/tolerances.rs`. Without a CUDA device each test
//! prints "skipped: no CUDA device" and passes.

use turbospark_backend::{AttnParams, Backend, KvDtype, KvSpec};
use turbospark_cpu::Cpu;
use turbospark_cuda::{Cuda, CudaTensor, Precision};
use turbospark_format::{AttnSpan, DType};

mod common;

use common::kv::*;
use common::*;

/// vLLM's `auto`: a bf16 store for a bf16 model at `Precision::Bf16`,
/// f32 for every other model dtype and at `Precision::F32`.
#[test]
fn default_kv_dtype_follows_the_model_and_the_precision() {
    let Some(mut g) = gpu() else { return };
    assert_eq!(g.kv_dtype(DType::BF16), KvDtype::Bf16);
    assert_eq!(g.kv_dtype(DType::F16), KvDtype::F32);
    assert_eq!(g.kv_dtype(DType::F32), KvDtype::F32);
    g.set_precision(Precision::F32);
    assert_eq!(g.kv_dtype(DType::BF16), KvDtype::F32);
    assert_eq!(Cpu.kv_dtype(DType::BF16), KvDtype::F32);
}

/// The GPU store holds exactly the CPU's: an f32 store the rows as given,
/// a bf16 one each value rounded to nearest even (`half` on the CPU,
/// `cvt.rn.bf16.f32` on the GPU). The values written are not bf16 values,
/// so a store that kept f32 or truncated would differ.
#[test]
fn kv_store_follows_the_ring() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(9);
    for dtype in KV_DTYPES {
        let spec = KvSpec {
            capacity: 8,
            kv_dim: 16,
            dtype,
        };
        let (mut ckv, mut gkv) = (Cpu.kv_alloc(spec).unwrap(), g.kv_alloc(spec).unwrap());
        // Fill, wrap, then one call with more rows than slots (the last wins).
        for positions in [
            (0u32..5).collect::<Vec<_>>(),
            (5..13).collect(),
            (13..24).collect(),
        ] {
            let n = positions.len();
            let (ck, gk) = tensors(&g, &rng.vec(n * 16, 1.0), n, 16);
            let (cv, gv) = tensors(&g, &rng.vec(n * 16, 1.0), n, 16);
            let tokens = vec![0; n];
            Cpu.kv_write(&mut ckv, &ck, &cv, &Cpu.batch(&tokens, &positions));
            g.kv_write(&mut gkv, &gk, &gv, &g.batch(&tokens, &positions));
            let (k, v, pos) = gkv.to_host(&g);
            let what = format!("{dtype:?} store after {positions:?}");
            assert_eq!(pos, ckv.slot_pos, "{what}: slot positions");
            assert_eq!(bits(&k), bits(&ckv.k.to_f32()), "{what}: keys");
            assert_eq!(bits(&v), bits(&ckv.v.to_f32()), "{what}: values");
        }
    }
}

/// The fused RoPE + KV write against the CPU's three operations (the
/// trait's default) and, bit for bit, against the CUDA backend's own
/// `rope`, `rope`, `kv_write`: q and k rotated in place, and the store's
/// keys, values and slot positions. Odd head counts, GQA, a table shorter
/// than head_dim / 2, head_dim 256, far positions, and chunks that wrap a
/// ring of 7 slots (one holds more rows than slots: the last row wins).
#[test]
fn rope_kv_write_equals_rope_rope_kv_write() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(24);
    // (q heads, KV heads, head_dim, table pairs, attention factor)
    let cases = [
        (3, 3, 64, 32, 1.0),
        (6, 2, 16, 8, 1.3),
        (5, 1, 128, 64, 1.0),
        (4, 2, 32, 12, 1.0),
        (2, 1, 256, 128, 0.9),
    ];
    for ((qh, kh, hd, pairs, factor), dtype) in cases.into_iter().zip(KV_DTYPES.into_iter().cycle())
    {
        let rope = rope_table(hd, pairs, factor);
        let (q_dim, kv_dim) = (qh * hd, kh * hd);
        let spec = KvSpec {
            capacity: 7,
            kv_dim,
            dtype,
        };
        let mut ckv = Cpu.kv_alloc(spec).unwrap();
        let (mut fused, mut apart) = (g.kv_alloc(spec).unwrap(), g.kv_alloc(spec).unwrap());
        let mut pos = 4090u32;
        for n in [3, 5, 1, 9, 1] {
            let positions: Vec<u32> = (pos..pos + n as u32).collect();
            pos += n as u32;
            let tokens = vec![0; n];
            let (cb, gb) = (Cpu.batch(&tokens, &positions), g.batch(&tokens, &positions));
            let qd = rng.vec(n * q_dim, 2.0);
            let kd = rng.vec(n * kv_dim, 2.0);
            let (mut cq, mut gq) = tensors(&g, &qd, n, q_dim);
            let (mut ck, mut gk) = tensors(&g, &kd, n, kv_dim);
            let (cv, gv) = tensors(&g, &rng.vec(n * kv_dim, 2.0), n, kv_dim);
            Cpu.rope_kv_write(&mut cq, &mut ck, &cv, &mut ckv, hd, &cb, &rope);
            g.rope_kv_write(&mut gq, &mut gk, &gv, &mut fused, hd, &gb, &rope);
            let mut aq = g.upload_tensor(&qd, n, q_dim);
            let mut ak = g.upload_tensor(&kd, n, kv_dim);
            g.rope(&mut aq, hd, &gb, &rope);
            g.rope(&mut ak, hd, &gb, &rope);
            g.kv_write(&mut apart, &ak, &gv, &gb);

            let what = format!(
                "{qh}/{kh} heads of {hd}, {pairs} pairs, {dtype:?} store, at {positions:?}"
            );
            check(&format!("{what}: q"), &g, &gq, &cq, F32_TOL);
            check(&format!("{what}: k"), &g, &gk, &ck, F32_TOL);
            check_store(&what, &g, &fused, &ckv);
            let host = |t: &CudaTensor| bits(&g.to_host(t));
            assert_eq!(host(&gq), host(&aq), "{what}: q differs from rope's");
            assert_eq!(host(&gk), host(&ak), "{what}: k differs from rope's");
            let ((k, v, slots), (ak, av, aslots)) = (fused.to_host(&g), apart.to_host(&g));
            assert_eq!(
                slots, aslots,
                "{what}: slot positions differ from kv_write's"
            );
            assert_eq!(bits(&k), bits(&ak), "{what}: keys differ from kv_write's");
            assert_eq!(bits(&v), bits(&av), "{what}: values differ from kv_write's");
        }
    }
}

/// A recorded fused step (one row) replayed at later positions equals the
/// CPU's eager steps: the launch does not depend on the position, each
/// replay reads it from the overwritten batch, and the ring of 5 slots
/// wraps.
#[test]
fn recorded_rope_kv_write_replays_at_new_positions() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(25);
    let (qh, kh, hd) = (6, 2, 64);
    let rope = rope_table(hd, hd / 2, 1.0);
    let (q_dim, kv_dim) = (qh * hd, kh * hd);
    for dtype in KV_DTYPES {
        let spec = KvSpec {
            capacity: 5,
            kv_dim,
            dtype,
        };
        let (mut ckv, mut gkv, (mut gq, mut gk, mut gv), mut gb) = one_row(&g, spec, q_dim);
        assert!(g.begin_graph(), "the CUDA backend records");
        g.rope_kv_write(&mut gq, &mut gk, &gv, &mut gkv, hd, &gb, &rope);
        let graph = g.end_graph().expect("a recording");
        for pos in (0..12u32).chain([1000, 4095, 123_456]) {
            let gqkv = (&mut gq, &mut gk, &mut gv);
            let (mut cq, mut ck, cv) = next_step_inputs(&g, &mut rng, gqkv, 2.0);
            g.set_batch(&mut gb, &[0], &[pos]);
            g.replay(&graph);
            let cb = Cpu.batch(&[0], &[pos]);
            Cpu.rope_kv_write(&mut cq, &mut ck, &cv, &mut ckv, hd, &cb, &rope);
            let what = format!("replayed rope_kv_write ({dtype:?} store) at {pos}");
            check(&format!("{what}: q"), &g, &gq, &cq, F32_TOL);
            check(&format!("{what}: k"), &g, &gk, &ck, F32_TOL);
            check_store(&what, &g, &gkv, &ckv);
        }
    }
}

/// Feeds `chunks` (consecutive positions) through kv_write + attention on
/// both backends with random q/k/v and compares every attention output
/// (both stores hold the same values, in either dtype: `F32_TOL`).
fn attention_run(
    g: &Cuda,
    rng: &mut Rng,
    (p, dtype): (AttnParams, KvDtype),
    capacity: usize,
    chunks: &[usize],
    sinks: Option<DType>,
) {
    let kv_dim = p.num_kv_heads * p.head_dim;
    let q_dim = p.num_heads * p.head_dim;
    let spec = KvSpec {
        capacity,
        kv_dim,
        dtype,
    };
    let (mut ckv, mut gkv) = (Cpu.kv_alloc(spec).unwrap(), g.kv_alloc(spec).unwrap());
    let s = sinks.map(|dt| weight(g, &rng.vec(p.num_heads, 2.0), &[p.num_heads], dt));
    let mut pos = 0u32;
    for &n in chunks {
        let positions: Vec<u32> = (pos..pos + n as u32).collect();
        pos += n as u32;
        let (ck, gk) = tensors(g, &rng.vec(n * kv_dim, 1.0), n, kv_dim);
        let (cv, gv) = tensors(g, &rng.vec(n * kv_dim, 1.0), n, kv_dim);
        let tokens = vec![0; n];
        let (cb, gb) = (Cpu.batch(&tokens, &positions), g.batch(&tokens, &positions));
        Cpu.kv_write(&mut ckv, &ck, &cv, &cb);
        g.kv_write(&mut gkv, &gk, &gv, &gb);
        let (cq, gq) = tensors(g, &rng.vec(n * q_dim, 1.0), n, q_dim);
        let (mut c, mut o) = (Cpu.tensor(n, q_dim), g.tensor(n, q_dim));
        Cpu.attention(&cq, &ckv, &cb, &p, s.as_ref().map(|s| &s.0), &mut c);
        g.attention(&gq, &gkv, &gb, &p, s.as_ref().map(|s| &s.1), &mut o);
        let what = format!(
            "attention {p:?} {dtype:?} store, capacity {capacity} at {positions:?} sinks {sinks:?}"
        );
        check(&what, g, &o, &c, F32_TOL);
    }
}

#[test]
fn attention_full_sliding_gqa_sinks_softcap() {
    // The split-KV kernels, exactly (prefill-sized chunks would otherwise
    // take the bf16 flash kernel, tested in tests/flash_attention.rs).
    let Some(mut g) = gpu() else { return };
    g.set_precision(Precision::F32);
    let mut rng = Rng(10);
    for dtype in KV_DTYPES {
        let mut run = |p: AttnParams, capacity: usize, chunks: &[usize], sinks: Option<DType>| {
            attention_run(&g, &mut rng, (p, dtype), capacity, chunks, sinks)
        };
        let base = AttnParams {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 64,
            scale: 0.125,
            span: AttnSpan::Full,
            softcap: None,
        };
        // Full span: prefill then decode (GQA 2:1).
        run(base, 64, &[5, 1, 1, 33, 1], None);
        // head_dim 16, 8 query heads on one KV head, sliding window 4 in a ring
        // of window + chunk slots fed 3 at a time (wraps many times).
        let sliding = AttnParams {
            num_heads: 8,
            num_kv_heads: 1,
            head_dim: 16,
            scale: 0.25,
            span: AttnSpan::Sliding { window: 4 },
            softcap: None,
        };
        run(sliding, 7, &[3, 3, 3, 3, 3, 1, 1, 3], None);
        // Sinks (f32 and bf16), softcap, odd head counts.
        for sinks in [DType::F32, DType::BF16] {
            let p = AttnParams {
                num_heads: 6,
                num_kv_heads: 3,
                softcap: Some(2.0),
                ..base
            };
            run(p, 40, &[7, 1, 9, 1], Some(sinks));
            let ps = AttnParams {
                span: AttnSpan::Sliding { window: 5 },
                ..p
            };
            run(ps, 9, &[4, 4, 1, 4, 1], Some(sinks));
        }
        // Many keys: decode splits the slots over many blocks.
        run(base, 1200, &[512, 388, 1, 1], None);
        let wide = AttnParams {
            head_dim: 256,
            num_heads: 2,
            num_kv_heads: 1,
            scale: 0.0625,
            ..base
        };
        run(wide, 100, &[50, 1, 1], Some(DType::F32));
        // gpt-oss's grouping (8 query heads a KV head, head_dim 64, sinks) over
        // many keys, full and sliding: the GQA kernel's 16-head variant too.
        let oss = AttnParams {
            num_heads: 16,
            num_kv_heads: 2,
            head_dim: 64,
            ..base
        };
        run(oss, 700, &[300, 1, 1], Some(DType::BF16));
        let oss_sliding = AttnParams {
            span: AttnSpan::Sliding { window: 128 },
            ..oss
        };
        run(oss_sliding, 300, &[200, 1, 1], Some(DType::BF16));
        let group16 = AttnParams {
            num_heads: 16,
            num_kv_heads: 1,
            ..oss
        };
        run(group16, 200, &[90, 1], None);
        // Llama-3-8B's grouping (4 query heads a KV head, head_dim 128: tiles
        // of 16 slots, two lanes a key) over many keys, with a partial last
        // tile and rows that see different numbers of them.
        let llama = AttnParams {
            num_heads: 8,
            num_kv_heads: 2,
            head_dim: 128,
            scale: 0.088,
            ..base
        };
        run(llama, 1400, &[600, 637, 1, 1], None);
        // What the GQA kernels do not hold goes to the per-head kernel: 16
        // query heads a KV head at head_dim 128, and head_dim 18 (not a
        // multiple of 4).
        let wide_group = AttnParams {
            num_heads: 16,
            num_kv_heads: 1,
            head_dim: 128,
            ..base
        };
        run(wide_group, 100, &[40, 1], None);
        let odd = AttnParams {
            head_dim: 18,
            ..base
        };
        run(odd, 50, &[20, 1], None);
    }
}

/// A recorded decode step, replayed at later positions, equals the CPU's
/// eager steps: the recording's launch covers the whole ring, and each
/// replay reads its position from the overwritten batch (the ring of 10
/// slots wraps, the window of 6 slides). Both forms of a step: KV write +
/// attention, and the fused RoPE + store write + attention (with sinks),
/// whose store is checked too.
#[test]
fn recorded_decode_attention_replays_at_new_positions() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(21);
    let p = eight_heads_over_two(AttnSpan::Sliding { window: 6 }, Some(3.0));
    let rope = rope_table(64, 32, 1.0);
    let (kv_dim, q_dim) = (2 * 64, 8 * 64);
    let s = weight(&g, &rng.vec(8, 2.0), &[8], DType::F32);
    for (fused, dtype) in [false, true]
        .into_iter()
        .flat_map(|f| KV_DTYPES.map(|d| (f, d)))
    {
        let spec = KvSpec {
            capacity: 10,
            kv_dim,
            dtype,
        };
        let (mut ckv, mut gkv, (mut gq, mut gk, mut gv), mut gb) = one_row(&g, spec, q_dim);
        let mut out = g.tensor(1, q_dim);
        assert!(g.begin_graph(), "the CUDA backend records");
        if fused {
            let qkv = (&mut gq, &mut gk, &gv);
            g.rope_kv_attention(qkv, &mut gkv, &gb, &rope, &p, Some(&s.1), &mut out);
        } else {
            g.kv_write(&mut gkv, &gk, &gv, &gb);
            g.attention(&gq, &gkv, &gb, &p, None, &mut out);
        }
        let graph = g.end_graph().expect("a recording");
        for pos in 0..25u32 {
            let gqkv = (&mut gq, &mut gk, &mut gv);
            let (mut cq, mut ck, cv) = next_step_inputs(&g, &mut rng, gqkv, 1.0);
            g.set_batch(&mut gb, &[0], &[pos]);
            g.replay(&graph);
            let cb = Cpu.batch(&[0], &[pos]);
            let mut c = Cpu.tensor(1, q_dim);
            let what = format!("replayed step (fused: {fused}, {dtype:?} store) at {pos}");
            // Keys rotated by each backend (fused) or written as given.
            let tol = if fused {
                let qkv = (&mut cq, &mut ck, &cv);
                Cpu.rope_kv_attention(qkv, &mut ckv, &cb, &rope, &p, Some(&s.0), &mut c);
                check_store(&what, &g, &gkv, &ckv);
                rotated_attention_tol(dtype)
            } else {
                Cpu.kv_write(&mut ckv, &ck, &cv, &cb);
                Cpu.attention(&cq, &ckv, &cb, &p, None, &mut c);
                F32_TOL
            };
            check(&what, &g, &out, &c, tol);
        }
    }
}
