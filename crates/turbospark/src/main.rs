//! `turbospark`: the command line over the engine. Each subcommand lives in
//! its own module under `cmd/`; this file holds the argument types shared by
//! several of them and the error policy: a failure prints one line naming
//! what to fix and exits with status 2; nothing panics on bad input.

mod args;
mod cmd;
mod progress;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    // A bug must still read as one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("turbospark: internal error: {info}");
    }));
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => cmd::run::main(a),
        Command::Logits(a) => cmd::logits::main(a),
        Command::Chat(a) => cmd::chat::main(a),
        Command::Inspect(a) => cmd::inspect::main(a),
        Command::Tokenize(a) => cmd::tokenize::main(a),
        Command::Synth(a) => cmd::synth::main(a),
        Command::Bench(a) => cmd::bench::main(a),
        Command::Perplexity(a) => cmd::perplexity::main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("turbospark: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
