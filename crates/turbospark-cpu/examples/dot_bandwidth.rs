//! How fast the CPU backend's decode GEMV streams a weight matrix, per
//! format, on 1 thread and on all of them: the figures behind BENCHMARKS.md's
//! CPU rows (`cargo run --release -p turbospark-cpu --example dot_bandwidth
//! [ROWS [COLS]]`; 131,072 rows of 2,048 by default, 537 MB in bf16, well
//! past the caches; 4,096 rows fit in them).

use std::time::Instant;

use turbospark_backend::{Quant, quant::quantize};
use turbospark_cpu::{CpuWeight, WeightData, linear::linear};

fn main() {
    let m: usize = std::env::args()
        .nth(1)
        .map_or(131_072, |v| v.parse().expect("ROWS"));
    let k: usize = std::env::args()
        .nth(2)
        .map_or(2048, |v| v.parse().expect("COLS, a multiple of 128"));
    // Any values will do: speed does not depend on them.
    let values: Vec<f32> = (0..m * k)
        .map(|i| ((i.wrapping_mul(2_654_435_761) % 1000) as f32 - 500.0) / 500.0)
        .collect();
    let shape = vec![m, k];
    let mut weights = Vec::new();
    // --quant-group's default (32) and 128 (COLS a multiple of 128).
    for (q, group) in [
        (Quant::Int8, 32),
        (Quant::Int4, 32),
        (Quant::Int8, 128),
        (Quant::Int4, 128),
    ] {
        let (codes, scales) = quantize(&values, q, group).expect("finite values");
        let data = WeightData::Quantized {
            quant: q,
            codes,
            scales,
            group,
            int_x: true,
        };
        weights.push((
            format!("{q:?}/{group}"),
            CpuWeight {
                data,
                shape: shape.clone(),
            },
        ));
    }
    let bits = values
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    weights.push((
        "bf16".into(),
        CpuWeight {
            data: WeightData::BF16(bits),
            shape: shape.clone(),
        },
    ));
    drop(values);
    let blocks = (0..m * k / 2)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    let scales = (0..m * k / 32).map(|i| 120 + (i % 8) as u8).collect();
    weights.push((
        "mxfp4".into(),
        CpuWeight {
            data: WeightData::Mxfp4 {
                blocks,
                scales,
                int_x: true,
            },
            shape,
        },
    ));

    let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
    let mut out = vec![0.0; m];
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, all] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        for (name, w) in &weights {
            pool.install(|| {
                linear(&x, 1, w, None, &mut out);
                let reps = (1_310_720 / m).max(10);
                let t = Instant::now();
                for _ in 0..reps {
                    linear(&x, 1, w, None, &mut out);
                }
                let s = t.elapsed().as_secs_f64() / reps as f64;
                println!(
                    "{threads} thread(s) {name:>5}: {:7.2} ms, {:5.1} GB/s, {:5.2} G values/s",
                    s * 1e3,
                    w.bytes() as f64 / s / 1e9,
                    (m * k) as f64 / s / 1e9
                );
            });
        }
    }
}
