//! A decode step's fused RoPE + store write + attention kernel (every GQA
//! form's step over both store dtypes, `KvDtype`), CUDA backend against the
//! CPU reference (`turbospark_cpu::Cpu`) and against the CUDA backend's own
//! unfused operations, and a recorded step's attention with the int4 output
//! projection it releases early. The store and the unfused attention have
//! `parity_kv.rs`.
//!
//! Tolerances: `common/tolerances.rs`. Without a CUDA device each test
//! prints "skipped: no CUDA device" and passes.

use turbospark_backend::{AttnParams, Backend, KvDtype, KvSpec, Quant, RopeTable};
use turbospark_cpu::{Cpu, CpuKv};
use turbospark_cuda::{Cuda, CudaKv, Precision};
use turbospark_format::{AttnSpan, DType};

mod common;

use common::kv::*;
use common::*;

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
        32,
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
