//! Every `Backend` operation of the CUDA backend against the CPU reference
//! (`turbospark_cpu::Cpu`) on random inputs of several shapes, odd sizes
//! included. Both backends get the same weight bytes (bf16 weights are the
//! same bf16 values on both), so differences come from summation order and
//! libm ulps only.
//!
//! Tolerances, as max |Δ| / rms(reference) over each output:
//! - copies (embed, row, add, scale, KV store contents): exact;
//! - f32 paths (norm, activations, RoPE, GEMV, attention, MoE): 1e-4;
//! - cuBLAS paths of `linear` (≥ 4 rows): 1e-3. bf16 weights multiply x
//!   split into bf16 hi + lo (16 significand bits of x, ~1e-5 expected);
//!   f32/f16/int8/int4 weights run an f32 GEMM. The margin covers tensor-core
//!   accumulation order.
//!
//! Without a CUDA device each test prints "skipped: no CUDA device" and
//! passes.

use turbospark_backend::{AttnParams, Backend, Experts, KvSpec, MoeParams, Quant, RopeTable};
use turbospark_cpu::{Cpu, CpuTensor, CpuWeight};
use turbospark_cuda::{Cuda, CudaTensor, CudaWeight};
use turbospark_format::{Activation, AttnSpan, DType, ExpertAct, HostTensor, Routing};

const F32_TOL: f32 = 1e-4;
const GEMM_TOL: f32 = 1e-3;

fn gpu() -> Option<Cuda> {
    match Cuda::new() {
        Ok(c) => Some(c),
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// xorshift64*: reproducible inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [−scale, scale).
    fn f32(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(scale)).collect()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Checkpoint bytes of `values` in `dtype`.
fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::U8 => unreachable!("not a float dtype"),
    }
}

/// The same weight on both backends.
fn weight(g: &Cuda, values: &[f32], shape: &[usize], dtype: DType) -> (CpuWeight, CudaWeight) {
    let bytes = encode(values, dtype);
    let t = HostTensor {
        name: "w",
        dtype,
        shape,
        bytes: &bytes,
    };
    (Cpu.upload(&t).unwrap(), g.upload(&t).unwrap())
}

fn mxfp4(g: &Cuda, rng: &mut Rng, lead: &[usize], cols: usize) -> (CpuWeight, CudaWeight) {
    let groups = cols / 32;
    let mut bshape = lead.to_vec();
    bshape.extend([groups, 16]);
    let mut sshape = lead.to_vec();
    sshape.push(groups);
    let n: usize = sshape.iter().product();
    let blocks: Vec<u8> = (0..n * 16).map(|_| rng.next() as u8).collect();
    // Scales 2^−6 ..= 2^1: values of a realistic magnitude.
    let scales: Vec<u8> = (0..n).map(|_| 121 + rng.below(8) as u8).collect();
    let b = HostTensor {
        name: "blocks",
        dtype: DType::U8,
        shape: &bshape,
        bytes: &blocks,
    };
    let s = HostTensor {
        name: "scales",
        dtype: DType::U8,
        shape: &sshape,
        bytes: &scales,
    };
    (
        Cpu.upload_mxfp4(&b, &s).unwrap(),
        g.upload_mxfp4(&b, &s).unwrap(),
    )
}

fn quantized(g: &Cuda, values: &[f32], shape: [usize; 2], q: Quant) -> (CpuWeight, CudaWeight) {
    let bytes = encode(values, DType::BF16);
    let t = HostTensor {
        name: "w",
        dtype: DType::BF16,
        shape: &shape,
        bytes: &bytes,
    };
    (
        Cpu.upload_quantized(&t, q).unwrap(),
        g.upload_quantized(&t, q).unwrap(),
    )
}

fn tensors(g: &Cuda, data: &[f32], rows: usize, cols: usize) -> (CpuTensor, CudaTensor) {
    let cpu = CpuTensor {
        data: data.to_vec(),
        rows,
        cols,
    };
    (cpu, g.upload_tensor(data, rows, cols))
}

/// max |got − want| / rms(want); NaN where either has a NaN the other lacks.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    if got.iter().zip(want).any(|(a, b)| a.is_nan() != b.is_nan()) {
        return f32::NAN;
    }
    let rms =
        (want.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let max = got
        .iter()
        .zip(want)
        .filter(|(a, _)| !a.is_nan())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    if max == 0.0 {
        0.0
    } else {
        max / rms.max(1e-30) as f32
    }
}

