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
/// back into an error (any other panic goes on unwinding).
fn run(cli: Cli) -> anyhow::Result<()> {
    let command = std::panic::AssertUnwindSafe(|| match cli.command {
        Command::Run(a) => cmd::run::main(a),
        Command::Logits(a) => cmd::logits::main(a),
        Command::Chat(a) => cmd::chat::main(a),
        Command::Inspect(a) => cmd::inspect::main(a),
        Command::Tokenize(a) => cmd::tokenize::main(a),
        Command::Synth(a) => cmd::synth::main(a),
        Command::Bench(a) => cmd::bench::main(a),
        Command::Perplexity(a) => cmd::perplexity::main(a),
    });
    // Nothing is used after an unwind but the error: the engine and its
    // device state are dropped with the closure.
    std::panic::catch_unwind(command).unwrap_or_else(|payload| {
        match payload.downcast::<BackendError>() {
            Ok(e) => Err((*e).into()),
            Err(other) => std::panic::resume_unwind(other),
        }
    })
}
