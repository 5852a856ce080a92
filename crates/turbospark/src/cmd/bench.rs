//! `turbospark bench`: prefill and decode speed on a model directory.
//! Prefill runs `--prompt-len` pseudo-random tokens as one prompt; decode
//! then feeds `--gen-len` tokens one at a time (greedy tokens are not needed
//! for timing, so the same pseudo-random stream continues). Reported with the
//! weight bytes read per decoded token and the bandwidth that implies.

use std::time::Instant;

use anyhow::Result;
use serde_json::json;
use turbospark_backend::Backend;
use turbospark_engine::Engine;

use super::with_engine;
use crate::args::BenchArgs;

pub fn main(a: BenchArgs) -> Result<()> {
    with_engine!(&a.model, |engine| on(&a, &engine))
}

fn on<B: Backend + 'static>(a: &BenchArgs, engine: &Engine<B>) -> Result<()> {
    let spec = engine.model.spec();
    let vocab = spec.vocab_size as u64;
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % vocab) as u32
    };
    let prompt: Vec<u32> = (0..a.prompt_len.max(1)).map(|_| next()).collect();
    let mut session = engine.session(prompt.len() + a.gen_len + 1);
    let t0 = Instant::now();
    session.feed(&prompt, false)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 0..a.gen_len {
        session.feed(&[next()], false)?;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let prefill = prompt.len() as f64 / prefill_s;
    let decode = a.gen_len as f64 / decode_s.max(1e-9);
    let weight_bytes = engine.model.decode_bytes();
    let gbs = weight_bytes as f64 * decode / 1e9;
    let threads = rayon::current_num_threads();
    let (rss, peak_rss) = (proc_status_bytes("VmRSS:"), proc_status_bytes("VmHWM:"));
    if a.json {
        println!(
            "{}",
            json!({"device": engine.be.name(), "threads": threads, "prompt_len": prompt.len(),
                "gen_len": a.gen_len, "prefill_tok_s": prefill, "decode_tok_s": decode,
                "weight_bytes_per_token": weight_bytes, "decode_gb_s": gbs,
                "weight_bytes": engine.model.weight_bytes(&engine.be), "rss_bytes": rss, "peak_rss_bytes": peak_rss})
        );
    } else {
        println!("device {} ({threads} CPU threads)", engine.be.name());
        println!("prefill {:>9.1} tok/s  ({} tokens)", prefill, prompt.len());
        println!("decode  {:>9.1} tok/s  ({} tokens)", decode, a.gen_len);
        println!(
            "weights read per token {:.2} GB -> {:.1} GB/s",
            weight_bytes as f64 / 1e9,
            gbs
        );
        println!(
            "peak resident memory {:.2} GiB",
            peak_rss as f64 / (1u64 << 30) as f64
        );
    }
    Ok(())
}

/// A kB field of /proc/self/status (VmRSS, VmHWM) in bytes; 0 where /proc
/// is unavailable.
fn proc_status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
