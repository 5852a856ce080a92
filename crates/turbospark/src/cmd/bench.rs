//! `turbospark bench`: prefill and decode speed on a model directory.
//! Prefill runs `--prompt-len` pseudo-random tokens as one prompt; decode
//! then feeds `--gen-len` tokens one at a time (greedy tokens are not needed
//! for timing, so the same pseudo-random stream continues). Reported with the
//! weight bytes read per decoded token and the bandwidth that implies.

use std::time::Instant;

use anyhow::Result;
use serde_json::json;

use super::load_engine;
use crate::args::BenchArgs;

pub fn main(a: BenchArgs) -> Result<()> {
    let engine = load_engine(&a.model)?;
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
    // A tied embedding table is read once per token as the LM head only.
    let embed_bytes = (spec.vocab_size * spec.hidden_size * 2) as u64;
    let weight_bytes =
        engine.model.weight_bytes(&engine.be) - if spec.tie_embeddings { 0 } else { embed_bytes };
    let gbs = weight_bytes as f64 * decode / 1e9;
    let threads = rayon::current_num_threads();
    if a.json {
        println!(
            "{}",
            json!({"device": "cpu", "threads": threads, "prompt_len": prompt.len(),
                "gen_len": a.gen_len, "prefill_tok_s": prefill, "decode_tok_s": decode,
                "weight_bytes_per_token": weight_bytes, "decode_gb_s": gbs})
        );
    } else {
        println!("device cpu ({threads} threads)");
        println!("prefill {:>9.1} tok/s  ({} tokens)", prefill, prompt.len());
        println!("decode  {:>9.1} tok/s  ({} tokens)", decode, a.gen_len);
        println!(
            "weights read per token {:.2} GB -> {:.1} GB/s",
            weight_bytes as f64 / 1e9,
            gbs
        );
    }
    Ok(())
}
