//! The system's C++ compiler, which the CPU emulation of the kernels is
//! built with (`emulated_kernels.rs`'s programs, `emulated_gpu.rs`'s
//! libraries): which one, and what its absence means. Used by both test
//! binaries (`#[path]` in `emulated_kernels.rs`).

use std::process::{Command, Output};

/// `$CXX`, else `c++`.
pub fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// Runs `command` (an invocation of [`compiler`]) for `what`. `None` when
/// the compiler is not there: the caller skips, saying so, unless
/// `TURBOSPARK_REQUIRE_EMULATION` is set (CI: `.ci/run`), when it fails.
pub fn run(command: &mut Command, what: &str) -> Option<Output> {
    let compiler = compiler();
    match command.output() {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("TURBOSPARK_REQUIRE_EMULATION").is_none(),
                "no C++ compiler ({compiler}: not found; set CXX), and \
                 TURBOSPARK_REQUIRE_EMULATION asks for {what}"
            );
            println!("skipped: no C++ compiler for {what} ({compiler}: not found; set CXX)");
            None
        }
        Err(e) => panic!("{compiler}: {e}"),
    }
}
