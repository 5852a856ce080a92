//! The tensor-core flash-attention prefill kernel
//! (`turbospark_cuda::flash_attention`) against the CPU reference attention
//! (`turbospark_cpu::Cpu`) on random inputs: head_dim 64, 128 and 256, GQA
//! 4:1, 2:1 and 1:1, 1, 17, 64 and 200 query rows at positions continuing
//! after earlier cached rows, full and sliding spans, softcap, f32 and bf16
//! sinks, and rings that have wrapped (capacity < largest position + 1).
//! Both stores are filled through `Backend::kv_write` with the same rows,
//! and so is a third, a GPU store of bf16: the kernel over it must give
//! the f32 store's output bit for bit (it rounds f32 K and V to bf16 as it
//! stages them, as the bf16 store did when they were written; the bf16
//! form copies its tiles by cp.async and reads V's fragments transposed by
//! ldmatrix, so this also checks that those land the same values in the
//! same fragments).
//!
//! Tolerance, per call: max |Δ| ≤ 2e-2 · rms(reference), no NaN where the
//! reference has none. The kernel multiplies bf16 operands (q, k, the
//! probabilities p and v; f32 accumulation), the documented precision trade
//! of the prefill path. bf16 keeps 8 significant bits (unit roundoff 2^-8),
//! so each p_j and v_j carries a relative error of up to 2^-8 (≈ 2^-8/√3
//! rms) and the scores an absolute one of about 2^-8 · scale · |q|·|k|.
//! In the weighted average Σ p_j v_j / Σ p_j these errors are independent
//! and average out like the values do, so the output error per element is
//! ≈ 2.5e-3 · rms(output), and the maximum over the ~10^5 outputs of a
//! 200-row call lies near 5 of those: in an emulation of the kernel's
//! rounding on inputs of these shapes, max|Δ|/rms had mean 1.25e-2 and
//! standard deviation 1e-3 over 40 draws, so 2e-2 sits 7 deviations out,
//! while a fragment-layout or masking mistake shows up as an O(1) error.
//! That needs the rows of a call to see similar numbers of keys: a row
//! with few keys has a larger output (and error) than the rms over all
//! rows, so each sequence caches a long prefix (or a window) before its
//! query rows (with 37 cached rows before 200 queries the mean would be
//! 1.7e-2).
//!
//! Without a CUDA device each GPU test prints "skipped: no CUDA device" and
//! passes.

use turbospark_backend::{AttnParams, Backend, KvDtype, KvSpec};
use turbospark_cpu::{Cpu, CpuKv, CpuTensor};
use turbospark_cuda::flash_attention::{flash_attention, flash_supported};
use turbospark_cuda::{Cuda, CudaKv};
use turbospark_format::{AttnSpan, DType};

/// bf16 operands, f32 accumulation (see the module comment).
mod common;

use common::{Rng, gpu, rel_err, weight};

const BF16_TOL: f32 = 2e-2;

/// Writes `n` rows of random K and V (U[−1, 1)) at the next positions
/// (from `*pos`) into the stores; returns those positions.
fn write_kv(
    g: &Cuda,
    rng: &mut Rng,
    kvs: &mut (CpuKv, CudaKv, CudaKv),
    pos: &mut u32,
    n: usize,
) -> Vec<u32> {
    let kv_dim = kvs.0.spec.kv_dim;
    let positions: Vec<u32> = (*pos..*pos + n as u32).collect();
    *pos += n as u32;
    let tokens = vec![0u32; n];
    let (k, v) = (rng.vec(n * kv_dim, 1.0), rng.vec(n * kv_dim, 1.0));
    let (gk, gv) = (
        g.upload_tensor(&k, n, kv_dim),
        g.upload_tensor(&v, n, kv_dim),
    );
    let ck = CpuTensor {
        data: k,
        rows: n,
        cols: kv_dim,
    };
    let cv = CpuTensor {
        data: v,
        rows: n,
        cols: kv_dim,
    };
    Cpu.kv_write(&mut kvs.0, &ck, &cv, &Cpu.batch(&tokens, &positions));
    let gb = g.batch(&tokens, &positions);
    g.kv_write(&mut kvs.1, &gk, &gv, &gb);
    g.kv_write(&mut kvs.2, &gk, &gv, &gb);
    positions
}