fn check(what: &str, g: &Cuda, got: &CudaTensor, want: &CpuTensor, tol: f32) {
    assert_eq!(g.shape(got), (want.rows, want.cols), "{what}: shape");
    let err = rel_err(&g.to_host(got), &want.data);
    assert!(err <= tol, "{what}: max|Δ|/rms = {err} > {tol}");
}

#[test]
fn uploads_and_weight_bytes_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(1);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (c, d) = weight(&g, &rng.vec(7 * 33, 1.0), &[7, 33], dtype);
        assert_eq!(g.weight_bytes(&d), Cpu.weight_bytes(&c), "{dtype:?}");
    }
    let (c, d) = mxfp4(&g, &mut rng, &[3, 5], 64);
    assert_eq!(g.weight_bytes(&d), Cpu.weight_bytes(&c), "mxfp4");
    for q in [Quant::Int8, Quant::Int4] {
        let (c, d) = quantized(&g, &rng.vec(5 * 64, 1.0), [5, 64], q);
        assert_eq!(g.weight_bytes(&d), Cpu.weight_bytes(&c), "{q:?}");
    }
    let (c, d) = (
        Cpu.upload_f32(&[1.0, 2.0], &[2]).unwrap(),
        g.upload_f32(&[1.0, 2.0], &[2]).unwrap(),
    );
    assert_eq!(g.weight_bytes(&d), Cpu.weight_bytes(&c));
    // Both refuse the same things.
    let bytes = [0u8; 4];
    let u8t = HostTensor {
        name: "u8",
        dtype: DType::U8,
        shape: &[4],
        bytes: &bytes,
    };
    assert!(g.upload(&u8t).is_err() && Cpu.upload(&u8t).is_err());
    let bad_scales = HostTensor {
        name: "s",
        dtype: DType::U8,
        shape: &[3],
        bytes: &bytes[..3],
    };
    let blocks = [0u8; 64];
    let b = HostTensor {
        name: "b",
        dtype: DType::U8,
        shape: &[4, 16],
        bytes: &blocks,
    };
    assert!(g.upload_mxfp4(&b, &bad_scales).is_err() && Cpu.upload_mxfp4(&b, &bad_scales).is_err());
    let odd = encode(&rng.vec(2 * 33, 1.0), DType::BF16);
    let oddt = HostTensor {
        name: "odd",
        dtype: DType::BF16,
        shape: &[2, 33],
        bytes: &odd,
    };
    assert!(
        g.upload_quantized(&oddt, Quant::Int8).is_err()
            && Cpu.upload_quantized(&oddt, Quant::Int8).is_err()
    );
}

#[test]
fn tensors_rows_and_copies() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(2);
    let t = g.tensor(3, 5);
    assert_eq!(g.shape(&t), (3, 5));
    assert_eq!(g.to_host(&t), vec![0.0; 15]);
    assert!(g.to_host(&g.tensor(0, 4)).is_empty());
    for (rows, cols) in [(1, 7), (5, 33), (64, 2880)] {
        let data = rng.vec(rows * cols, 2.0);
        let (c, d) = tensors(&g, &data, rows, cols);
        assert_eq!(g.to_host(&d), data);
        for r in [0, rows / 2, rows - 1] {
            check("row", &g, &g.row(&d, r), &Cpu.row(&c, r), 0.0);
        }
    }
}

#[test]
fn embed_every_dtype() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(3);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for d in [7, 64, 2880] {
            let vocab = 50;
            let (ct, gt) = weight(&g, &rng.vec(vocab * d, 1.0), &[vocab, d], dtype);
            let tokens: Vec<u32> = (0..9)
                .map(|i| {
                    if i == 4 {
                        49
                    } else {
                        rng.below(vocab as u64) as u32
                    }
                })
                .collect();
            let mut c = Cpu.tensor(tokens.len(), d);
            let mut o = g.tensor(tokens.len(), d);
            Cpu.embed(&ct, &tokens, &mut c);
            g.embed(&gt, &tokens, &mut o);
            check(&format!("embed {dtype:?} d={d}"), &g, &o, &c, 0.0);
        }
    }
}

