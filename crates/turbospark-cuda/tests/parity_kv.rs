//! The KV store and attention over it, CUDA backend against the CPU
//! reference (`turbospark_cpu::Cpu`): the store's ring and dtype rule, RoPE
//! with the store write, split-KV attention (full and sliding spans, GQA,
//! sinks, softcap) and a decode step's fused kernel, each also replayed
//! from a recorded graph at new positions. Every test runs over both store
//! dtypes (`KvDtype`): the CPU's bf16 store is the reference for the GPU's.
//! The prompt-sized flash kernel has its own file, `flash_attention.rs`.
//!
//! Tolerances: `common/tolerances.rs`. Without a CUDA device each test
//! prints "skipped: no CUDA device" and passes.

use turbospark_backend::{AttnParams, Backend, KvDtype, KvSpec, Quant, RopeTable};
use turbospark_cpu::{Cpu, CpuKv, CpuTensor};
use turbospark_cuda::{Cuda, CudaBatch, CudaKv, CudaTensor, Precision};
use turbospark_format::{AttnSpan, DType};

mod common;

use common::*;

/// Both store dtypes.
const KV_DTYPES: [KvDtype; 2] = [KvDtype::F32, KvDtype::Bf16];

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

/// A RoPE table of `pairs` frequencies (fewer than head_dim / 2 leaves the
/// last pairs unrotated) and attention factor `factor`.
fn rope_table(head_dim: usize, pairs: usize, factor: f32) -> RopeTable {
    RopeTable {
        inv_freq: (0..pairs)
            .map(|i| 10000f32.powf(-((2 * i) as f32) / head_dim as f32))
            .collect(),
        attention_factor: factor,
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The CUDA store holds what the CPU's does: slot positions and values
/// exactly, keys (rotated) within RoPE's tolerance, or one bf16 ulp in a
/// bf16 store (`KEY_BF16_TOL`).
fn check_store(what: &str, g: &Cuda, gkv: &CudaKv, ckv: &CpuKv) {
    let (k, v, pos) = gkv.to_host(g);
    assert_eq!(pos, ckv.slot_pos, "{what}: slot positions");
    assert_eq!(bits(&v), bits(&ckv.v.to_f32()), "{what}: values");
    let err = rel_err(&k, &ckv.k.to_f32());
    let tol = keys_tol(gkv.spec.dtype);
    assert!(err <= tol, "{what}: keys max|Δ|/rms = {err} > {tol}");
}

/// The bound on keys each backend rotated itself, as stored.
fn keys_tol(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::F32 => F32_TOL,
        KvDtype::Bf16 => KEY_BF16_TOL,
    }
}

/// The bound on attention over keys each backend rotated itself.
fn rotated_attention_tol(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::F32 => F32_TOL,
        KvDtype::Bf16 => ATTN_BF16_KEYS_TOL,
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

/// Eight query heads of 64 over two KV heads (one GQA group of four).
fn eight_heads_over_two(span: AttnSpan, softcap: Option<f32>) -> AttnParams {
    AttnParams {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        span,
        softcap,
    }
}

/// Both backends' stores of `spec`, and the GPU's one-row q, k, v and
/// batch (position 0) that a recorded decode step reads.
fn one_row(g: &Cuda, spec: KvSpec, q_dim: usize) -> (CpuKv, CudaKv, QkvRow, CudaBatch) {
    let kv = spec.kv_dim;
    let row = (g.tensor(1, q_dim), g.tensor(1, kv), g.tensor(1, kv));
    let kvs = (Cpu.kv_alloc(spec).unwrap(), g.kv_alloc(spec).unwrap());
    (kvs.0, kvs.1, row, g.batch(&[0], &[0]))
}

/// A decode row's q, k and v on the GPU.
type QkvRow = (CudaTensor, CudaTensor, CudaTensor);

/// A recorded step's next inputs: random q, k and v rows (values within
/// ±`scale`) copied into the tensors the recording reads, and the CPU's
/// copies of them.
fn next_step_inputs(
    g: &Cuda,
    rng: &mut Rng,
    (gq, gk, gv): (&mut CudaTensor, &mut CudaTensor, &mut CudaTensor),
    scale: f32,
) -> (CpuTensor, CpuTensor, CpuTensor) {
    let mut next = |t: &mut CudaTensor| {
        let (c, d) = tensors(g, &rng.vec(t.cols, scale), 1, t.cols);
        g.copy(&d, t);
        c
    };
    (next(gq), next(gk), next(gv))
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

/// A recorded decode step's attention over several splits and its int4
/// output projection, replayed, equal the CPU's eager steps. With int4
/// weights uploaded, `attn_combine` releases the projection before its own
/// wait (src/lib.rs `int4_linears`), so the projection's blocks start while
/// attention still runs: this holds it to reading nothing but weights
/// before its wait (a build whose int4 GEMV rounded x before waiting failed
/// here).
#[test]
fn recorded_attention_and_int4_projection_replay_as_the_cpus() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(31);
    let p = eight_heads_over_two(AttnSpan::Full, None);
    let rope = rope_table(64, 32, 1.0);
    let (kv_dim, q_dim, hidden) = (2 * 64, 8 * 64, 256);
    let o = quantized(
        &g,
        &rng.vec(hidden * q_dim, 0.5),
        [hidden, q_dim],
        Quant::Int4,
    );
    for dtype in KV_DTYPES {
        let spec = KvSpec {
            capacity: 200,
            kv_dim,
            dtype,
        };
        let (mut ckv, mut gkv, (mut gq, mut gk, mut gv), mut gb) = one_row(&g, spec, q_dim);
        let (mut attn, mut y) = (g.tensor(1, q_dim), g.tensor(1, hidden));
        assert!(g.begin_graph(), "the CUDA backend records");
        let qkv = (&mut gq, &mut gk, &gv);
        g.rope_kv_attention(qkv, &mut gkv, &gb, &rope, &p, None, &mut attn);
        g.linear(&attn, &o.1, None, &mut y);
        let graph = g.end_graph().expect("a recording");
        for pos in 0..160u32 {
            let gqkv = (&mut gq, &mut gk, &mut gv);
            let (mut cq, mut ck, cv) = next_step_inputs(&g, &mut rng, gqkv, 1.0);
            g.set_batch(&mut gb, &[0], &[pos]);
            g.replay(&graph);
            let cb = Cpu.batch(&[0], &[pos]);
            let (mut ca, mut cy) = (Cpu.tensor(1, q_dim), Cpu.tensor(1, hidden));
            let qkv = (&mut cq, &mut ck, &cv);
            Cpu.rope_kv_attention(qkv, &mut ckv, &cb, &rope, &p, None, &mut ca);
            Cpu.linear(&ca, &o.0, None, &mut cy);
            let what = format!("{dtype:?} store, position {pos}");
            check(
                &format!("attention, {what}"),
                &g,
                &attn,
                &ca,
                rotated_attention_tol(dtype),
            );
            check(
                &format!("int4 projection, {what}"),
                &g,
                &y,
                &cy,
                GEMV_INT8_X_TOL,
            );
        }
    }
}

/// One decode step of the fused RoPE + store + attention (a GQA kernel's
/// step form on one row) on both backends: the output within
/// `rotated_attention_tol` of the CPU's, the store as the CPU's
/// (`check_store`) and, bit for bit, as the CUDA backend's own
/// `rope_kv_write` leaves it; and the output as the CUDA backend's own
/// attention over that store computes it (the split kernels over the same
/// values: within 1e-5 over an f32 store and F32_TOL over a bf16 one, whose
/// tensor-core forms carry 16 bits of q and the weights, so the step scores
/// its own key and value as the store keeps them, rounded in a bf16 store,
/// where rounding them differently would be ~1e-3; the window form, one
/// block over the whole window, merges in another order: 1.5e-6 seen).
/// `form` names the kernels the backend was set to, for the messages.
#[allow(clippy::too_many_arguments)]
fn step_both(
    g: &Cuda,
    rng: &mut Rng,
    p: &AttnParams,
    rope: &RopeTable,
    sinks: Option<&(turbospark_cpu::CpuWeight, turbospark_cuda::CudaWeight)>,
    (ckv, gkv, apart): (&mut CpuKv, &mut CudaKv, &mut CudaKv),
    pos: u32,
    form: &str,
) {
    let (q_dim, kv_dim) = (p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim);
    let (mut cq, mut gq) = tensors(g, &rng.vec(q_dim, 1.0), 1, q_dim);
    let (mut ck, mut gk) = tensors(g, &rng.vec(kv_dim, 1.0), 1, kv_dim);
    let (cv, gv) = tensors(g, &rng.vec(kv_dim, 1.0), 1, kv_dim);
    let mut ak = g.upload_tensor(&g.to_host(&gk), 1, kv_dim);
    let mut aq = g.upload_tensor(&g.to_host(&gq), 1, q_dim);
    let (cb, gb) = (Cpu.batch(&[0], &[pos]), g.batch(&[0], &[pos]));
    let (mut c, mut o) = (Cpu.tensor(1, q_dim), g.tensor(1, q_dim));
    let (cs, gs) = (sinks.map(|s| &s.0), sinks.map(|s| &s.1));
    Cpu.rope_kv_attention((&mut cq, &mut ck, &cv), ckv, &cb, rope, p, cs, &mut c);
    g.rope_kv_attention((&mut gq, &mut gk, &gv), gkv, &gb, rope, p, gs, &mut o);
    g.rope_kv_write(&mut aq, &mut ak, &gv, apart, p.head_dim, &gb, rope);
    let mut ao = g.tensor(1, q_dim);
    g.attention(&aq, apart, &gb, p, gs, &mut ao);
    let what = format!(
        "fused step {p:?} ({:?} store, {form}) at {pos}",
        gkv.spec.dtype
    );
    check(&what, g, &o, &c, rotated_attention_tol(gkv.spec.dtype));
    // The same kernel form rotates either way (bit for bit), except a
    // sliding span's window form against the split form: an f32 store's
    // forms agree to f32 rounding; a bf16 store's tensor-core forms carry
    // 16 bits of q and of each weight (kernels/attention_mma.cuh), and two
    // groupings of the keys differ by a few 1e-5 (F32_TOL bounds them).
    let bound = match gkv.spec.dtype {
        KvDtype::F32 => 1e-5,
        KvDtype::Bf16 => F32_TOL,
    };
    let err = rel_err(&g.to_host(&o), &g.to_host(&ao));
    assert!(
        err <= bound,
        "{what}: max|Δ|/rms = {err} from rope_kv_write + attention"
    );
    check_store(&what, g, gkv, ckv);
    let ((k, v, slots), (ak, av, aslots)) = (gkv.to_host(g), apart.to_host(g));
    assert_eq!(
        slots, aslots,
        "{what}: slot positions differ from rope_kv_write's"
    );
    assert_eq!(
        bits(&k),
        bits(&ak),
        "{what}: keys differ from rope_kv_write's"
    );
    assert_eq!(
        bits(&v),
        bits(&av),
        "{what}: values differ from rope_kv_write's"
    );
}

/// The fused decode step (RoPE, store write, attention and the merge of
/// its splits in one launch) on every GQA kernel's shapes after a prompt
/// (which takes the two-operation path): full and sliding spans, sinks
/// (f32, bf16), softcap, a rotary table shorter than head_dim / 2, a
/// head_dim below its kernel's (96 on the 128 kernel), many splits, a ring
/// of 9 slots that wraps, a window over a wrapping ring of many splits, a
/// window of 128 over a ring that wraps (the window form over a bf16
/// store; `step_both` holds it to the split kernels) and a full
/// span past its ring's capacity.
#[test]
fn rope_kv_attention_steps_equal_the_cpus() {
    let Some(mut g) = gpu() else { return };
    g.set_precision(Precision::F32);
    let mut rng = Rng(26);
    let base = AttnParams {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 128,
        scale: 0.088,
        span: AttnSpan::Full,
        softcap: None,
    };
    // (params, rotary pairs, capacity, prompt, steps, sinks)
    let cases = [
        (base, 64, 1400, 1100, 3, None),
        // Qwen3-30B-A3B's grouping (8 query heads a KV head, head_dim 128).
        (
            AttnParams {
                num_heads: 16,
                ..base
            },
            64,
            700,
            500,
            2,
            None,
        ),
        (
            AttnParams {
                head_dim: 96,
                ..base
            },
            20,
            300,
            40,
            2,
            None,
        ),
        (
            AttnParams {
                num_heads: 16,
                head_dim: 64,
                span: AttnSpan::Sliding { window: 128 },
                ..base
            },
            24,
            300,
            200,
            3,
            Some(DType::BF16),
        ),
        (
            AttnParams {
                num_heads: 16,
                num_kv_heads: 1,
                head_dim: 64,
                ..base
            },
            32,
            200,
            90,
            2,
            Some(DType::F32),
        ),
        (
            AttnParams {
                num_heads: 2,
                num_kv_heads: 1,
                head_dim: 256,
                softcap: Some(2.0),
                ..base
            },
            128,
            100,
            50,
            2,
            None,
        ),
        (
            AttnParams {
                num_heads: 6,
                num_kv_heads: 3,
                head_dim: 64,
                span: AttnSpan::Sliding { window: 5 },
                ..base
            },
            32,
            9,
            4,
            12,
            Some(DType::F32),
        ),
        // A window over a ring of five tiles that wraps: past its capacity
        // each split keeps its part of the window's arc of slots, and the
        // splits between see nothing.
        (
            AttnParams {
                num_heads: 16,
                head_dim: 64,
                span: AttnSpan::Sliding { window: 40 },
                ..base
            },
            32,
            160,
            150,
            40,
            Some(DType::BF16),
        ),
        // gpt-oss's window of 128 (head_dim 64, 8 heads a group) over a
        // ring of 136 that wraps at position 136: a bf16 store takes the
        // window form, its four tiles in position space two runs of slots.
        (
            AttnParams {
                num_heads: 16,
                head_dim: 64,
                span: AttnSpan::Sliding { window: 128 },
                ..base
            },
            32,
            136,
            130,
            12,
            Some(DType::BF16),
        ),
        // A full span past its ring's capacity: every slot holds a visible
        // key, and the splits cover the whole ring.
        (
            AttnParams {
                head_dim: 64,
                ..base
            },
            32,
            70,
            60,
            25,
            Some(DType::F32),
        ),
    ];
    // Each case over both stores, and a bf16 store's over both forms of
    // the decode kernels where the tensor-core ones hold the shapes.
    let cases = cases.into_iter().flat_map(|c| {
        [
            (KvDtype::F32, true),
            (KvDtype::Bf16, true),
            (KvDtype::Bf16, false),
        ]
        .map(|(d, mma)| (c, d, mma))
    });
    for ((p, pairs, capacity, prompt, steps, sinks), dtype, mma) in cases {
        g.set_mma_attention(mma);
        let rope = rope_table(p.head_dim, pairs, 1.1);
        let kv_dim = p.num_kv_heads * p.head_dim;
        let q_dim = p.num_heads * p.head_dim;
        let spec = KvSpec {
            capacity,
            kv_dim,
            dtype,
        };
        let (mut ckv, mut gkv, mut apart) = (
            Cpu.kv_alloc(spec).unwrap(),
            g.kv_alloc(spec).unwrap(),
            g.kv_alloc(spec).unwrap(),
        );
        let s = sinks.map(|dt| weight(&g, &rng.vec(p.num_heads, 2.0), &[p.num_heads], dt));
        // The prompt: several rows, the two-operation path on both.
        let positions: Vec<u32> = (0..prompt as u32).collect();
        let tokens = vec![0; prompt];
        let (cb, gb) = (Cpu.batch(&tokens, &positions), g.batch(&tokens, &positions));
        let (mut cq, mut gq) = tensors(&g, &rng.vec(prompt * q_dim, 1.0), prompt, q_dim);
        let (mut ck, mut gk) = tensors(&g, &rng.vec(prompt * kv_dim, 1.0), prompt, kv_dim);
        let (cv, gv) = tensors(&g, &rng.vec(prompt * kv_dim, 1.0), prompt, kv_dim);
        let (mut c, mut o) = (Cpu.tensor(prompt, q_dim), g.tensor(prompt, q_dim));
        let (cs, gs) = (s.as_ref().map(|s| &s.0), s.as_ref().map(|s| &s.1));
        Cpu.rope_kv_attention(
            (&mut cq, &mut ck, &cv),
            &mut ckv,
            &cb,
            &rope,
            &p,
            cs,
            &mut c,
        );
        g.rope_kv_attention(
            (&mut gq, &mut gk, &gv),
            &mut gkv,
            &gb,
            &rope,
            &p,
            gs,
            &mut o,
        );
        // The two-operation path leaves k rotated: the same store.
        g.kv_write(&mut apart, &gk, &gv, &gb);
        let tol = rotated_attention_tol(dtype);
        let form = format!("tensor-core forms {mma}");
        check(
            &format!("prompt {p:?} ({dtype:?} store, {form})"),
            &g,
            &o,
            &c,
            tol,
        );
        for i in 0..steps {
            let kvs = (&mut ckv, &mut gkv, &mut apart);
            step_both(
                &g,
                &mut rng,
                &p,
                &rope,
                s.as_ref(),
                kvs,
                (prompt + i) as u32,
                &form,
            );
        }
    }
}