/// One sequence: `prefix` rows are cached first (written only), then each
/// chunk of `chunks` rows is written to both stores and attended to, on the
/// CPU with `Backend::attention` and on the GPU with `flash_attention`.
/// q ~ U[−2, 2), k, v ~ U[−1, 1).
fn flash_run(
    g: &Cuda,
    rng: &mut Rng,
    p: AttnParams,
    capacity: usize,
    prefix: usize,
    chunks: &[usize],
    sink_dtype: Option<DType>,
) {
    assert!(flash_supported(p.head_dim));
    let kv_dim = p.num_kv_heads * p.head_dim;
    let q_dim = p.num_heads * p.head_dim;
    let spec = KvSpec {
        capacity,
        kv_dim,
        dtype: KvDtype::F32,
    };
    let bf16 = KvSpec {
        dtype: KvDtype::Bf16,
        ..spec
    };
    let mut kvs = (
        Cpu.kv_alloc(spec).unwrap(),
        g.kv_alloc(spec).unwrap(),
        g.kv_alloc(bf16).unwrap(),
    );
    let s = sink_dtype.map(|dt| weight(g, &rng.vec(p.num_heads, 2.0), &[p.num_heads], dt));
    let mut pos = 0u32;
    let mut cached = 0;
    while cached < prefix {
        let n = (prefix - cached).min(64);
        write_kv(g, rng, &mut kvs, &mut pos, n);
        cached += n;
    }
    for &n in chunks {
        let positions = write_kv(g, rng, &mut kvs, &mut pos, n);
        let qv = rng.vec(n * q_dim, 2.0);
        let cq = CpuTensor {
            data: qv.clone(),
            rows: n,
            cols: q_dim,
        };
        let gq = g.upload_tensor(&qv, n, q_dim);
        let mut c = Cpu.tensor(n, q_dim);
        let cb = Cpu.batch(&vec![0u32; n], &positions);
        Cpu.attention(&cq, &kvs.0, &cb, &p, s.as_ref().map(|s| &s.0), &mut c);

        let gb = g.batch(&vec![0u32; n], &positions);
        let mut o = g.tensor(n, q_dim);
        flash_attention(g, &gq, &kvs.1, &gb, &p, s.as_ref().map(|s| &s.1), &mut o);
        let got = g.to_host(&o);
        let err = rel_err(&got, &c.data);
        let (first, last) = (positions[0], positions[n - 1]);
        let what = format!(
            "flash attention {p:?} capacity {capacity} at positions {first}..={last} \
             sinks {sink_dtype:?}"
        );
        assert!(err <= BF16_TOL, "{what}: max|Δ|/rms = {err} > {BF16_TOL}");
        let mut ob = g.tensor(n, q_dim);
        flash_attention(g, &gq, &kvs.2, &gb, &p, s.as_ref().map(|s| &s.1), &mut ob);
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert!(
            bits(g.to_host(&ob)) == bits(got),
            "{what}: over a bf16 store it differs from the f32 store's"
        );
    }
}

#[test]
fn flash_supports_64_128_256_only() {
    for hd in [64, 128, 256] {
        assert!(flash_supported(hd), "{hd}");
    }
    for hd in [0, 8, 16, 32, 80, 96, 100, 112, 192, 512] {
        assert!(!flash_supported(hd), "{hd}");
    }
}

#[test]
fn flash_attention_full_span_gqa_and_mha() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(21);
    for head_dim in [64, 128] {
        // GQA 4:1 and 1:1.
        for (heads, kv_heads) in [(8, 2), (4, 4)] {
            let p = AttnParams {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                span: AttnSpan::Full,
                softcap: None,
            };
            // 300 cached rows, then 1, 17, 64 and 200 query rows (a
            // capacity that is not a multiple of the 64-slot tile).
            flash_run(&g, &mut rng, p, 600, 300, &[1, 17, 64, 200], None);
            // A chunk that wraps the ring part way (positions 480..=543 in
            // 500 slots): its later rows overwrite slots 0..=43, which
            // its earlier, unwrapped rows must not see. Tiles whose slots
            // all hold their own index skip the mask, so this checks that
            // the kernel verifies it instead of assuming it.
            flash_run(&g, &mut rng, p, 500, 480, &[64], None);
        }
    }
}

#[test]
fn flash_attention_sliding_softcap_sinks_wrapped_ring() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(22);
    for head_dim in [64, 128] {
        for (sink_dtype, softcap) in [(Some(DType::F32), None), (Some(DType::BF16), Some(2.0))] {
            let p = AttnParams {
                num_heads: 8,
                num_kv_heads: 2,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                span: AttnSpan::Sliding { window: 48 },
                softcap,
            };
            // Ring of window + largest chunk slots: positions reach 381, so
            // it has wrapped before the last chunks.
            flash_run(&g, &mut rng, p, 248, 100, &[1, 17, 64, 200], sink_dtype);
            // A small window in a small ring that wraps many times, 1:1.
            let small = AttnParams {
                num_heads: 4,
                num_kv_heads: 4,
                span: AttnSpan::Sliding { window: 16 },
                ..p
            };
            flash_run(
                &g,
                &mut rng,
                small,
                80,
                37,
                &[17, 1, 64, 64, 33],
                sink_dtype,
            );
        }
        // Softcap without sinks on a full span whose ring has wrapped
        // (positions up to 863 in 500 slots: each row sees 301 to 500 keys).
        let p = AttnParams {
            num_heads: 4,
            num_kv_heads: 1,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            span: AttnSpan::Full,
            softcap: Some(3.0),
        };
        flash_run(&g, &mut rng, p, 500, 600, &[64, 200], None);
    }
}

#[test]
fn flash_attention_head_dim_256() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(23);
    let p = AttnParams {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 256,
        scale: 0.0625,
        span: AttnSpan::Full,
        softcap: None,
    };
    flash_run(
        &g,
        &mut rng,
        p,
        400,
        200,
        &[1, 17, 64, 100],
        Some(DType::F32),
    );
    let sliding = AttnParams {
        span: AttnSpan::Sliding { window: 40 },
        softcap: Some(2.0),
        ..p
    };
    flash_run(&g, &mut rng, sliding, 104, 70, &[17, 64], Some(DType::BF16));
}
