//! The command as users (and the issue checks) drive it: `run --json` and
//! `logits` on every fixture family against transformers' references, the
//! quick-start model, and bad input giving one line and exit status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use turbospark_format::npy;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

fn turbospark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn reference(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("reference.json")).unwrap())
        .unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn csv(v: &[u64]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

const FAMILIES: [&str; 11] = [
    "llama3-rope",
    "llama-tied-bf16",
    "mistral-window",
    "qwen2-bias",
    "qwen3-qknorm",
    "gpt-oss-bf16",
    "gpt-oss-mxfp4",
    "gemma2",
    "gemma3",
    "qwen3-moe",
    "mixtral",
];

#[test]
fn run_json_reproduces_the_greedy_reference_for_every_family() {
    for name in FAMILIES {
        let r = reference(name);
        let dir = fixture(name);
        let out = turbospark(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-tokens",
            &csv(&ids(&r["tokens"])),
            "--max-tokens",
            "16",
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(ids(&json["tokens"]), ids(&r["greedy"]), "{name}");
        assert_eq!(
            json["prompt_tokens"],
            r["tokens"].as_array().unwrap().len(),
            "{name}"
        );
        assert!(json["decode_tok_s"].as_f64().unwrap() > 0.0);
    }
}

/// Negative sampling values are values, not flags, as llama.cpp takes
/// them: a negative temperature is greedy, and OpenAI's penalties go down
/// to -2.
#[test]
fn negative_sampling_values_parse() {
    let r = reference("qwen2-bias");
    let dir = fixture("qwen2-bias");
    let prompt = csv(&ids(&r["tokens"]));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-tokens",
            &prompt,
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = turbospark(&args);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        ids(&json["tokens"])
    };
    assert_eq!(run(&["--temperature", "-1"]), ids(&r["greedy"]));
    // The spaced form reads the same numbers as the `=` form.
    let spaced = run(&["--presence-penalty", "-2", "--frequency-penalty", "-0.5"]);
    let joined = run(&["--presence-penalty=-2", "--frequency-penalty=-0.5"]);
    assert_eq!(spaced, joined);
    // They took effect: favouring seen tokens leaves the greedy path.
    assert_ne!(spaced, ids(&r["greedy"]));
}

/// `inspect` reads config.json and the checkpoint's headers only: the
/// demo model's shape, its MXFP4 experts, YaRN and its memory, line by line.
#[test]
fn inspect_describes_the_demo_model() {
    let out = turbospark(&[
        "inspect",
        root().join("models/rust-docs-gpt-oss").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "architecture    gpt_oss",
        "layers          6 (3 sliding, 3 full)",
        "attention       8 query heads, 2 KV heads, head_dim 64",
        "experts         8 (top-2), width 320, MXFP4",
        "vocabulary      8192",
        "rope            theta 150000, yarn x4 (original context 512, beta fast/slow 32/1, \
         attention factor 1.1386, not truncated)",
        // 3 full layers x 2 KV heads x 64 x (K, V) x 4 bytes = 3 KiB a token.
        "KV cache        3.00 MiB per 1k tokens; 6.00 MiB at 2048 tokens \
         (full layers; the 3 sliding layers keep fixed rings); in f32 (a bf16 cache: half)",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
    }
    let rope = String::from_utf8(
        turbospark(&["inspect", fixture("llama3-rope").to_str().unwrap()]).stdout,
    )
    .unwrap();
    assert!(
        rope.contains(
            "theta 10000, llama3 x8 (original context 16, low/high frequency factors 1/4)"
        ),
        "{rope}"
    );
}

/// More threads than cores run, with a warning; as many do not warn.
#[test]
fn threads_past_the_cores_warn() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let run = |threads: usize| {
        let out = turbospark(&[
            "run",
            "--prompt-tokens",
            "1,2",
            "--max-tokens",
            "2",
            "--threads",
            &threads.to_string(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stderr).unwrap()
    };
    let warning = format!(
        "warning: --threads {} is more than the {cores} cores here",
        cores + 1
    );
    assert!(run(cores + 1).contains(&warning));
    assert!(!run(cores).contains("warning"));
}

#[test]
fn logits_writes_every_position_as_npy() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["qwen3-qknorm", "gpt-oss-mxfp4", "gemma2"] {
        let r = reference(name);
        let tokens = ids(&r["tokens"]);
        let out_file = tmp.path().join(format!("{name}.npy"));
        let out = turbospark(&[
            "logits",
            "--model",
            fixture(name).to_str().unwrap(),
            "--tokens",
            &csv(&tokens),
            "--out",
            out_file.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (shape, ours) = npy::read_f32(&out_file).unwrap();
        let (rshape, theirs) = npy::read_f32(&fixture(name).join("logits.npy")).unwrap();
        assert_eq!(shape, rshape);
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-2, "{name}: max |Δlogit| {worst}");
    }
}

#[test]
fn quick_start_runs_the_demo_model_without_model_flag() {
    let sample = || {
        let args = "--prompt|Ownership is|--max-tokens|8|--seed|3|--temperature|0.7|--json";
        let mut all = vec!["run"];
        all.extend(args.split('|'));
        let out = turbospark(&all);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let json = sample();
    assert_eq!(json["tokens"].as_array().unwrap().len(), 8);
    assert!(!json["text"].as_str().unwrap().is_empty());
    // Same seed, same text.
    assert_eq!(json["tokens"], sample()["tokens"]);
}

/// `perplexity --decode` scores the same tokens one decode step at a time
/// and says so; on the demo model (MXFP4 experts: decode rounds their
/// activations to int16) the two paths agree to ~1e-5.
#[test]
fn perplexity_scores_through_either_path() {
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("text.txt");
    std::fs::write(
        &text,
        "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{v:?}\");\n}\n",
    )
    .unwrap();
    let score = |extra: &[&str]| {
        let mut args = vec![
            "perplexity",
            "--text-file",
            text.to_str().unwrap(),
            "--context",
            "16",
            "--json",
        ];
        args.extend(extra);
        let out = turbospark(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let (prompt, decode) = (score(&[]), score(&["--decode"]));
    assert_eq!(prompt["scoring"], "prompt");
    assert_eq!(decode["scoring"], "decode");
    assert_eq!(prompt["scored_tokens"], decode["scored_tokens"]);
    assert!(prompt["windows"].as_u64().unwrap() >= 2);
    let (a, b) = (
        prompt["nll"].as_f64().unwrap(),
        decode["nll"].as_f64().unwrap(),
    );
    assert!((a - b).abs() < 1e-3 * a, "prompt nll {a}, decode nll {b}");
}

/// Asserts exit status 2 and a single line on stderr mentioning `needle`.
fn assert_clean_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "{needle:?} not in {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// clap's refusal of a flag's value: exit 2 and `needle` in its message
/// (several lines: the usage follows), which is returned.
fn usage_error(out: &Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(needle), "{needle:?} not in {err}");
    err
}

fn broken_copy(name: &str, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    edit(tmp.path());
    tmp
}

#[test]
fn device_names_a_gpu_by_number_and_refuses_anything_else() {
    usage_error(
        &turbospark(&["run", "--device", "gpu", "--prompt-tokens", "1"]),
        "invalid value 'gpu' for '--device <DEVICE>': use cpu, cuda, cuda:N (GPU N, from 0) or auto",
    );
    // GPU 1 in the tests' build (no CUDA backend), or on a machine without
    // it: one line naming the device asked for.
    let out = turbospark(&["run", "--device", "cuda:1", "--prompt-tokens", "1"]);
    assert_clean_error(&out, "--device cuda:1: ");
}

/// `--quant-group` takes the scale groups the formats have, and only
/// with `--quant`; with one, bench reports it.
#[test]
fn quant_group_is_a_scale_group_of_quant() {
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--prompt-tokens", "1", "--max-tokens", "1"];
        args.extend(extra);
        turbospark(&args)
    };
    usage_error(
        &run(&["--quant", "int8", "--quant-group", "100"]),
        "expected one of [32, 64, 128, 256] values a scale",
    );
    usage_error(&run(&["--quant-group", "128"]), "--quant <QUANT>");
    let out = run(&["--quant", "int4", "--quant-group", "128", "--device", "cpu"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = bench_json(&["--quant", "int8", "--quant-group", "128"]);
    assert_eq!(
        (j["quant"].as_str(), j["quant_group"].as_u64()),
        (Some("int8"), Some(128))
    );
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let run = |dir: &Path, tokens: &str| {
        turbospark(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-tokens",
            tokens,
            "--json",
        ])
    };
    assert_clean_error(&run(Path::new("/no/such/model"), "1"), "/no/such/model");
    let weights = fixture("qwen2-bias").join("model.safetensors");
    assert_clean_error(&run(&weights, "1"), "is a file, not a model directory");
    assert_clean_error(&run(&fixture("qwen2-bias"), "1,4000"), "token id 4000");
    // chat without a chat template says so before its first prompt.
    let no_template = fixture("qwen2-bias");
    assert_clean_error(
        &turbospark(&["chat", "--model", no_template.to_str().unwrap()]),
        "no chat template (chat_template.jinja or tokenizer_config.json); generate from plain \
         text with `turbospark run --prompt`",
    );
    // A context past the model's positions (the demo model: 2,048), for
    // generation and for perplexity.
    let demo = root().join("models/rust-docs-gpt-oss");
    let demo = demo.to_str().unwrap();
    let long = "--context 4096 is longer than the model's 2048 positions";
    let prompt = [
        "run",
        "--model",
        demo,
        "--prompt",
        "fn",
        "--context",
        "4096",
    ];
    assert_clean_error(&turbospark(&prompt), long);
    let readme = root().join("README.md");
    let score = [
        "perplexity",
        "--model",
        demo,
        "--text-file",
        readme.to_str().unwrap(),
        "--context",
        "4096",
    ];
    assert_clean_error(&turbospark(&score), long);
    let no_weights = broken_copy("qwen2-bias", |d| {
        std::fs::remove_file(d.join("model.safetensors")).unwrap()
    });
    assert_clean_error(&run(no_weights.path(), "1"), "model.safetensors");
    let bad_arch = broken_copy("qwen2-bias", |d| {
        let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
        std::fs::write(
            d.join("config.json"),
            cfg.replace("Qwen2ForCausalLM", "FalconForCausalLM"),
        )
        .unwrap();
    });
    assert_clean_error(&run(bad_arch.path(), "1"), "FalconForCausalLM");
    let bad_shape = broken_copy("qwen2-bias", |d| {
        let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
        let cfg = cfg.replace("\"intermediate_size\": 128", "\"intermediate_size\": 96");
        std::fs::write(d.join("config.json"), cfg).unwrap();
    });
    assert_clean_error(&run(bad_shape.path(), "1"), "gate_proj.weight");
    let bad_field = broken_copy("llama3-rope", |d| {
        let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
        let cfg = cfg.replace("\"llama3\"", "\"dynamic\"");
        std::fs::write(d.join("config.json"), cfg).unwrap();
    });
    assert_clean_error(&run(bad_field.path(), "1"), "rope_type");
}

#[test]
fn real_chat_templates_render_through_run_chat() {
    // The demo model with another real template: the prompt must be the
    // rendered conversation (so it is longer than the bare user text).
    let templates = root().join("crates/turbospark-text/testdata/templates");
    for template in [
        "google-gemma-2-2b-it.jinja",
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "Qwen-Qwen3-0.6B.jinja",
    ] {
        let model = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(root().join("models/rust-docs-gpt-oss")).unwrap() {
            let p = entry.unwrap().path();
            std::fs::copy(&p, model.path().join(p.file_name().unwrap())).unwrap();
        }
        std::fs::copy(
            templates.join(template),
            model.path().join("chat_template.jinja"),
        )
        .unwrap();
        let out = turbospark(&[
            "run",
            "--model",
            model.path().to_str().unwrap(),
            "--chat",
            "--prompt",
            "Hello",
            "--max-tokens",
            "2",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{template}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // "Hello" alone is one token; the rendered turn markers add many.
        assert!(
            json["prompt_tokens"].as_u64().unwrap() > 8,
            "{template}: {json}"
        );
    }
}

/// `bench --json` on one layer of the qwen3-0.6b shape, 8 prompt tokens,
/// on the CPU, with `extra` flags; its JSON object.
fn bench_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "--synthetic",
        "qwen3-0.6b",
        "--layers",
        "1",
        "--prompt-len",
        "8",
        "--json",
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    let out = turbospark(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_synthetic_reports_speed_and_the_bandwidth_ceiling() {
    // A real shape (Qwen3-0.6B's layer, embedding and head) with one layer.
    let json = bench_json(&["--gen-len", "2"]);
    let num = |k: &str| {
        json[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {json}"))
    };
    assert_eq!(json["model"], "synthetic qwen3-0.6b (1 layer)");
    // The CPU runs decode step by step: nothing to record.
    assert_eq!(json["decode_graph"], false);
    // The field is there (null), not missing: indexing a missing key
    // would give null too.
    assert_eq!(
        json.get("decode_graph_nodes"),
        Some(&serde_json::Value::Null)
    );
    assert_eq!(json["device"], "cpu");
    assert_eq!(json["layers"], 1);
    assert_eq!(json["prompt_len"], 8);
    assert_eq!(json["gen_len"], 2);
    // One untimed warmup by default (`--warmup`), greedy decode.
    assert_eq!(json["warmup"], 1);
    assert!(json["sampling"].is_null(), "{json}");
    for k in [
        "prefill_tok_s",
        "decode_tok_s",
        "copy_gb_s",
        "decode_gb_s",
        "weight_bytes",
        "rss_bytes",
        "peak_rss_bytes",
    ] {
        assert!(num(k) > 0.0, "{k} in {json}");
    }
    // Tied 151,936 × 1,024 bf16 embedding (the head) + one layer's
    // projections: q 2048, k and v 1024 each, o, and a 3,072-wide MLP.
    let layer = 1024 * (2048 + 1024 + 1024) + 2048 * 1024 + 3 * 1024 * 3072;
    let weights = num("weight_bytes_per_token");
    assert!(
        weights >= 2.0 * (151_936 * 1024 + layer) as f64,
        "weights read per token {weights}"
    );
    // Contexts 9 and 10: mean 9.5 rows of K and V, 8 heads of 128, f32.
    assert_eq!(json["kv_dtype"], "f32");
    assert_eq!(
        num("kv_bytes_per_token"),
        (9.5f64 * 1024.0 * 2.0 * 4.0).floor()
    );
    assert_eq!(num("bytes_per_token"), weights + num("kv_bytes_per_token"));
    let fraction = num("ceiling_fraction");
    assert!(
        fraction > 0.0 && fraction < 2.0,
        "ceiling fraction {fraction}"
    );
    let implied = num("decode_tok_s") * num("bytes_per_token") / 1e9;
    assert!((num("decode_gb_s") - implied).abs() <= 1e-6 * implied);
    assert!((fraction - num("decode_gb_s") / num("copy_gb_s")).abs() < 1e-9);
    // The CPU has no device memory of its own; its peak is the RSS.
    assert!(json["peak_gpu_bytes"].is_null(), "{json}");
    assert!(num("peak_rss_bytes") >= num("rss_bytes"));
}

/// `--kv-cache-dtype bf16` keeps a bf16 store (on the CPU too): half the
/// KV bytes a decoded token reads.
#[test]
fn bench_counts_a_bf16_kv_cache_at_half_the_bytes() {
    let json = bench_json(&["--gen-len", "2", "--kv-cache-dtype", "bf16"]);
    assert_eq!(json["kv_dtype"], "bf16");
    assert_eq!(
        json["kv_bytes_per_token"].as_f64(),
        Some((9.5f64 * 1024.0 * 2.0 * 2.0).floor())
    );
}

/// `bench --temperature` decodes by sampling, as `run` does, and says so.
#[test]
fn bench_samples_when_asked() {
    let json = bench_json(&[
        "--gen-len",
        "3",
        "--temperature",
        "0.8",
        "--top-k",
        "40",
        "--top-p",
        "0.9",
    ]);
    let s = &json["sampling"];
    assert_eq!(s["temperature"].as_f64(), Some(0.8f32 as f64), "{json}");
    assert_eq!(s["top_k"], 40, "{json}");
    assert_eq!(s["top_p"].as_f64(), Some(0.9f32 as f64), "{json}");
    assert!(json["decode_tok_s"].as_f64().unwrap() > 0.0, "{json}");
}

#[test]
fn bench_refuses_unknown_presets_and_two_model_sources() {
    let err = usage_error(
        &turbospark(&["bench", "--synthetic", "llama-9000", "--device", "cpu"]),
        "invalid value 'llama-9000' for '--synthetic <PRESET>'",
    );
    // The real presets are listed.
    for preset in [
        "llama-3.1-8b",
        "llama-3.2-1b",
        "gpt-oss-20b",
        "gpt-oss-120b",
        "qwen3-30b-a3b",
    ] {
        assert!(err.contains(preset), "{preset} not in {err}");
    }
    let out = turbospark(&[
        "bench",
        "--synthetic",
        "qwen3-0.6b",
        "--model",
        "/some/dir",
        "--device",
        "cpu",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'--synthetic <PRESET>' cannot be used with '--model <MODEL>'"),
        "{err}"
    );
    // --layers belongs to --synthetic.
    let out = turbospark(&["bench", "--layers", "1", "--device", "cpu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--synthetic"), "{err}");
    // Longer than the model's positions: refused before loading, for a
    // directory (the demo model: 2,048) and for a preset (131,072).
    let demo = root().join("models/rust-docs-gpt-oss");
    let demo = demo.to_str().unwrap();
    let bench = |source: &[&str], len: &str| {
        let mut args = vec!["bench", "--device", "cpu", "--prompt-len", len];
        args.extend_from_slice(source);
        turbospark(&args)
    };
    assert_clean_error(
        &bench(&["--model", demo], "2017"),
        "--prompt-len 2017 + --gen-len 32 = 2049 positions, but the model has 2048",
    );
    assert_clean_error(
        &bench(&["--synthetic", "llama-3.2-1b", "--layers", "1"], "131041"),
        "= 131073 positions, but the model has 131072",
    );
}