#[test]
fn rms_norm_over_rows_and_heads() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(4);
    // (cols, group width): whole rows, per-head groups of 64 and 16.
    for (cols, d) in [(7, 7), (64, 64), (2880, 2880), (256, 64), (128, 16)] {
        for rows in [1, 3, 5, 64] {
            for dtype in [DType::F32, DType::BF16] {
                let (cw, gw) = weight(&g, &rng.vec(d, 2.0), &[d], dtype);
                let (cx, gx) = tensors(&g, &rng.vec(rows * cols, 3.0), rows, cols);
                let (mut c, mut o) = (Cpu.tensor(rows, cols), g.tensor(rows, cols));
                Cpu.rms_norm(&cx, &cw, 1e-6, &mut c);
                g.rms_norm(&gx, &gw, 1e-6, &mut o);
                check(
                    &format!("rms_norm [{rows}, {cols}] / {d} {dtype:?}"),
                    &g,
                    &o,
                    &c,
                    F32_TOL,
                );
            }
        }
    }
}

#[test]
fn elementwise_add_scale_softcap_glu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(5);
    for (rows, cols) in [(1, 7), (5, 33), (64, 2880)] {
        let n = rows * cols;
        let (mut cx, mut gx) = tensors(&g, &rng.vec(n, 4.0), rows, cols);
        let (cy, gy) = tensors(&g, &rng.vec(n, 4.0), rows, cols);
        Cpu.add(&mut cx, &cy);
        g.add(&mut gx, &gy);
        check("add", &g, &gx, &cx, 0.0);
        Cpu.scale(&mut cx, 0.37);
        g.scale(&mut gx, 0.37);
        check("scale", &g, &gx, &cx, 0.0);
        Cpu.softcap(&mut cx, 1.5);
        g.softcap(&mut gx, 1.5);
        check("softcap", &g, &gx, &cx, F32_TOL);
        for act in [Activation::Silu, Activation::GeluTanh] {
            let (mut c, mut o) = (Cpu.tensor(rows, cols), g.tensor(rows, cols));
            Cpu.glu(&cx, &cy, act, &mut c);
            g.glu(&gx, &gy, act, &mut o);
            check(&format!("glu {act:?}"), &g, &o, &c, F32_TOL);
        }
    }
}

#[test]
fn rope_on_every_head_at_far_positions() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(6);
    for (head_dim, heads) in [(64, 3), (16, 8), (128, 2)] {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 10000f32.powf(-((2 * i) as f32) / head_dim as f32))
            .collect();
        for factor in [1.0, 1.3] {
            let rope = RopeTable {
                inv_freq: inv_freq.clone(),
                attention_factor: factor,
            };
            let positions = [0u32, 1, 7, 1000, 4095, 123_456];
            let cols = heads * head_dim;
            let data = rng.vec(positions.len() * cols, 2.0);
            let (mut c, mut o) = tensors(&g, &data, positions.len(), cols);
            Cpu.rope(&mut c, head_dim, &positions, &rope);
            g.rope(&mut o, head_dim, &positions, &rope);
            check(
                &format!("rope hd={head_dim} factor={factor}"),
                &g,
                &o,
                &c,
                F32_TOL,
            );
        }
    }
}

/// One linear on both backends; bias of `bias` dtype when given.
fn linear_case(
    g: &Cuda,
    rng: &mut Rng,
    w: &(CpuWeight, CudaWeight),
    n: usize,
    bias: Option<DType>,
    what: &str,
) {
    let (k, m) = (w.0.cols(), w.0.rows());
    let b = bias.map(|dt| weight(g, &rng.vec(m, 1.0), &[m], dt));
    let (cx, gx) = tensors(g, &rng.vec(n * k, 1.0), n, k);
    let (mut c, mut o) = (Cpu.tensor(n, m), g.tensor(n, m));
    Cpu.linear(&cx, &w.0, b.as_ref().map(|b| &b.0), &mut c);
    g.linear(&gx, &w.1, b.as_ref().map(|b| &b.1), &mut o);
    let tol = if n < 4 { F32_TOL } else { GEMM_TOL };
    check(
        &format!("linear {what} n={n} k={k} m={m} bias={bias:?}"),
        g,
        &o,
        &c,
        tol,
    );
}

