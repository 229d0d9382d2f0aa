//! The `podq` command.
//!
//! Exit codes: 0 success, 1 runtime failure (including a refused request: unknown
//! workqueue, attribute or value), 2 usage error.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod ctl;
mod monitor;
mod table;
mod target;

/// Locality-aware unbound workqueues: inspect, control and measure them.
#[derive(Parser, Debug)]
#[command(name = "podq", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List a running process's workqueues, read or write their attributes.
    Ctl(ctl::CtlArgs),
    /// Watch a running process's workqueues, CPUs and threads live.
    Monitor(monitor::MonitorArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ctl(args) => ctl::run(args),
        Command::Monitor(args) => monitor::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podq: {e:#}");
            ExitCode::FAILURE
        }
    }
}
