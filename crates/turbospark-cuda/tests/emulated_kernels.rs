//! The CUDA kernels' own source run on the CPU, so that every test run
//! (CI has no GPU) checks their indexing, reductions and formats against
//! host references. Each program in `tests/emulate/` includes kernel files
//! behind `cuda_shim.h`, which stands in for enough of CUDA (a block's
//! threads as fibers in lockstep, warp shuffles, asynchronous copies that
//! land as late as their waits allow); this file compiles each with the
//! system's C++ compiler and runs it twice, the block's threads taking
//! turns in ascending and then descending order (a missing barrier shows
//! in one of them), then once more built with AddressSanitizer and
//! UndefinedBehaviorSanitizer (an access past a buffer fails it, as
//! compute-sanitizer's memcheck would on a GPU). The programs print a line
//! a check and end with "all ok".
//!
//! The GPU tests (`parity*.rs`, `fixtures_on_gpu.rs`) stay the proof: the
//! emulation sees no timing, no memory model beyond the copies' waits, and
//! the host's float rounding rather than the GPU's fused multiply-adds.
//! Without a C++ compiler (`$CXX`, else `c++`) each test prints "skipped: no
//! C++ compiler" and passes, unless `TURBOSPARK_REQUIRE_EMULATION` is set
//! (CI sets it: `.ci/run`), when it fails.

#[path = "common/cxx.rs"]
mod cxx;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The compiler's flags. -ffp-contract=off: a * then + stays two roundings
/// where the kernels ask for _rn arithmetic (cuda_shim.h).
const FLAGS: &[&str] = &[
    "-std=c++20",
    "-O1",
    "-fno-strict-aliasing",
    "-ffp-contract=off",
    "-Wall",
    "-Wno-unknown-pragmas",
    "-Wno-unused-function",
    "-Werror",
];

/// The second build's: AddressSanitizer and UndefinedBehaviorSanitizer,
/// every report fatal. The CPU's compute-sanitizer memcheck: a kernel that
/// reads or writes past a buffer (the weights, x, the store, shared memory)
/// fails here even where the value it got was never used.
const SANITIZERS: &[&str] = &[
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
];

/// Builds `source` into `binary` with `extra` flags; false when there is no
/// C++ compiler (and none is required).
fn build(compiler: &str, source: &Path, binary: &Path, extra: &[&str]) -> bool {
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut command = Command::new(compiler);
    command.args(FLAGS).args(extra).arg("-I").arg(kernels);
    command.arg(source).arg("-o").arg(binary);
    let Some(out) = cxx::run(&mut command, "the emulated kernel tests") else {
        return false;
    };
    let hint = if extra.is_empty() {
        ""
    } else {
        " (the sanitizers need libasan and libubsan; TURBOSPARK_EMULATION_SANITIZERS=0 \
         leaves this build out)"
    };
    assert!(
        out.status.success(),
        "{compiler} {} could not build {}{hint}:\n{}",
        extra.join(" "),
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// Runs `binary` with `env`; panics with its output unless it ends "all ok".
fn check(binary: &Path, what: &str, env: &[(&str, &str)]) {
    let out = Command::new(binary)
        .envs(env.iter().copied())
        .output()
        .expect("the emulation runs");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{what}:\n{text}");
    assert!(
        out.status.success() && text.trim_end().ends_with("all ok"),
        "{what} failed (status {}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds `tests/emulate/NAME.cpp` and runs it: with the block's threads
/// taking turns in both orders (cuda_shim.h's `reverse_order`: a write and
/// a read with no barrier between them are caught in one), and built with
/// the sanitizers (unless `TURBOSPARK_EMULATION_SANITIZERS=0`).
fn run(name: &str) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/emulate")
        .join(format!("{name}.cpp"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let compiler = cxx::compiler();
    let plain = dir.join(format!("emulate-{name}"));
    if !build(&compiler, &source, &plain, &[]) {
        return;
    }
    for order in ["forward", "reverse"] {
        let what = format!("{name}, threads in {order} order");
        check(&plain, &what, &[("TS_EMULATE_ORDER", order)]);
    }
    if std::env::var("TURBOSPARK_EMULATION_SANITIZERS").as_deref() == Ok("0") {
        eprintln!("the sanitizer build left out (TURBOSPARK_EMULATION_SANITIZERS=0)");
        return;
    }
    let sanitized = dir.join(format!("emulate-{name}-sanitized"));
    build(&compiler, &source, &sanitized, SANITIZERS);
    // Leaks are not what this looks for (and LeakSanitizer needs ptrace,
    // which containers may forbid).
    let what = format!("{name}, under AddressSanitizer and UndefinedBehaviorSanitizer");
    check(&sanitized, &what, &[("ASAN_OPTIONS", "detect_leaks=0")]);
}

/// kernels/attention.cu and attention_combine.cu: a decode step's fused
/// kernels, every GQA form (the tensor-core ones included) and
/// `attn_partial`, over f32 and bf16 stores (`tests/emulate/attention.cpp`).
#[test]
fn attention_kernels_match_the_host() {
    run("attention");
}

/// kernels/attention_mma.cuh: the tensor-core decode form's tile against
/// f64 over groups, head dims, masks, softcaps and tiles a split
/// (`tests/emulate/mma_tile.cpp`).
#[test]
fn tensor_core_decode_tile_matches_the_host() {
    run("mma_tile");
}

/// kernels/gemv_grouped.cu: the MXFP4, int8 and int4 GEMVs, f32- and
/// integer-activation forms, with segments, biases, a fused norm, residual
/// adds, gate/up activations and expert jobs
/// (`tests/emulate/gemv_grouped.cpp`).
#[test]
fn grouped_gemvs_match_the_host() {
    run("gemv_grouped");
}

/// kernels/gemv_dense.cu and gemv_grouped_stream.cu: the dense GEMVs and
/// the streamed ones (bf16, f16 and int8 rings of bulk copies on
/// mbarriers) with segments, biases, a fused norm, residual adds and
/// gate/up activations (`tests/emulate/gemv_dense.cpp`).
#[test]
fn dense_and_streamed_gemvs_match_the_host() {
    run("gemv_dense");
}

/// kernels/moe.cu: routing (every mode, tied logits, the norm and router
/// in the launch, its ticket reset) and the weighted sums, gather and
/// activation of both MoE paths (`tests/emulate/moe.cpp`).
#[test]
fn moe_kernels_match_the_host() {
    run("moe");
}

/// kernels/norm.cu, elementwise.cu, rope_kv.cu and convert.cu: norms,
/// embeddings, activations, RoPE with the store's write, and the prefill
/// GEMMs' operand conversions and dequantisers (`tests/emulate/small.cpp`).
#[test]
fn small_kernels_match_the_host() {
    run("small");
}

/// kernels/sample.cu: greedy argmax (and its feed of the next step), the
/// sampler's summaries of a row and the draw on the device
/// (`tests/emulate/sample.cpp`).
#[test]
fn sampling_kernels_match_the_host() {
    run("sample");
}

/// kernels/flash_attention.cu with mma.cuh: prefill attention on the
/// tensor cores (mma.sync and ldmatrix.trans emulated) over f32 and bf16
/// stores, head dims 64, 128 and 256 (`tests/emulate/flash.cpp`).
#[test]
fn flash_attention_matches_the_host() {
    run("flash");
}