#[test]
fn linear_dense_formats_in_both_regimes() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(7);
    for (k, m) in [(7, 5), (33, 70), (64, 130), (2880, 96)] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let w = weight(&g, &rng.vec(m * k, 0.5), &[m, k], dtype);
            for n in [1, 3, 5, 64] {
                for bias in [None, Some(DType::F32), Some(DType::BF16)] {
                    linear_case(&g, &mut rng, &w, n, bias, &format!("{dtype:?}"));
                }
            }
        }
    }
}

#[test]
fn linear_grouped_formats_in_both_regimes() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(8);
    for (k, m) in [(32, 5), (64, 70), (2880, 96)] {
        let mut formats = vec![("mxfp4".to_string(), mxfp4(&g, &mut rng, &[m], k))];
        for q in [Quant::Int8, Quant::Int4] {
            formats.push((
                format!("{q:?}"),
                quantized(&g, &rng.vec(m * k, 0.5), [m, k], q),
            ));
        }
        for (name, w) in &formats {
            for n in [1, 3, 5, 64] {
                linear_case(&g, &mut rng, w, n, Some(DType::BF16), name);
            }
        }
    }
}

#[test]
fn kv_store_follows_the_ring() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(9);
    let spec = KvSpec {
        capacity: 8,
        kv_dim: 16,
    };
    let (mut ckv, mut gkv) = (Cpu.kv_alloc(spec), g.kv_alloc(spec));
    // Fill, wrap, then one call with more rows than slots (the last wins).
    for positions in [
        (0u32..5).collect::<Vec<_>>(),
        (5..13).collect(),
        (13..24).collect(),
    ] {
        let n = positions.len();
        let (ck, gk) = tensors(&g, &rng.vec(n * 16, 1.0), n, 16);
        let (cv, gv) = tensors(&g, &rng.vec(n * 16, 1.0), n, 16);
        Cpu.kv_write(&mut ckv, &ck, &cv, &positions);
        g.kv_write(&mut gkv, &gk, &gv, &positions);
        let (k, v, pos) = gkv.to_host(&g);
        assert_eq!(pos, ckv.slot_pos, "slot positions after {positions:?}");
        assert_eq!(k, ckv.k, "keys after {positions:?}");
        assert_eq!(v, ckv.v, "values after {positions:?}");
    }
}

/// Feeds `chunks` (consecutive positions) through kv_write + attention on
/// both backends with random q/k/v and compares every attention output.
fn attention_run(
    g: &Cuda,
    rng: &mut Rng,
    p: AttnParams,
    capacity: usize,
    chunks: &[usize],
    sinks: Option<DType>,
) {
    let kv_dim = p.num_kv_heads * p.head_dim;
    let q_dim = p.num_heads * p.head_dim;
    let spec = KvSpec { capacity, kv_dim };
    let (mut ckv, mut gkv) = (Cpu.kv_alloc(spec), g.kv_alloc(spec));
    let s = sinks.map(|dt| weight(g, &rng.vec(p.num_heads, 2.0), &[p.num_heads], dt));
    let mut pos = 0u32;
    for &n in chunks {
        let positions: Vec<u32> = (pos..pos + n as u32).collect();
        pos += n as u32;
        let (ck, gk) = tensors(g, &rng.vec(n * kv_dim, 1.0), n, kv_dim);
        let (cv, gv) = tensors(g, &rng.vec(n * kv_dim, 1.0), n, kv_dim);
        Cpu.kv_write(&mut ckv, &ck, &cv, &positions);
        g.kv_write(&mut gkv, &gk, &gv, &positions);
        let (cq, gq) = tensors(g, &rng.vec(n * q_dim, 1.0), n, q_dim);
        let (mut c, mut o) = (Cpu.tensor(n, q_dim), g.tensor(n, q_dim));
        Cpu.attention(&cq, &ckv, &positions, &p, s.as_ref().map(|s| &s.0), &mut c);
        g.attention(&gq, &gkv, &positions, &p, s.as_ref().map(|s| &s.1), &mut o);
        let what = format!("attention {p:?} capacity {capacity} at {positions:?} sinks {sinks:?}");
        check(&what, g, &o, &c, F32_TOL);
    }
}

