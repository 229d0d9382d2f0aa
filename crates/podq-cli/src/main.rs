//! The `podq` command.
//!
//! Exit codes: 0 success, 1 runtime failure (the error is printed with its causes),
//! 2 usage error (printed by the argument parser, or a bad value found later).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod topo;

/// Locality-aware unbound workqueues for user space.
#[derive(Parser)]
#[command(name = "podq", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the pods of every affinity scope (like wq_dump.py's "Affinity Scopes").
    Topo(topo::Args),
    /// Benchmark podq across affinity scopes, and against peer executors.
    Bench(Box<bench::BenchArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Topo(args) => topo::run(&args),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("podq: error: {err:#}");
            if err.downcast_ref::<bench::UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
