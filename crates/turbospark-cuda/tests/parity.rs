//! Every `Backend` operation of the CUDA backend against the CPU reference
//! (`turbospark_cpu::Cpu`) on random inputs of several shapes, odd sizes
//! included. Both backends get the same weight bytes (bf16 weights are the
//! same bf16 values on both), so differences come from summation order and
//! libm ulps, and on the bf16 GEMM paths from rounding operands to bf16.
//!
//! Tolerances: `common/tolerances.rs`. The linear products and GEMVs are
//! in `parity_linear.rs`, MoE in `parity_moe.rs`, the KV store and
//! attention over it in `parity_kv.rs`, token choice and sampling in
//! `sampling.rs`.
//!
//! Without a CUDA device each test prints "skipped: no CUDA device" and
//! passes.

use turbospark_backend::{Backend, Quant, RopeTable};
use turbospark_cpu::Cpu;
use turbospark_format::{Activation, DType, HostTensor};

mod common;

use common::*;

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
        let (c, d) = quantized(&g, &rng.vec(5 * 64, 1.0), [5, 64], q, 32);
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
        map: None,
    };
    assert!(g.upload(&u8t).is_err() && Cpu.upload(&u8t).is_err());
    let bad_scales = HostTensor {
        name: "s",
        dtype: DType::U8,
        shape: &[3],
        bytes: &bytes[..3],
        map: None,
    };
    let blocks = [0u8; 64];
    let b = HostTensor {
        name: "b",
        dtype: DType::U8,
        shape: &[4, 16],
        bytes: &blocks,
        map: None,
    };
    assert!(g.upload_mxfp4(&b, &bad_scales).is_err() && Cpu.upload_mxfp4(&b, &bad_scales).is_err());
    let odd = encode(&rng.vec(2 * 33, 1.0), DType::BF16);
    let oddt = HostTensor {
        name: "odd",
        dtype: DType::BF16,
        shape: &[2, 33],
        bytes: &odd,
        map: None,
    };
    assert!(
        g.upload_quantized(&oddt, Quant::Int8, 32).is_err()
            && Cpu.upload_quantized(&oddt, Quant::Int8, 32).is_err()
    );
    // Values beyond an f16 group scale: both refuse, naming the tensor.
    let huge = encode(&[1e7; 32], DType::F32);
    let huget = HostTensor {
        name: "huge",
        dtype: DType::F32,
        shape: &[1, 32],
        bytes: &huge,
        map: None,
    };
    for e in [
        g.upload_quantized(&huget, Quant::Int8, 32).err(),
        Cpu.upload_quantized(&huget, Quant::Int8, 32).err(),
    ] {
        let e = e.expect("an error").to_string();
        assert!(e.contains("huge") && e.contains("f16"), "{e}");
    }
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
            let zeros = vec![0; tokens.len()];
            Cpu.embed(&ct, &Cpu.batch(&tokens, &zeros), &mut c);
            g.embed(&gt, &g.batch(&tokens, &zeros), &mut o);
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
            let tokens = [0; 6];
            Cpu.rope(&mut c, head_dim, &Cpu.batch(&tokens, &positions), &rope);
            g.rope(&mut o, head_dim, &g.batch(&tokens, &positions), &rope);
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