#[test]
fn attention_full_sliding_gqa_sinks_softcap() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(10);
    let base = AttnParams {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        span: AttnSpan::Full,
        softcap: None,
    };
    // Full span: prefill then decode (GQA 2:1).
    attention_run(&g, &mut rng, base, 64, &[5, 1, 1, 33, 1], None);
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
    attention_run(&g, &mut rng, sliding, 7, &[3, 3, 3, 3, 3, 1, 1, 3], None);
    // Sinks (f32 and bf16), softcap, odd head counts.
    for sinks in [DType::F32, DType::BF16] {
        let p = AttnParams {
            num_heads: 6,
            num_kv_heads: 3,
            softcap: Some(2.0),
            ..base
        };
        attention_run(&g, &mut rng, p, 40, &[7, 1, 9, 1], Some(sinks));
        let ps = AttnParams {
            span: AttnSpan::Sliding { window: 5 },
            ..p
        };
        attention_run(&g, &mut rng, ps, 9, &[4, 4, 1, 4, 1], Some(sinks));
    }
    // Many keys: decode splits the slots over many blocks.
    attention_run(&g, &mut rng, base, 1200, &[512, 388, 1, 1], None);
    let wide = AttnParams {
        head_dim: 256,
        num_heads: 2,
        num_kv_heads: 1,
        scale: 0.0625,
        ..base
    };
    attention_run(&g, &mut rng, wide, 100, &[50, 1, 1], Some(DType::F32));
}

#[test]
fn moe_routing_modes_activations_and_formats() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(11);
    let (experts, hidden, width) = (8, 64, 32);
    let routings = [
        Routing::TopKSoftmax,
        Routing::SoftmaxTopK { renormalize: false },
        Routing::SoftmaxTopK { renormalize: true },
    ];
    let acts = [
        ExpertAct::SwiGlu,
        ExpertAct::ClampedSwiGlu {
            alpha: 1.702,
            limit: 7.0,
        },
    ];
    for mx in [false, true] {
        let (gate_up, down) = if mx {
            (
                mxfp4(&g, &mut rng, &[experts, 2 * width], hidden),
                mxfp4(&g, &mut rng, &[experts, hidden], width),
            )
        } else {
            (
                weight(
                    &g,
                    &rng.vec(experts * 2 * width * hidden, 0.3),
                    &[experts, 2 * width, hidden],
                    DType::BF16,
                ),
                weight(
                    &g,
                    &rng.vec(experts * hidden * width, 0.3),
                    &[experts, hidden, width],
                    DType::BF16,
                ),
            )
        };
        for biases in [false, true] {
            let gub = biases.then(|| {
                weight(
                    &g,
                    &rng.vec(experts * 2 * width, 0.5),
                    &[experts, 2 * width],
                    DType::BF16,
                )
            });
            let db = biases.then(|| {
                weight(
                    &g,
                    &rng.vec(experts * hidden, 0.5),
                    &[experts, hidden],
                    DType::F32,
                )
            });
            let ce = Experts {
                gate_up: &gate_up.0,
                gate_up_bias: gub.as_ref().map(|b| &b.0),
                down: &down.0,
                down_bias: db.as_ref().map(|b| &b.0),
            };
            let ge = Experts {
                gate_up: &gate_up.1,
                gate_up_bias: gub.as_ref().map(|b| &b.1),
                down: &down.1,
                down_bias: db.as_ref().map(|b| &b.1),
            };
            for (routing, act, top_k) in [
                (routings[0], acts[1], 4),
                (routings[1], acts[0], 2),
                (routings[2], acts[0], 3),
                (routings[2], acts[1], 1),
            ] {
                let p = MoeParams {
                    num_experts: experts,
                    top_k,
                    width,
                    routing,
                    act,
                };
                for rows in [1, 3, 5, 33] {
                    let (cx, gx) = tensors(&g, &rng.vec(rows * hidden, 1.0), rows, hidden);
                    let (cl, gl) = tensors(&g, &rng.vec(rows * experts, 3.0), rows, experts);
                    let (mut c, mut o) = (Cpu.tensor(rows, hidden), g.tensor(rows, hidden));
                    Cpu.moe(&cx, &cl, &ce, &p, &mut c);
                    g.moe(&gx, &gl, &ge, &p, &mut o);
                    let what = format!("moe mxfp4={mx} biases={biases} {p:?} rows={rows}");
                    check(&what, &g, &o, &c, F32_TOL);
                }
            }
        }
    }
}
