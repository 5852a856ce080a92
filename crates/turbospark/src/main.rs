//! `turbospark`: the command line over the engine. Each subcommand lives in
//! its own module under `cmd/`; this file holds the argument types shared by
//! several of them and the error policy: a failure prints one line naming
//! what to fix and exits with status 2; nothing panics on bad input.

mod args;
mod cmd;
mod progress;

use std::process::ExitCode;

use clap::Parser;
use turbospark_backend::BackendError;

use args::{Cli, Command};

fn main() -> ExitCode {
    // A bug must still read as one line, not a backtrace. A forward call
    // that runs out of device memory unwinds with the error itself as the
    // payload (the backends' operations cannot return it): that is no bug,
    // and `run` below reports it as an error.
    std::panic::set_hook(Box::new(|info| {
        if info.payload().downcast_ref::<BackendError>().is_none() {
            eprintln!("turbospark: internal error: {info}");
        }
    }));
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("turbospark: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The subcommand, with a [`BackendError`] that unwound out of it turned
/// back into an error ([`errors_unwound`]).
fn run(cli: Cli) -> anyhow::Result<()> {
    errors_unwound(|| match cli.command {
        Command::Run(a) => cmd::run::main(a),
        Command::Logits(a) => cmd::logits::main(a),
        Command::Chat(a) => cmd::chat::main(a),
        Command::Inspect(a) => cmd::inspect::main(a),
        Command::Tokenize(a) => cmd::tokenize::main(a),
        Command::Synth(a) => cmd::synth::main(a),
        Command::Bench(a) => cmd::bench::main(a),
        Command::Perplexity(a) => cmd::perplexity::main(a),
    })
}

/// `f`, with a [`BackendError`] that unwound out of it (a backend's
/// operation that ran out of memory) returned as its error; any other
/// panic goes on unwinding. Nothing `f` held is used after an unwind but
/// the error: it is all dropped on the way out.
fn errors_unwound(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(
        |payload| match payload.downcast::<BackendError>() {
            Ok(e) => Err((*e).into()),
            Err(other) => std::panic::resume_unwind(other),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_error_unwound_is_returned_and_any_other_panic_goes_on() {
        let oom = || {
            std::panic::panic_any(BackendError::OutOfMemory {
                device: "GPU",
                what: "a buffer of 8 elements".into(),
                need: 32,
                free: Some((0, 1 << 30)),
                hint: "free memory",
            })
        };
        let e = errors_unwound(oom).unwrap_err();
        assert_eq!(
            e.to_string(),
            "out of GPU memory: a buffer of 8 elements needs 32 bytes more, 0 bytes free of 1.00 GiB; free memory"
        );
        assert!(errors_unwound(|| Ok(())).is_ok());
        let bug = std::panic::catch_unwind(|| errors_unwound(|| panic!("a bug")));
        let payload = bug.expect_err("a plain panic was swallowed");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"a bug"));
    }
}
